#include "cc/kernels/fused_op_signature.h"

#include "absl/strings/str_cat.h"
#include "cc/lib/gradient_accumulation.h"
#include "cc/lib/rounding_table_ids.h"

namespace tf_embed_ops {

absl::StatusOr<StorageType> StorageTypeOfDtype(tensorflow::DataType dtype, const std::string& what) {
  switch (dtype) {
    case tensorflow::DT_FLOAT:
      return StorageType::kFloat32;
    case tensorflow::DT_BFLOAT16:
      return StorageType::kBfloat16;
    case tensorflow::DT_HALF:
      return StorageType::kFloat16;
    default:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": the variable must be float32, bfloat16 or float16 (half), got ", tensorflow::DataTypeString(dtype)));
}

absl::StatusOr<StorageType> StorageTypeOfName(const std::string& name) {
  for (StorageType type : {StorageType::kFloat32, StorageType::kBfloat16, StorageType::kFloat16}) {
    if (name == StorageTypeName(type)) return type;
  }
  return absl::InvalidArgumentError(absl::StrCat("'", name, "'; expected 'float32', 'bfloat16' or 'float16'"));
}

absl::Status ReadRoundingAttrs(tensorflow::OpKernelConstruction* ctx, const EmbeddingConfig& config,
                               std::vector<RoundingSpec>* out) {
  const int num_tables = static_cast<int>(config.tables.size());
  std::vector<std::string> modes;
  int64_t seed = 0;
  std::vector<int64_t> given_ids;
  TF_RETURN_IF_ERROR(ctx->GetAttr("rounding", &modes));
  TF_RETURN_IF_ERROR(ctx->GetAttr("rounding_seed", &seed));
  TF_RETURN_IF_ERROR(ctx->GetAttr("rounding_table_ids", &given_ids));
  if (!modes.empty() && static_cast<int>(modes.size()) != num_tables) {
    return absl::InvalidArgumentError(absl::StrCat("rounding has ", modes.size(), " entries; give none (all \"",
                                                   "stochastic\") or one per table (", num_tables, ")"));
  }
  std::vector<Rounding> rounding(num_tables, Rounding::kStochastic);
  for (size_t t = 0; t < modes.size(); ++t) {
    if (modes[t] == "nearest") {
      rounding[t] = Rounding::kNearest;
    } else if (modes[t] != "stochastic") {
      return absl::InvalidArgumentError(absl::StrCat("rounding[", t, "] (table '", config.tables[t].name, "') is \"",
                                                     modes[t], "\"; expected \"stochastic\" or \"nearest\""));
    }
  }
  std::vector<int64_t> table_ids;
  TF_RETURN_IF_ERROR(ResolveRoundingTableIds(given_ids, num_tables, "rounding_table_ids", &table_ids));
  out->resize(num_tables);
  for (int t = 0; t < num_tables; ++t) {
    (*out)[t] = RoundingSpec{rounding[t], static_cast<uint64_t>(seed), /*step=*/0, table_ids[t]};
  }
  return absl::OkStatus();
}

absl::Status CheckLearningRateCount(int num_learning_rates, const EmbeddingConfig& config) {
  if (num_learning_rates == config.num_learning_rate_tags) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("learning_rates has ", num_learning_rates,
                                                 " entries but the config has ", config.num_learning_rate_tags,
                                                 " dynamic learning-rate tags; give one scalar per tag"));
}

absl::Status CheckIdsPerTable(const std::vector<int64_t>& ids_per_table, const EmbeddingConfig& config,
                              const char* noun) {
  for (size_t t = 0; t < ids_per_table.size(); ++t) {
    if (ids_per_table[t] > RowGradientPlan::kMaxIds) {
      return absl::InvalidArgumentError(absl::StrCat("table '", config.tables[t].name, "': its features have ",
                                                     ids_per_table[t], " ", noun, " in all; at most ",
                                                     RowGradientPlan::kMaxIds, " per step are supported"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tf_embed_ops
