#include "cc/config/config_parser.h"

#include <set>

#include "absl/strings/str_cat.h"

namespace tf_embed_ops {
namespace {

namespace tpu = ::tensorflow::tpu;

ClipLimits ToClipLimits(const tpu::ClippingLimits& limits) {
  ClipLimits out;
  if (limits.has_lower()) out.lower = limits.lower().value();
  if (limits.has_upper()) out.upper = limits.upper().value();
  return out;
}

absl::Status ToOptimizer(const std::string& table, const tpu::OptimizationParameters& p, OptimizerParams* out) {
  switch (p.parameters_case()) {
    case tpu::OptimizationParameters::kStochasticGradientDescent:
      *out = Sgd{};
      return absl::OkStatus();
    case tpu::OptimizationParameters::kAdagrad:
      *out = Adagrad{};
      return absl::OkStatus();
    case tpu::OptimizationParameters::kAdagradMomentum: {
      const auto& m = p.adagrad_momentum();
      AdagradMomentum o;
      o.momentum = m.momentum();
      o.use_nesterov = m.use_nesterov();
      o.exponent = m.exponent();
      o.beta2 = m.beta2();
      o.epsilon = m.epsilon();
      *out = o;
      return absl::OkStatus();
    }
    case tpu::OptimizationParameters::kAdam: {
      const auto& m = p.adam();
      Adam o;
      o.beta1 = m.beta1();
      o.beta2 = m.beta2();
      o.epsilon = m.epsilon();
      o.use_non_lazy_adam = m.use_non_lazy_adam();
      o.use_sum_inside_sqrt = m.use_sum_inside_sqrt();
      *out = o;
      return absl::OkStatus();
    }
    case tpu::OptimizationParameters::kFtrl: {
      const auto& m = p.ftrl();
      Ftrl o;
      o.l1 = m.l1();
      o.l2 = m.l2();
      o.lr_power = m.lr_power();
      o.beta = m.beta();
      o.multiply_linear_by_lr = m.multiply_linear_by_lr();
      o.allow_zero_accumulator = m.allow_zero_accumulator();
      *out = o;
      return absl::OkStatus();
    }
    case tpu::OptimizationParameters::PARAMETERS_NOT_SET:
      return absl::InvalidArgumentError(
          absl::StrCat("table '", table, "': no optimization algorithm specified (optimization_parameters.parameters is not set)"));
    default:
      return absl::UnimplementedError(absl::StrCat("table '", table, "': optimizer with parameters field number ",
                                                   static_cast<int>(p.parameters_case()),
                                                   " is not implemented by tf_embed_ops yet"));
  }
}

}  // namespace

absl::Status EmbeddingConfigFromProto(const tpu::TPUEmbeddingConfiguration& proto, EmbeddingConfig* out) {
  EmbeddingConfig config;
  config.mode = static_cast<EmbeddingMode>(proto.mode());
  config.num_hosts = proto.num_hosts();
  config.num_tensor_cores = proto.num_tensor_cores();
  config.batch_size_per_tensor_core = proto.batch_size_per_tensor_core();
  config.sharding_strategy = static_cast<ShardingStrategy>(proto.sharding_strategy());
  config.pipeline_execution_with_tensor_core = proto.pipeline_execution_with_tensor_core();
  std::set<int32_t> tags;
  for (int t = 0; t < proto.table_descriptor_size(); ++t) {
    const auto& td = proto.table_descriptor(t);
    TableSpec table;
    table.name = td.name();
    if (td.vocabulary_size() <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("table '", td.name(), "' (table_id ", t,
                                                     "): vocabulary_size must be positive, got ", td.vocabulary_size()));
    }
    if (td.dimension() <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", td.name(), "' (table_id ", t, "): dimension must be positive, got ", td.dimension()));
    }
    table.vocabulary_size = td.vocabulary_size();
    table.dimension = td.dimension();
    const auto& op = td.optimization_parameters();
    TableOptimization& opt = table.optimization;
    if (auto s = ToOptimizer(td.name(), op, &opt.optimizer); !s.ok()) return s;
    if (op.learning_rate().has_dynamic()) {
      opt.learning_rate.is_dynamic = true;
      opt.learning_rate.tag = op.learning_rate().dynamic().tag();
      tags.insert(opt.learning_rate.tag);
    } else {
      opt.learning_rate.constant = op.learning_rate().constant();
    }
    opt.weight_clipping = ToClipLimits(op.clipping_limits());
    opt.gradient_clipping = ToClipLimits(op.gradient_clipping_limits());
    opt.weight_decay_factor = op.weight_decay_factor();
    opt.multiply_weight_decay_factor_by_learning_rate = op.multiply_weight_decay_factor_by_learning_rate();
    opt.gradient_accumulation =
        op.gradient_accumulation_status() != tpu::GradientAccumulationStatus::DISABLED;
    const auto& q = op.simulated_quantization();
    opt.simulated_quantization.enabled = q.enabled();
    opt.simulated_quantization.num_buckets = q.num_buckets();
    opt.simulated_quantization.lower = q.clipping_limits().lower().value();
    opt.simulated_quantization.upper = q.clipping_limits().upper().value();
    config.tables.push_back(std::move(table));
  }
  for (int f = 0; f < proto.feature_descriptor_size(); ++f) {
    const auto& fd = proto.feature_descriptor(f);
    if (fd.table_id() < 0 || fd.table_id() >= proto.table_descriptor_size()) {
      return absl::InvalidArgumentError(absl::StrCat("feature ", f, " ('", fd.name(), "'): table_id ", fd.table_id(),
                                                     " is out of range [0, ", proto.table_descriptor_size(), ")"));
    }
    FeatureSpec feature;
    feature.name = fd.name();
    feature.table_id = fd.table_id();
    feature.input_shape.assign(fd.input_shape().begin(), fd.input_shape().end());
    config.features.push_back(std::move(feature));
  }
  int32_t expected = 0;
  for (int32_t tag : tags) {
    if (tag != expected) {
      return absl::InvalidArgumentError(absl::StrCat("dynamic learning-rate tags must be dense from 0: tag ", expected,
                                                     " is missing (tags used: ", tags.size(), ")"));
    }
    ++expected;
  }
  config.num_learning_rate_tags = static_cast<int32_t>(tags.size());
  *out = std::move(config);
  return absl::OkStatus();
}

absl::Status ParseEmbeddingConfig(const std::string& serialized, EmbeddingConfig* out) {
  tpu::TPUEmbeddingConfiguration proto;
  if (!proto.ParseFromString(serialized)) {
    return absl::InvalidArgumentError(absl::StrCat("config: could not parse ", serialized.size(),
                                                   " bytes as a serialized tensorflow.tpu.TPUEmbeddingConfiguration"));
  }
  return EmbeddingConfigFromProto(proto, out);
}

}  // namespace tf_embed_ops
