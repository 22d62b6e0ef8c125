// The validated, TensorFlow-free model of a TPUEmbeddingConfiguration: what the kernels, the Python view and
// the benchmarks work from.  Built (and validated) only by cc/config/config_parser.h; every invariant listed
// here holds for a model that parser returned.
#ifndef TF_EMBED_OPS_CC_LIB_EMBEDDING_CONFIG_H_
#define TF_EMBED_OPS_CC_LIB_EMBEDDING_CONFIG_H_

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cc/lib/optimizers/registry.h"

namespace tf_embed_ops {

// Closed interval; an absent bound in the proto is +-infinity.
struct ClipLimits {
  float lower = -std::numeric_limits<float>::infinity();
  float upper = std::numeric_limits<float>::infinity();
  bool IsActive() const {
    return lower != -std::numeric_limits<float>::infinity() || upper != std::numeric_limits<float>::infinity();
  }
};

// Forward-only simulated quantization of gathered rows (docs/semantics.md).  num_buckets >= 2 when enabled.
struct SimulatedQuantization {
  bool enabled = false;
  float lower = 0.0f;
  float upper = 0.0f;
  int32_t num_buckets = 0;
};

// A learning rate is either a constant or the scalar at `tag` in the op's learning_rates input.
struct LearningRate {
  bool is_dynamic = false;
  float constant = 0.0f;
  int32_t tag = -1;
};

struct TableOptimization {
  OptimizerParams optimizer;
  LearningRate learning_rate;
  ClipLimits weight_clipping;    // applied after the update (clipping_limits)
  ClipLimits gradient_clipping;  // applied to the summed gradient before it (gradient_clipping_limits)
  float weight_decay_factor = 0.0f;
  bool multiply_weight_decay_factor_by_learning_rate = false;
  bool gradient_accumulation = true;  // UNSPECIFIED means ENABLED (docs/semantics.md, "Gradient accumulation")
  SimulatedQuantization simulated_quantization;
};

struct TableSpec {
  std::string name;
  int64_t vocabulary_size = 0;  // > 0
  int32_t dimension = 0;        // > 0
  // As given in the proto: 0 when feature descriptors are given (the engine derives it), > 0 in the V1 style
  // (no feature descriptors), where it is the number of per-sample lookups into this table.
  int32_t num_features = 0;
  TableOptimization optimization;
};

struct FeatureSpec {
  std::string name;                  // may be empty (TF sets it only when FeatureConfig.name is given)
  int32_t table_id = 0;              // in [0, tables.size())
  std::vector<int64_t> input_shape;  // empty = not yet known; else every entry > 0
};

enum class EmbeddingMode { kUnspecified = 0, kInference = 1, kTraining = 2, kBackwardPassOnly = 3 };
enum class ShardingStrategy { kDivDefault = 0, kMod = 1 };

struct EmbeddingConfig {
  std::vector<TableSpec> tables;  // index = table id
  // index = feature position in the op's input lists.  A V1-style config (no feature descriptors) gets one
  // synthesised feature per table, input_shape [batch_size_per_tensor_core * num_features], and
  // features_synthesized = true.
  std::vector<FeatureSpec> features;
  bool features_synthesized = false;
  EmbeddingMode mode = EmbeddingMode::kUnspecified;  // accepted by the parser; kernels that need one check it
  int32_t num_hosts = 0;
  int32_t num_tensor_cores = 0;
  int32_t batch_size_per_tensor_core = 0;
  ShardingStrategy sharding_strategy = ShardingStrategy::kDivDefault;
  bool pipeline_execution_with_tensor_core = false;
  // Dynamic learning-rate tags are dense in [0, num_learning_rate_tags) (validated).
  int32_t num_learning_rate_tags = 0;
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_EMBEDDING_CONFIG_H_
