#define EIGEN_USE_THREADS

#include "cc/kernels/embedding_kernel_util.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cc/config/config_parser.h"
#include "cc/kernels/fused_op_signature.h"
#include "cc/lib/numerics.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/kernels/training_op_helpers.h"
#include "tensorflow/core/platform/errors.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tf_embed_ops {
namespace {

// "table 'a'" or "tables 'a', 'b'".
std::string TableList(const std::vector<std::string>& names) {
  return absl::StrCat(names.size() == 1 ? "table '" : "tables '", absl::StrJoin(names, "', '"), "'");
}

// "[2, 1]": the coordinates of flat index `flat` in `shape`.
std::string Coordinates(const tensorflow::TensorShape& shape, int64_t flat) {
  std::vector<int64_t> coords(shape.dims());
  for (int d = shape.dims() - 1; d >= 0; --d) {
    const int64_t size = shape.dim_size(d);
    coords[d] = size ? flat % size : 0;
    flat = size ? flat / size : 0;
  }
  return absl::StrCat("[", absl::StrJoin(coords, ", "), "]");
}

}  // namespace

absl::Status FusedEmbeddingAttrs::Init(tensorflow::OpKernelConstruction* ctx) {
  std::string serialized;
  TF_RETURN_IF_ERROR(ctx->GetAttr("config", &serialized));
  TF_RETURN_IF_ERROR(ParseEmbeddingConfig(serialized, &config));
  TF_RETURN_IF_ERROR(ctx->GetAttr("N", &num_features));
  TF_RETURN_IF_ERROR(ctx->GetAttr("T", &num_tables));
  if (static_cast<int>(config.features.size()) != num_features) {
    return absl::InvalidArgumentError(
        absl::StrCat("the op has ", num_features, " features but config has ", config.features.size(),
                     " feature descriptors; the config must describe every feature, in input order"));
  }
  if (static_cast<int>(config.tables.size()) != num_tables) {
    return absl::InvalidArgumentError(
        absl::StrCat("the op has ", num_tables, " table handles but config has ", config.tables.size(), " tables"));
  }
  std::vector<std::string> names;
  TF_RETURN_IF_ERROR(ctx->GetAttr("combiners", &names));
  // Per table (TPUEmbedding V2) takes precedence when N == T; per feature is the V1 form (docs/semantics.md,
  // "The combiners list").
  const bool per_table = static_cast<int>(names.size()) == num_tables;
  if (!names.empty() && !per_table && static_cast<int>(names.size()) != num_features) {
    return absl::InvalidArgumentError(absl::StrCat("combiners has ", names.size(), " entries; expected ", num_tables,
                                                   " (one per table), ", num_features,
                                                   " (one per feature) or 0 (all \"sum\")"));
  }
  combiners.assign(num_features, Combiner::kSum);
  for (int f = 0; f < num_features; ++f) {
    if (names.empty()) continue;
    const int k = per_table ? config.features[f].table_id : f;
    if (!ParseCombiner(names[k], &combiners[f])) {
      return absl::InvalidArgumentError(
          absl::StrCat("combiners[", k, "] = \"", names[k], "\": only \"sum\", \"mean\" and \"sqrtn\" are supported"));
    }
  }
  return absl::OkStatus();
}

std::string FusedEmbeddingAttrs::FeatureLabel(int feature) const {
  const std::string& name = config.features[feature].name;
  return name.empty() ? absl::StrCat("feature ", feature) : absl::StrCat("feature ", feature, " ('", name, "')");
}

absl::Status ReadFeatureBatch(tensorflow::OpKernelContext* ctx, const FusedInputs& inputs, int feature,
                              const std::string& label, FeatureBatch* out) {
  const tensorflow::Tensor& splits = ctx->input(inputs.splits(feature));
  const tensorflow::Tensor& ids = ctx->input(inputs.ids(feature));
  const tensorflow::Tensor& weights = ctx->input(inputs.weights(feature));
  const tensorflow::Tensor& shape = ctx->input(inputs.sample_shape(feature));
  if (ids.dims() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": embedding_indices must be rank 1, got shape ", ids.shape().DebugString()));
  }
  if (weights.dims() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": aggregation_weights must be rank 1, got shape ", weights.shape().DebugString()));
  }
  if (shape.dims() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": sample_shape must be rank 1, got shape ", shape.shape().DebugString()));
  }
  if (splits.dims() == 0 || splits.dims() > 2) {
    return absl::InvalidArgumentError(absl::StrCat(label,
                                                   ": sample_indices_or_row_splits must be rank 1 or 2 (or "
                                                   "empty), got shape ",
                                                   splits.shape().DebugString()));
  }
  out->splits_or_indices = splits.flat<int64_t>().data();
  out->splits_or_indices_rank = splits.NumElements() == 0 && splits.dims() <= 1 ? 0 : splits.dims();
  out->splits_or_indices_rows = splits.dims() >= 1 ? splits.dim_size(0) : 0;
  out->splits_or_indices_cols = splits.dims() == 2 ? splits.dim_size(1) : 0;
  // (The dynamic ops' string keys are fingerprinted by their caller, which then sets ids.)
  out->ids = ids.dtype() == tensorflow::DT_INT64 ? ids.flat<int64_t>().data() : nullptr;
  out->num_ids = ids.NumElements();
  out->weights = weights.flat<float>().data();
  out->num_weights = weights.NumElements();
  const auto dims = shape.flat<int64_t>();
  out->sample_shape.assign(dims.data(), dims.data() + dims.size());
  return absl::OkStatus();
}

absl::Status Named(const absl::Status& status, const std::string& what) {
  if (status.ok()) return status;
  return tensorflow::errors::CreateWithUpdatedMessage(status, absl::StrCat(what, ": ", status.message()));
}

absl::Status ActivationShape(const FeatureBatch& batch, const TableSpec& table, const std::string& label,
                             tensorflow::TensorShape* out) {
  absl::Status status = tensorflow::TensorShape::BuildTensorShape(batch.sample_shape, out);
  if (status.ok()) status = out->AddDimWithStatus(table.dimension);
  if (status.ok()) return status;
  return absl::InvalidArgumentError(absl::StrCat(label, ": sample_shape [", absl::StrJoin(batch.sample_shape, ", "),
                                                 "] + [", table.dimension, "] (dimension of table '", table.name,
                                                 "') is not a valid activation shape: ", status.message()));
}

absl::Status CheckVariableDtype(tensorflow::OpKernelContext* ctx, int input, const std::string& what,
                                tensorflow::Var** var, StorageType* storage) {
  if (ctx->input_dtype(input) != tensorflow::DT_RESOURCE) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": expected a resource variable handle"));
  }
  TF_RETURN_IF_ERROR(Named(tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, input), var), what));
  tsl::tf_shared_lock lock(*(*var)->mu());
  if (!(*var)->is_initialized) {
    (*var)->Unref();
    return absl::FailedPreconditionError(absl::StrCat(what, ": the variable is not initialized"));
  }
  const absl::StatusOr<StorageType> type = StorageTypeOfDtype((*var)->tensor()->dtype(), what);
  if (!type.ok()) {
    (*var)->Unref();
    return type.status();
  }
  *storage = *type;
  return absl::OkStatus();
}

void EnsureSparseAccess(tensorflow::OpKernelContext* ctx, tensorflow::Var* var, StorageType storage) {
  // The lock helpers copy a shared buffer with their template type; for float32 they do it themselves.
  if (storage == StorageType::kBfloat16) {
    tensorflow::EnsureSparseVariableAccess<Eigen::ThreadPoolDevice, Eigen::bfloat16>(ctx, var).IgnoreError();
  } else if (storage == StorageType::kFloat16) {
    tensorflow::EnsureSparseVariableAccess<Eigen::ThreadPoolDevice, Eigen::half>(ctx, var).IgnoreError();
  }
}

std::vector<std::vector<std::string>> TablesPerTag(const EmbeddingConfig& config) {
  std::vector<std::vector<std::string>> tag_tables(config.num_learning_rate_tags);
  for (const TableSpec& table : config.tables) {
    const LearningRate& rate = table.optimization.learning_rate;
    if (rate.is_dynamic) tag_tables[rate.tag].push_back(table.name);
  }
  return tag_tables;
}

absl::Status ReadLearningRates(tensorflow::OpKernelContext* ctx, const FusedInputs& inputs,
                               const std::vector<std::vector<std::string>>& tag_tables, std::vector<float>* out) {
  const int num = static_cast<int>(tag_tables.size());
  out->resize(num);
  for (int k = 0; k < num; ++k) {
    const tensorflow::Tensor& lr = ctx->input(inputs.learning_rate(k));
    const std::string what = absl::StrCat("learning_rates[", k, "] (dynamic learning-rate tag ", k, ", used by ",
                                          TableList(tag_tables[k]), ")");
    if (!tensorflow::TensorShapeUtils::IsScalar(lr.shape())) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": must be a scalar, got shape ", lr.shape().DebugString()));
    }
    const float value = lr.scalar<float>()();
    if (!(value >= 0.0f && std::isfinite(value))) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " = ", value, ": a learning rate must be finite and >= 0; no table was updated"));
    }
    (*out)[k] = value;
  }
  return absl::OkStatus();
}

absl::Status CheckFeatureGradient(const tensorflow::Tensor& gradient, int f, const tensorflow::TensorShape& expected,
                                  const std::string& label, const std::string& table_name, bool check_numerics) {
  if (gradient.shape() != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": the gradient (inputs[", f, "]) has shape ", gradient.shape().DebugString(),
                     ", expected ", expected.DebugString(), " (sample_shape + [dim of table '", table_name, "'])"));
  }
  if (check_numerics) {
    const int64_t bad = FirstNonFinite(gradient.flat<float>().data(), gradient.NumElements());
    if (bad >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(label, ": the gradient (inputs[", f, "]) holds ", gradient.flat<float>()(bad), " at ",
                       Coordinates(gradient.shape(), bad), "; check_numerics rejects the step (table '", table_name,
                       "' and every other table are unchanged)"));
    }
  }
  return absl::OkStatus();
}

absl::Status NonFiniteUpdateError(const FusedEmbeddingAttrs& attrs, int table, const NonFiniteUpdate& bad,
                                  const std::vector<const int64_t*>& ids, const std::vector<int64_t>& num_ids,
                                  const std::string& row_label) {
  const TableSpec& spec = attrs.config.tables[table];
  // The first feature and position of this table whose id is the row (error path only: a plain scan).
  std::string where = "no feature's id (an untouched row of a non-lazy optimizer)";
  for (int f = 0; f < attrs.num_features && where[0] == 'n'; ++f) {
    if (attrs.config.features[f].table_id != table) continue;
    for (int64_t i = 0; i < num_ids[f]; ++i) {
      if (ids[f][i] == bad.row) {
        where = absl::StrCat(attrs.FeatureLabel(f), ", ids[", i, "]");
        break;
      }
    }
  }
  std::string what;
  if (bad.in_gradient) {
    what = absl::StrCat("its gradient summed over the step holds ", bad.value, " at column ", bad.column,
                        " (finite gradients whose sum overflowed float32, or non-finite ones)");
  } else {
    const std::string buffer =
        bad.buffer == 0
            ? std::string("the table")
            : absl::StrCat("slot '", SchemaFor(spec.optimization.optimizer).slots[bad.buffer - 1].name, "'");
    what = absl::StrCat("the update would store ", bad.value, " in ", buffer, " at column ", bad.column);
  }
  return absl::InvalidArgumentError(absl::StrCat("check_numerics: table '", spec.name, "', ", row_label,
                                                 " (first seen at ", where, "): ", what,
                                                 "; the step is rejected (this table and every other are unchanged)"));
}

absl::Status CheckTableShape(const tensorflow::Tensor& tensor, const TableSpec& table, const std::string& what,
                             const SlotInfo* slot) {
  const int64_t width = slot == nullptr ? table.dimension : SlotWidth(*slot, table.dimension);
  if (tensor.dims() != 2 || tensor.dim_size(0) != table.vocabulary_size || tensor.dim_size(1) != width) {
    if (slot != nullptr && slot->per_row) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": the variable has shape ", tensor.shape().DebugString(), " but this slot holds one value per row: [",
          table.vocabulary_size, ",1] (vocabulary_size of table '", table.name, "', 1) in the config"));
    }
    return absl::InvalidArgumentError(absl::StrCat(what, ": the variable has shape ", tensor.shape().DebugString(),
                                                   " but table '", table.name, "' is [", table.vocabulary_size, ",",
                                                   table.dimension, "] (vocabulary_size, dimension) in the config"));
  }
  return absl::OkStatus();
}

}  // namespace tf_embed_ops
