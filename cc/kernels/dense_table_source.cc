#define EIGEN_USE_THREADS

#include "cc/kernels/dense_table_source.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cc/kernels/touched_rows_resource.h"
#include "cc/lib/huge_pages.h"
#include "cc/lib/optimizers/registry.h"

namespace tf_embed_ops {
namespace {

using CPUDevice = Eigen::ThreadPoolDevice;

}  // namespace

absl::Status DenseTableSource::ReadAttrs(tensorflow::OpKernelConstruction* ctx, const FusedEmbeddingAttrs& attrs,
                                         const FusedInputs& inputs, bool update, Attrs* out) {
  if (!update) return absl::OkStatus();
  TF_RETURN_IF_ERROR(ReadRoundingAttrs(ctx, attrs.config, &out->rounding));
  int num_slots = 0;
  TF_RETURN_IF_ERROR(ctx->GetAttr("S", &num_slots));
  int expected_slots = 0;
  for (const TableSpec& table : attrs.config.tables) {
    out->first_slot.push_back(expected_slots);
    expected_slots += static_cast<int>(OptimizerSlots(table.optimization.optimizer).size());
  }
  if (num_slots != expected_slots) {
    return absl::InvalidArgumentError(
        absl::StrCat("slots has ", num_slots, " handles but the config's optimizers have ", expected_slots,
                     " slots in all (each table's slots, in Load/Retrieve order, tables in order)"));
  }
  // The op's two registrations differ only by a rounding_step input after the slots (cc/ops/embedding_ops.cc):
  // whether there is one is the input count, not the op's name.
  const int num_rounding_steps = ctx->num_inputs() - inputs.step();
  if (num_rounding_steps != 0 && num_rounding_steps != 1) {
    return absl::InvalidArgumentError(absl::StrCat("the op has ", ctx->num_inputs(), " inputs; expected ",
                                                   inputs.step(), " (+1 with rounding_step)"));
  }
  out->has_rounding_step = num_rounding_steps == 1;
  return absl::OkStatus();
}

absl::Status DenseTableSource::CheckVariables() {
  const EmbeddingConfig& config = attrs_.config;
  for (int t = 0; t < attrs_.num_tables; ++t) {
    const TableSpec& table = config.tables[t];
    table_var_.push_back(var_inputs_.size());
    var_inputs_.push_back(inputs_.table(t));
    var_names_.push_back(absl::StrCat("table '", table.name, "'"));
    var_tables_.push_back(&table);
    var_slots_.push_back(nullptr);
    if (!update_) continue;
    const Span<SlotInfo> slots = SchemaFor(table.optimization.optimizer).slots;
    for (size_t k = 0; k < slots.size; ++k) {
      const int s = source_attrs_.first_slot[t] + static_cast<int>(k);
      var_inputs_.push_back(inputs_.slot(s));
      var_names_.push_back(absl::StrCat("slot '", slots[k].name, "' of table '", table.name, "' (slots[", s, "])"));
      var_tables_.push_back(&table);
      var_slots_.push_back(&slots[k]);
    }
  }
  std::vector<const tensorflow::Var*> seen;
  var_storage_.resize(var_inputs_.size());
  for (size_t v = 0; v < var_inputs_.size(); ++v) {
    tensorflow::Var* var = nullptr;
    TF_RETURN_IF_ERROR(CheckVariableDtype(ctx_, var_inputs_[v], var_names_[v], &var, &var_storage_[v]));
    // A lookup reads a variable passed twice twice; an update would write it twice.
    const bool duplicate = update_ && std::find(seen.begin(), seen.end(), var) != seen.end();
    seen.push_back(var);
    if (!duplicate) EnsureSparseAccess(ctx_, var, var_storage_[v]);  // detaches a shared buffer, same values
    if (var_slots_[v] == nullptr) table_vars_.push_back(var);
    var->Unref();  // the pointer is only compared; the lock holder keeps its own references
    if (duplicate) {
      return absl::InvalidArgumentError(absl::StrCat(
          var_names_[v], ": the same variable is passed twice; every table and slot needs its own variable"));
    }
  }
  return absl::OkStatus();
}

absl::Status DenseTableSource::ReadLockedVariables() {
  // Shared locks to look up, exclusive ones to update, in address order either way.
  locks_.emplace(tensorflow::MaybeLockVariableInputMutexesInOrder<CPUDevice, float>(ctx_, /*do_lock=*/update_,
                                                                                    /*sparse=*/true, var_inputs_));
  TF_RETURN_IF_ERROR(ctx_->status());
  values_.resize(var_inputs_.size());
  for (size_t v = 0; v < var_inputs_.size(); ++v) {
    TF_RETURN_IF_ERROR(
        Named(tensorflow::GetInputTensorFromVariable<CPUDevice, float>(ctx_, var_inputs_[v], true, true, &values_[v]),
              var_names_[v]));
    TF_RETURN_IF_ERROR(CheckTableShape(values_[v], *var_tables_[v], var_names_[v], var_slots_[v]));
  }
  // Random rows: cc/lib/huge_pages.h.
  for (const tensorflow::Tensor& v : values_) AdviseHugePages(v.tensor_data().data(), v.TotalBytes());
  return absl::OkStatus();
}

absl::Status DenseTableSource::PrepareLookup(const FusedFeatures&) {
  TF_RETURN_IF_ERROR(CheckVariables());
  return ReadLockedVariables();
}

// The step that keys stochastic rounding: required when a 16-bit table or slot rounds stochastically (a fixed
// step would draw the same bits every step, and the roundings would no longer average out).
absl::Status DenseTableSource::ReadRoundingStep() {
  if (source_attrs_.has_rounding_step) {
    const tensorflow::Tensor& t = ctx_->input(inputs_.step());
    if (!tensorflow::TensorShapeUtils::IsScalar(t.shape())) {
      return absl::InvalidArgumentError(
          absl::StrCat("rounding_step must be an int64 scalar, got shape ", t.shape().DebugString()));
    }
    rounding_step_ = t.scalar<int64_t>()();
    return absl::OkStatus();
  }
  for (size_t v = 0; v < var_inputs_.size(); ++v) {
    const int t = static_cast<int>(var_tables_[v] - attrs_.config.tables.data());
    if (var_storage_[v] != StorageType::kFloat32 && source_attrs_.rounding[t].mode == Rounding::kStochastic) {
      return absl::InvalidArgumentError(absl::StrCat(
          var_names_[v], " is ", StorageTypeName(var_storage_[v]),
          " with stochastic rounding: pass rounding_step (SendTPUEmbeddingGradientsV2; the step keys the rounding's "
          "random bits), or use rounding \"nearest\"; no table was updated"));
    }
  }
  return absl::OkStatus();
}

absl::Status DenseTableSource::Validate(const FusedFeatures&) {
  TF_RETURN_IF_ERROR(CheckVariables());
  TF_RETURN_IF_ERROR(ReadRoundingStep());
  return ReadLockedVariables();
}

absl::Status DenseTableSource::Plan(const FusedFeatures& features, bool, EmbeddingWorkspace* ws) {
  for (int t = 0; t < attrs_.num_tables; ++t) {
    BuildPlan(
        ctx_, attrs_, inputs_, features, t, [&features](int f) { return features.batches[f].ids; },
        attrs_.config.tables[t].vocabulary_size, ws);
  }
  return absl::OkStatus();
}

StoredTableBuffers DenseTableSource::Buffers(int t) const {
  const TableSpec& table = attrs_.config.tables[t];
  StoredTableBuffers buffers;
  buffers.vocabulary_size = table.vocabulary_size;
  buffers.dim = table.dimension;
  buffers.rounding = source_attrs_.rounding[t];
  buffers.rounding.step = rounding_step_;
  // The variables' buffers: float, or the bits of Eigen::bfloat16 / Eigen::half (StoredBuffer's uint16_t).
  auto buffer = [&](size_t v) {
    return StoredBuffer{const_cast<char*>(values_[v].tensor_data().data()), var_storage_[v]};
  };
  size_t v = table_var_[t];
  buffers.weights = buffer(v++);
  const size_t num_slots = OptimizerSlots(table.optimization.optimizer).size();
  for (size_t k = 0; k < num_slots; ++k) buffers.slots.push_back(buffer(v++));
  return buffers;
}

absl::StatusOr<NonFiniteUpdate> DenseTableSource::FindNonFinite(int t, float lr, const RowGradientPlan& plan,
                                                                const ShardFn& shard) {
  return FindNonFiniteUpdate(attrs_.config.tables[t].optimization, lr, plan, Buffers(t), shard);
}

absl::Status DenseTableSource::Update(int t, float lr, const RowGradientPlan& plan, const ShardFn& shard) {
  const TableOptimization& o = attrs_.config.tables[t].optimization;
  const TrackedUpdate tracked(table_vars_[t]);  // docs/tracking.md: marks the rows the walk writes
  UpdateTable(o, lr, plan, Buffers(t), shard, tracked.rows());
  return absl::OkStatus();
}

}  // namespace tf_embed_ops
