// Kernel of TfEmbed>SendTPUEmbeddingGradients: validate everything (features, gradients, learning rates,
// variables) before the first write, then per table: combiner backward + accumulation plan
// (cc/lib/gradient_accumulation.h) and the row pipeline over touched rows (cc/lib/table_update.h), sharded over
// the intra-op pool.  Tables and slots are updated in place under exclusive locks taken in address order.
#define EIGEN_USE_THREADS

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/kernels/embedding_kernel_util.h"
#include "cc/lib/gradient_accumulation.h"
#include "cc/lib/table_update.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/kernels/training_op_helpers.h"

namespace tf_embed_ops {
namespace {

using CPUDevice = Eigen::ThreadPoolDevice;

class SendTPUEmbeddingGradientsOp : public tensorflow::OpKernel {
 public:
  explicit SendTPUEmbeddingGradientsOp(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Init(ctx));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("NN", &num_learning_rates_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("S", &num_slots_));
    OP_REQUIRES(ctx, num_learning_rates_ == attrs_.config.num_learning_rate_tags,
                absl::InvalidArgumentError(absl::StrCat(
                    "learning_rates has ", num_learning_rates_, " entries but the config has ",
                    attrs_.config.num_learning_rate_tags, " dynamic learning-rate tags; give one scalar per tag")));
    int expected_slots = 0;
    for (const TableSpec& table : attrs_.config.tables) {
      first_slot_.push_back(expected_slots);
      expected_slots += static_cast<int>(OptimizerSlots(table.optimization.optimizer).size());
    }
    OP_REQUIRES(ctx, num_slots_ == expected_slots,
                absl::InvalidArgumentError(
                    absl::StrCat("slots has ", num_slots_, " handles but the config's optimizers have ", expected_slots,
                                 " slots in all (each table's slots, in Load/Retrieve order, tables in order)")));
  }

  void Compute(tensorflow::OpKernelContext* ctx) override {
    const int n = attrs_.num_features;
    const EmbeddingConfig& config = attrs_.config;
    // Inputs: gradients[N], learning_rates[NN], splits[N], ids[N], weights[N], sample_shapes[N], tables[T],
    // slots[S].
    const int first_feature_list = n + num_learning_rates_;
    const int first_table = first_feature_list + 4 * n;
    const int first_slot = first_table + attrs_.num_tables;

    // 1. Features and their gradients.
    std::vector<FeatureBatch> batches(n);
    WorkspacePool::Scoped workspace = workspaces_.Acquire();
    std::vector<FeatureLayout>& layouts = workspace->layouts;
    layouts.resize(n);
    for (int f = 0; f < n; ++f) {
      const std::string label = attrs_.FeatureLabel(f);
      const TableSpec& table = config.tables[config.features[f].table_id];
      OP_REQUIRES_OK(ctx, ReadFeatureBatch(ctx, first_feature_list, n, f, label, &batches[f]));
      tensorflow::TensorShape expected;
      OP_REQUIRES_OK(ctx, tensorflow::TensorShape::BuildTensorShape(batches[f].sample_shape, &expected));
      OP_REQUIRES_OK(ctx, expected.AddDimWithStatus(table.dimension));
      const tensorflow::Tensor& gradient = ctx->input(f);
      OP_REQUIRES(ctx, gradient.shape() == expected,
                  absl::InvalidArgumentError(absl::StrCat(label, ": the gradient (inputs[", f, "]) has shape ",
                                                          gradient.shape().DebugString(), ", expected ",
                                                          expected.DebugString(), " (sample_shape + [dim])")));
      OP_REQUIRES_OK(ctx, BuildFeatureLayout(batches[f], attrs_.combiners[f], label, &layouts[f]));
      OP_REQUIRES_OK(ctx, ValidateIds(batches[f].ids, batches[f].num_ids, table.vocabulary_size, label, table.name));
    }

    // 2. Learning rates.
    std::vector<float> learning_rates(num_learning_rates_);
    for (int k = 0; k < num_learning_rates_; ++k) {
      const tensorflow::Tensor& lr = ctx->input(n + k);
      OP_REQUIRES(ctx, tensorflow::TensorShapeUtils::IsScalar(lr.shape()),
                  absl::InvalidArgumentError(
                      absl::StrCat("learning_rates[", k, "] must be a scalar, got shape ", lr.shape().DebugString())));
      learning_rates[k] = lr.scalar<float>()();
    }

    // 3. Variables: dtypes, distinctness, then exclusive locks and shapes.
    std::vector<int> var_inputs;
    std::vector<std::string> var_names;
    std::vector<const TableSpec*> var_tables;
    for (int t = 0; t < attrs_.num_tables; ++t) {
      const TableSpec& table = config.tables[t];
      var_inputs.push_back(first_table + t);
      var_names.push_back(absl::StrCat("table '", table.name, "'"));
      var_tables.push_back(&table);
      const std::vector<SlotInfo> slots = OptimizerSlots(table.optimization.optimizer);
      for (size_t k = 0; k < slots.size(); ++k) {
        var_inputs.push_back(first_slot + first_slot_[t] + static_cast<int>(k));
        var_names.push_back(
            absl::StrCat("slot '", slots[k].name, "' of table '", table.name, "' (slots[", first_slot_[t] + k, "])"));
        var_tables.push_back(&table);
      }
    }
    std::vector<const tensorflow::Var*> seen;
    for (size_t v = 0; v < var_inputs.size(); ++v) {
      tensorflow::Var* var = nullptr;
      OP_REQUIRES_OK(ctx, CheckVariableDtype(ctx, var_inputs[v], var_names[v], &var));
      const bool duplicate = std::find(seen.begin(), seen.end(), var) != seen.end();
      seen.push_back(var);
      var->Unref();  // the pointer is only compared; the lock holder below keeps its own references
      OP_REQUIRES(ctx, !duplicate,
                  absl::InvalidArgumentError(absl::StrCat(var_names[v],
                                                          ": the same variable is passed twice; "
                                                          "every table and slot needs its own variable")));
    }
    auto locks = tensorflow::MaybeLockVariableInputMutexesInOrder<CPUDevice, float>(ctx, /*do_lock=*/true,
                                                                                    /*sparse=*/true, var_inputs);
    OP_REQUIRES_OK(ctx, ctx->status());
    std::vector<tensorflow::Tensor> values(var_inputs.size());
    for (size_t v = 0; v < var_inputs.size(); ++v) {
      OP_REQUIRES_OK(
          ctx, tensorflow::GetInputTensorFromVariable<CPUDevice, float>(ctx, var_inputs[v], true, true, &values[v]));
      OP_REQUIRES_OK(ctx, CheckTableShape(values[v], *var_tables[v], var_names[v]));
    }

    // 4. Update, table by table (all checks passed: nothing below fails).
    const ShardFn shard = IntraOpShardFn(ctx);
    workspace->sources.resize(attrs_.num_tables);
    workspace->plans.resize(attrs_.num_tables);
    size_t v = 0;
    for (int t = 0; t < attrs_.num_tables; ++t) {
      const TableSpec& table = config.tables[t];
      TableBuffers buffers;
      buffers.vocabulary_size = table.vocabulary_size;
      buffers.dim = table.dimension;
      buffers.weights = values[v++].flat<float>().data();
      const size_t num_slots = OptimizerSlots(table.optimization.optimizer).size();
      for (size_t k = 0; k < num_slots; ++k) buffers.slots.push_back(values[v++].flat<float>().data());

      std::vector<GradientSource>& sources = workspace->sources[t];
      sources.clear();
      for (int f = 0; f < n; ++f) {
        if (config.features[f].table_id != t) continue;
        sources.push_back(
            GradientSource{batches[f].ids, batches[f].num_ids, &layouts[f], ctx->input(f).flat<float>().data()});
      }
      RowGradientPlan& plan = workspace->plans[t];
      plan.Build(&sources);
      const LearningRate& rate = table.optimization.learning_rate;
      const float lr = rate.is_dynamic ? learning_rates[rate.tag] : rate.constant;
      UpdateTable(table.optimization, lr, plan, buffers, shard);
    }
  }

 private:
  FusedEmbeddingAttrs attrs_;
  WorkspacePool workspaces_;
  int num_learning_rates_ = 0;
  int num_slots_ = 0;
  std::vector<int> first_slot_;  // per table: index of its first slot in the slots list
};

REGISTER_KERNEL_BUILDER(Name("TfEmbed>SendTPUEmbeddingGradients").Device(tensorflow::DEVICE_CPU),
                        SendTPUEmbeddingGradientsOp);

}  // namespace
}  // namespace tf_embed_ops
