#include "cc/config/table_from_proto.h"

#include <cmath>
#include <string>
#include <variant>

#include "absl/strings/str_cat.h"
#include "cc/config/error_context.h"
#include "cc/config/optimizer_from_proto.h"

namespace tf_embed_ops {
namespace {

namespace tpu = ::tensorflow::tpu;

// An absent bound is +-infinity (no clipping that side); explicit infinities mean the same.  NaN is rejected:
// a NaN bound would turn every clipped value into NaN.
absl::Status ClipLimitsFromProto(const tpu::ClippingLimits& limits, const std::string& ctx, const char* field,
                                 ClipLimits* out) {
  ClipLimits c;
  if (limits.has_lower()) c.lower = limits.lower().value();
  if (limits.has_upper()) c.upper = limits.upper().value();
  if (std::isnan(c.lower) || std::isnan(c.upper)) {
    return absl::InvalidArgumentError(absl::StrCat(
        ctx, ": optimization_parameters.", field, " bounds must not be NaN, got lower ", c.lower, ", upper ", c.upper));
  }
  if (c.lower > c.upper) {
    return absl::InvalidArgumentError(absl::StrCat(ctx, ": optimization_parameters.", field, ".lower (", c.lower,
                                                   ") must be <= ", field, ".upper (", c.upper, ")"));
  }
  *out = c;
  return absl::OkStatus();
}

absl::Status LearningRateFromProto(const tpu::LearningRate& lr, const std::string& ctx, LearningRate* out) {
  LearningRate r;
  switch (lr.learning_rate_case()) {
    case tpu::LearningRate::kDynamic:
      if (lr.dynamic().tag() < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            ctx, ": optimization_parameters.learning_rate.dynamic.tag must be >= 0, got ", lr.dynamic().tag()));
      }
      r.is_dynamic = true;
      r.tag = lr.dynamic().tag();
      break;
    case tpu::LearningRate::kConstant:
      if (!(lr.constant() >= 0.0f && std::isfinite(lr.constant()))) {
        return absl::InvalidArgumentError(absl::StrCat(
            ctx, ": optimization_parameters.learning_rate.constant must be >= 0 and finite, got ", lr.constant()));
      }
      r.constant = lr.constant();
      break;
    case tpu::LearningRate::LEARNING_RATE_NOT_SET:
      r.constant = 0.0f;  // proto semantics: an unset learning rate is 0 (OPT)
      break;
  }
  *out = r;
  return absl::OkStatus();
}

absl::Status QuantizationFromProto(const tpu::SimulatedQuantization& q, const std::string& ctx,
                                   SimulatedQuantization* out) {
  SimulatedQuantization s;
  s.enabled = q.enabled();
  s.num_buckets = q.num_buckets();
  s.lower = q.clipping_limits().lower().value();
  s.upper = q.clipping_limits().upper().value();
  if (s.enabled) {
    // q = (upper - lower) / (num_buckets - 1) must be a positive finite quantum.
    if (s.num_buckets < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          ctx, ": optimization_parameters.simulated_quantization.num_buckets must be >= 2, got ", s.num_buckets));
    }
    if (!(s.lower < s.upper && std::isfinite(s.lower) && std::isfinite(s.upper))) {
      return absl::InvalidArgumentError(absl::StrCat(
          ctx,
          ": optimization_parameters.simulated_quantization.clipping_limits must be finite with lower < upper, "
          "got lower ",
          s.lower, ", upper ", s.upper));
    }
  }
  *out = s;
  return absl::OkStatus();
}

absl::Status OptimizationFromProto(const tpu::OptimizationParameters& p, const std::string& ctx,
                                   TableOptimization* out) {
  TableOptimization opt;
  if (auto s = OptimizerFromProto(p, ctx, &opt.optimizer); !s.ok()) return s;
  if (auto s = LearningRateFromProto(p.learning_rate(), ctx, &opt.learning_rate); !s.ok()) return s;
  if (auto s = ClipLimitsFromProto(p.clipping_limits(), ctx, "clipping_limits", &opt.weight_clipping); !s.ok())
    return s;
  if (auto s =
          ClipLimitsFromProto(p.gradient_clipping_limits(), ctx, "gradient_clipping_limits", &opt.gradient_clipping);
      !s.ok())
    return s;
  if (!(p.weight_decay_factor() >= 0.0f && std::isfinite(p.weight_decay_factor()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        ctx, ": optimization_parameters.weight_decay_factor must be >= 0 and finite, got ", p.weight_decay_factor()));
  }
  opt.weight_decay_factor = p.weight_decay_factor();
  opt.multiply_weight_decay_factor_by_learning_rate = p.multiply_weight_decay_factor_by_learning_rate();

  const int accumulation = p.gradient_accumulation_status();
  if (!tpu::GradientAccumulationStatus::Status_IsValid(accumulation)) {
    return absl::InvalidArgumentError(
        absl::StrCat(ctx, ": optimization_parameters.gradient_accumulation_status has unknown value ", accumulation,
                     " (allowed: 0 UNSPECIFIED, 1 ENABLED, 2 DISABLED)"));
  }
  const int packing = p.low_dimensional_packing_status();
  if (!tpu::LowDimensionalPackingStatus::Status_IsValid(packing)) {
    return absl::InvalidArgumentError(
        absl::StrCat(ctx, ": optimization_parameters.low_dimensional_packing_status has unknown value ", packing,
                     " (allowed: 0 UNSPECIFIED, 1 ENABLED, 2 DISABLED)"));
  }
  // UNSPECIFIED means ENABLED (OPT, UTIL UseGradientAccumulation).
  opt.gradient_accumulation = accumulation != tpu::GradientAccumulationStatus::DISABLED;
  if (!opt.gradient_accumulation) {
    // Gradient clipping acts on the per-row sum, which only exists with accumulation; TF's Python optimizers
    // refuse clipvalue without it (docs/semantics.md, "Gradient clipping").
    if (p.gradient_clipping_limits().has_lower() || p.gradient_clipping_limits().has_upper()) {
      return absl::InvalidArgumentError(
          absl::StrCat(ctx,
                       ": optimization_parameters.gradient_clipping_limits is set but gradient_accumulation_status is "
                       "DISABLED; gradient clipping needs gradient accumulation"));
    }
    // Optimizers that update every row, or assign the summed gradient, need it too (their schema says when).
    if (auto s = CheckOptimizerAccumulation(opt.optimizer, false, ctx); !s.ok()) return s;
  }
  if (auto s = QuantizationFromProto(p.simulated_quantization(), ctx, &opt.simulated_quantization); !s.ok()) return s;
  *out = std::move(opt);
  return absl::OkStatus();
}

}  // namespace

absl::Status TableFromProto(const tpu::TPUEmbeddingConfiguration::TableDescriptor& td, int table_id, TableSpec* out) {
  if (td.name().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(TableContext("", table_id),
                                                   ": name is empty; every table needs a unique non-empty name (it "
                                                   "names the Load/Retrieve ops and the checkpoint keys)"));
  }
  const std::string ctx = TableContext(td.name(), table_id);
  if (td.vocabulary_size() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(ctx, ": vocabulary_size must be > 0, got ", td.vocabulary_size()));
  }
  if (td.dimension() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(ctx, ": dimension must be > 0, got ", td.dimension()));
  }
  if (td.num_features() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(ctx, ": num_features must be >= 0, got ", td.num_features()));
  }
  TableSpec table;
  table.name = td.name();
  table.vocabulary_size = td.vocabulary_size();
  table.dimension = td.dimension();
  table.num_features = td.num_features();
  if (auto s = OptimizationFromProto(td.optimization_parameters(), ctx, &table.optimization); !s.ok()) return s;
  *out = std::move(table);
  return absl::OkStatus();
}

}  // namespace tf_embed_ops
