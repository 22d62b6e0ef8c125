// Kernel of TfEmbed>SendTPUEmbeddingGradients, in three named steps:
//   Validate: every input (features, ids, gradients, learning rates, variables) is checked in serial passes
//             that allocate nothing sized by an input and write nothing; the variables are locked
//             (exclusively, in address order) and their shapes checked last.
//   Plan:     per feature the id -> sample layout, per table the combiner backward + accumulation plan
//             (cc/lib/gradient_accumulation.h).
//   Check:    with check_numerics, a dry run of every table's update (the same row walk, writing nothing):
//             a per-row gradient sum that overflows, or an update that would first store a NaN or +-inf,
//             rejects the step before any table is written.
//   Update:   per table the row pipeline over touched rows (cc/lib/table_update.h), sharded over the intra-op
//             pool, in place; 16-bit tables and slots are rounded back as docs/low_precision.md says.
// Plan and Update cannot fail, so a rejected call changes no table and no slot.
#define EIGEN_USE_THREADS

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cc/kernels/embedding_kernel_util.h"
#include "cc/kernels/touched_rows_resource.h"
#include "cc/lib/gradient_accumulation.h"
#include "cc/lib/huge_pages.h"
#include "cc/lib/numerics.h"
#include "cc/lib/rounding_table_ids.h"
#include "cc/lib/table_update.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/kernels/training_op_helpers.h"

namespace tf_embed_ops {
namespace {

using CPUDevice = Eigen::ThreadPoolDevice;

// What Validate establishes and Plan/Update read: views of the inputs, the rates, the variables.
struct ValidatedStep {
  std::vector<FeatureBatch> batches;   // per feature
  std::vector<int64_t> num_samples;    // per feature
  std::vector<float> learning_rates;   // per dynamic tag
  std::vector<int> var_inputs;         // tables and slots: per table, its table then its slots
  std::vector<std::string> var_names;  // for errors
  std::vector<const TableSpec*> var_tables;
  std::vector<const SlotInfo*> var_slots;          // nullptr for a table (its shape check depends on it)
  std::vector<StorageType> var_storage;            // in var_inputs order
  std::vector<const tensorflow::Var*> table_vars;  // per table: its variable (compared only: touched-row hook)
  int64_t rounding_step = 0;
  std::vector<tensorflow::Tensor> values;  // the locked variables' tensors, in var_inputs order
};

class SendTPUEmbeddingGradientsOp : public tensorflow::OpKernel {
 public:
  explicit SendTPUEmbeddingGradientsOp(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Init(ctx));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("NN", &num_learning_rates_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("S", &num_slots_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("check_numerics", &check_numerics_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rounding_seed", &rounding_seed_));
    std::vector<std::string> rounding;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rounding", &rounding));
    OP_REQUIRES(ctx, rounding.empty() || static_cast<int>(rounding.size()) == attrs_.num_tables,
                absl::InvalidArgumentError(absl::StrCat("rounding has ", rounding.size(), " entries; give none (all \"",
                                                        "stochastic\") or one per table (", attrs_.num_tables, ")")));
    rounding_.assign(attrs_.num_tables, Rounding::kStochastic);
    for (size_t t = 0; t < rounding.size(); ++t) {
      if (rounding[t] == "nearest") {
        rounding_[t] = Rounding::kNearest;
      } else {
        OP_REQUIRES(ctx, rounding[t] == "stochastic",
                    absl::InvalidArgumentError(absl::StrCat("rounding[", t, "] (table '", attrs_.config.tables[t].name,
                                                            "') is \"", rounding[t],
                                                            "\"; expected \"stochastic\" or \"nearest\"")));
      }
    }
    std::vector<int64_t> rounding_table_ids;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rounding_table_ids", &rounding_table_ids));
    OP_REQUIRES_OK(ctx, ResolveRoundingTableIds(rounding_table_ids, attrs_.num_tables, "rounding_table_ids",
                                                &rounding_table_ids_));
    OP_REQUIRES(ctx, num_learning_rates_ == attrs_.config.num_learning_rate_tags,
                absl::InvalidArgumentError(absl::StrCat(
                    "learning_rates has ", num_learning_rates_, " entries but the config has ",
                    attrs_.config.num_learning_rate_tags, " dynamic learning-rate tags; give one scalar per tag")));
    int expected_slots = 0;
    tag_tables_ = TablesPerTag(attrs_.config);
    for (const TableSpec& table : attrs_.config.tables) {
      first_slot_.push_back(expected_slots);
      expected_slots += static_cast<int>(OptimizerSlots(table.optimization.optimizer).size());
    }
    OP_REQUIRES(ctx, num_slots_ == expected_slots,
                absl::InvalidArgumentError(
                    absl::StrCat("slots has ", num_slots_, " handles but the config's optimizers have ", expected_slots,
                                 " slots in all (each table's slots, in Load/Retrieve order, tables in order)")));
    // The op's two registrations differ only by a rounding_step input after the slots (cc/ops/embedding_ops.cc):
    // whether there is one is the input count, not the op's name.
    num_rounding_steps_ = ctx->num_inputs() - RoundingStepInput();
    OP_REQUIRES(ctx, num_rounding_steps_ == 0 || num_rounding_steps_ == 1,
                absl::InvalidArgumentError(absl::StrCat("the op has ", ctx->num_inputs(), " inputs; expected ",
                                                        RoundingStepInput(), " (+1 with rounding_step)")));
  }

  void Compute(tensorflow::OpKernelContext* ctx) override {
    ValidatedStep step;
    OP_REQUIRES_OK(ctx, ValidateFeatures(ctx, &step));
    OP_REQUIRES_OK(ctx, ValidateLearningRates(ctx, &step));
    OP_REQUIRES_OK(ctx, ValidateVariables(ctx, &step));
    OP_REQUIRES_OK(ctx, ValidateRoundingStep(ctx, &step));
    auto locks = tensorflow::MaybeLockVariableInputMutexesInOrder<CPUDevice, float>(ctx, /*do_lock=*/true,
                                                                                    /*sparse=*/true, step.var_inputs);
    OP_REQUIRES_OK(ctx, ctx->status());
    OP_REQUIRES_OK(ctx, ReadLockedVariables(ctx, &step));
    // Everything is validated: nothing below fails.
    for (const tensorflow::Tensor& v : step.values) AdviseHugePages(v.tensor_data().data(), v.TotalBytes());
    WorkspacePool::Scoped workspace = workspaces_.Acquire();
    Plan(ctx, step, workspace.get());
    // check_numerics: every table's update is computed once without writing (FindNonFiniteUpdate) before any is
    // written, so a step that would introduce a NaN or +-inf anywhere changes nothing.  Recomputing is cheaper
    // than staging the updated rows (a non-lazy optimizer would stage the whole table), and costs nothing when
    // the check is off.
    if (check_numerics_) OP_REQUIRES_OK(ctx, CheckUpdates(ctx, step, *workspace.get()));
    Update(ctx, step, *workspace.get());
  }

 private:
  // Inputs: gradients[N], learning_rates[NN], splits[N], ids[N], weights[N], sample_shapes[N], tables[T],
  // slots[S].
  int FirstFeatureList() const { return attrs_.num_features + num_learning_rates_; }
  int FirstTable() const { return FirstFeatureList() + 4 * attrs_.num_features; }
  int FirstSlot() const { return FirstTable() + attrs_.num_tables; }
  int RoundingStepInput() const { return FirstSlot() + num_slots_; }

  // Each feature's structure and ids, its gradient's shape (and values, with check_numerics), then the ids per
  // table.
  absl::Status ValidateFeatures(tensorflow::OpKernelContext* ctx, ValidatedStep* step) const {
    const int n = attrs_.num_features;
    const EmbeddingConfig& config = attrs_.config;
    step->batches.resize(n);
    step->num_samples.resize(n);
    std::vector<int64_t> ids_per_table(attrs_.num_tables, 0);
    for (int f = 0; f < n; ++f) {
      const std::string label = attrs_.FeatureLabel(f);
      const TableSpec& table = config.tables[config.features[f].table_id];
      FeatureBatch& batch = step->batches[f];
      TF_RETURN_IF_ERROR(ReadFeatureBatch(ctx, FirstFeatureList(), n, f, label, &batch));
      TF_RETURN_IF_ERROR(ValidateFeatureBatch(batch, label, &step->num_samples[f]));
      TF_RETURN_IF_ERROR(ValidateIds(batch.ids, batch.num_ids, table.vocabulary_size, label, table.name));
      tensorflow::TensorShape expected;
      TF_RETURN_IF_ERROR(ActivationShape(batch, table, label, &expected));
      TF_RETURN_IF_ERROR(CheckFeatureGradient(ctx->input(f), f, expected, label, table.name, check_numerics_));
      ids_per_table[config.features[f].table_id] += batch.num_ids;
    }
    for (int t = 0; t < attrs_.num_tables; ++t) {
      if (ids_per_table[t] > RowGradientPlan::kMaxIds) {
        return absl::InvalidArgumentError(absl::StrCat("table '", config.tables[t].name, "': its features have ",
                                                       ids_per_table[t], " ids in all; at most ",
                                                       RowGradientPlan::kMaxIds, " per step are supported"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status ValidateLearningRates(tensorflow::OpKernelContext* ctx, ValidatedStep* step) const {
    return ReadLearningRates(ctx, attrs_.num_features, tag_tables_, &step->learning_rates);
  }

  // Dtypes, initialisation and distinctness of the table and slot variables (before any lock: the
  // training_op_helpers lock assumes the dtype).
  absl::Status ValidateVariables(tensorflow::OpKernelContext* ctx, ValidatedStep* step) const {
    const EmbeddingConfig& config = attrs_.config;
    for (int t = 0; t < attrs_.num_tables; ++t) {
      const TableSpec& table = config.tables[t];
      step->var_inputs.push_back(FirstTable() + t);
      step->var_names.push_back(absl::StrCat("table '", table.name, "'"));
      step->var_tables.push_back(&table);
      step->var_slots.push_back(nullptr);
      const Span<SlotInfo> slots = SchemaFor(table.optimization.optimizer).slots;
      for (size_t k = 0; k < slots.size; ++k) {
        step->var_inputs.push_back(FirstSlot() + first_slot_[t] + static_cast<int>(k));
        step->var_names.push_back(
            absl::StrCat("slot '", slots[k].name, "' of table '", table.name, "' (slots[", first_slot_[t] + k, "])"));
        step->var_tables.push_back(&table);
        step->var_slots.push_back(&slots[k]);
      }
    }
    std::vector<const tensorflow::Var*> seen;
    step->var_storage.resize(step->var_inputs.size());
    for (size_t v = 0; v < step->var_inputs.size(); ++v) {
      tensorflow::Var* var = nullptr;
      TF_RETURN_IF_ERROR(CheckVariableDtype(ctx, step->var_inputs[v], step->var_names[v], &var, &step->var_storage[v]));
      const bool duplicate = std::find(seen.begin(), seen.end(), var) != seen.end();
      seen.push_back(var);
      if (!duplicate) EnsureSparseAccess(ctx, var, step->var_storage[v]);  // detaches a shared buffer, same values
      if (step->var_slots[v] == nullptr) step->table_vars.push_back(var);
      var->Unref();  // the pointer is only compared; the lock holder keeps its own references
      if (duplicate) {
        return absl::InvalidArgumentError(absl::StrCat(
            step->var_names[v], ": the same variable is passed twice; every table and slot needs its own variable"));
      }
    }
    return absl::OkStatus();
  }

  // The step that keys stochastic rounding: required when a 16-bit table or slot rounds stochastically (a fixed
  // step would draw the same bits every step, and the roundings would no longer average out).
  absl::Status ValidateRoundingStep(tensorflow::OpKernelContext* ctx, ValidatedStep* step) const {
    if (num_rounding_steps_ == 1) {
      const tensorflow::Tensor& t = ctx->input(RoundingStepInput());
      if (!tensorflow::TensorShapeUtils::IsScalar(t.shape())) {
        return absl::InvalidArgumentError(
            absl::StrCat("rounding_step must be an int64 scalar, got shape ", t.shape().DebugString()));
      }
      step->rounding_step = t.scalar<int64_t>()();
      return absl::OkStatus();
    }
    for (size_t v = 0; v < step->var_inputs.size(); ++v) {
      const int t = static_cast<int>(step->var_tables[v] - attrs_.config.tables.data());
      if (step->var_storage[v] != StorageType::kFloat32 && rounding_[t] == Rounding::kStochastic) {
        return absl::InvalidArgumentError(absl::StrCat(
            step->var_names[v], " is ", StorageTypeName(step->var_storage[v]),
            " with stochastic rounding: pass rounding_step (SendTPUEmbeddingGradientsV2; the step keys the rounding's "
            "random bits), or use rounding \"nearest\"; no table was updated"));
      }
    }
    return absl::OkStatus();
  }

  // Under the exclusive locks: the variables' tensors and their shapes.
  absl::Status ReadLockedVariables(tensorflow::OpKernelContext* ctx, ValidatedStep* step) const {
    step->values.resize(step->var_inputs.size());
    for (size_t v = 0; v < step->var_inputs.size(); ++v) {
      TF_RETURN_IF_ERROR(Named(tensorflow::GetInputTensorFromVariable<CPUDevice, float>(ctx, step->var_inputs[v], true,
                                                                                        true, &step->values[v]),
                               step->var_names[v]));
      TF_RETURN_IF_ERROR(
          CheckTableShape(step->values[v], *step->var_tables[v], step->var_names[v], step->var_slots[v]));
    }
    return absl::OkStatus();
  }

  // Layouts of the features, then per table its gradient sources and accumulation plan.
  void Plan(tensorflow::OpKernelContext* ctx, const ValidatedStep& step, EmbeddingWorkspace* ws) const {
    const int n = attrs_.num_features;
    ws->layouts.resize(n);
    for (int f = 0; f < n; ++f) {
      BuildValidatedFeatureLayout(step.batches[f], step.num_samples[f], attrs_.combiners[f], &ws->layouts[f]);
    }
    ws->sources.resize(attrs_.num_tables);
    ws->plans.resize(attrs_.num_tables);
    for (int t = 0; t < attrs_.num_tables; ++t) {
      std::vector<GradientSource>& sources = ws->sources[t];
      sources.clear();
      for (int f = 0; f < n; ++f) {
        if (attrs_.config.features[f].table_id != t) continue;
        sources.push_back(GradientSource{step.batches[f].ids, step.batches[f].num_ids, &ws->layouts[f],
                                         ctx->input(f).flat<float>().data()});
      }
      ws->plans[t].Build(&sources, attrs_.config.tables[t].vocabulary_size);
    }
  }

  // Table t's variables as the row walk sees them, and its learning rate.
  StoredTableBuffers Buffers(const ValidatedStep& step, int t, size_t* v) const {
    const TableSpec& table = attrs_.config.tables[t];
    StoredTableBuffers buffers;
    buffers.vocabulary_size = table.vocabulary_size;
    buffers.dim = table.dimension;
    buffers.rounding =
        RoundingSpec{rounding_[t], static_cast<uint64_t>(rounding_seed_), step.rounding_step, rounding_table_ids_[t]};
    // The variables' buffers: float, or the bits of Eigen::bfloat16 / Eigen::half (StoredBuffer's uint16_t).
    auto buffer = [&](size_t i) {
      return StoredBuffer{const_cast<char*>(step.values[i].tensor_data().data()), step.var_storage[i]};
    };
    buffers.weights = buffer((*v)++);
    const size_t num_slots = OptimizerSlots(table.optimization.optimizer).size();
    for (size_t k = 0; k < num_slots; ++k) buffers.slots.push_back(buffer((*v)++));
    return buffers;
  }
  float LearningRateOf(const ValidatedStep& step, int t) const {
    const LearningRate& rate = attrs_.config.tables[t].optimization.learning_rate;
    return rate.is_dynamic ? step.learning_rates[rate.tag] : rate.constant;
  }

  // check_numerics after accumulation and after the update: a dry run of every table's update (writes nothing).
  absl::Status CheckUpdates(tensorflow::OpKernelContext* ctx, const ValidatedStep& step,
                            const EmbeddingWorkspace& ws) const {
    const ShardFn shard = IntraOpShardFn(ctx);
    size_t v = 0;
    for (int t = 0; t < attrs_.num_tables; ++t) {
      const StoredTableBuffers buffers = Buffers(step, t, &v);
      const NonFiniteUpdate bad = FindNonFiniteUpdate(attrs_.config.tables[t].optimization, LearningRateOf(step, t),
                                                      ws.plans[t], buffers, shard);
      if (!bad.found) continue;
      std::vector<const int64_t*> ids;
      std::vector<int64_t> num_ids;
      for (const FeatureBatch& batch : step.batches) {
        ids.push_back(batch.ids);
        num_ids.push_back(batch.num_ids);
      }
      return NonFiniteUpdateError(attrs_, t, bad, ids, num_ids, absl::StrCat("row ", bad.row));
    }
    return absl::OkStatus();
  }

  // The row pipeline of every table over its plan, in place.
  void Update(tensorflow::OpKernelContext* ctx, ValidatedStep& step, const EmbeddingWorkspace& ws) const {
    const ShardFn shard = IntraOpShardFn(ctx);
    size_t v = 0;
    for (int t = 0; t < attrs_.num_tables; ++t) {
      const StoredTableBuffers buffers = Buffers(step, t, &v);
      UpdateTable(attrs_.config.tables[t].optimization, LearningRateOf(step, t), ws.plans[t], buffers, shard);
      MarkTouchedRows(step.table_vars[t], ws.plans[t],
                      UpdatesAllRows(attrs_.config.tables[t].optimization));  // docs/tracking.md
    }
  }

  FusedEmbeddingAttrs attrs_;
  WorkspacePool workspaces_;
  int num_learning_rates_ = 0;
  int num_slots_ = 0;
  bool check_numerics_ = false;
  int num_rounding_steps_ = 0;
  int64_t rounding_seed_ = 0;
  std::vector<Rounding> rounding_;                    // per table, for its 16-bit table and slots
  std::vector<int64_t> rounding_table_ids_;           // per table, the index keying its stochastic rounding
  std::vector<int> first_slot_;                       // per table: index of its first slot in the slots list
  std::vector<std::vector<std::string>> tag_tables_;  // per dynamic tag: the tables that use it
};

REGISTER_KERNEL_BUILDER(Name("TfEmbed>SendTPUEmbeddingGradients").Device(tensorflow::DEVICE_CPU),
                        SendTPUEmbeddingGradientsOp);
REGISTER_KERNEL_BUILDER(Name("TfEmbed>SendTPUEmbeddingGradientsV2").Device(tensorflow::DEVICE_CPU),
                        SendTPUEmbeddingGradientsOp);

}  // namespace
}  // namespace tf_embed_ops
