#include "cc/config/config_parser.h"

#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cc/config/error_context.h"
#include "cc/config/strict_wire_format.h"
#include "cc/config/table_from_proto.h"

namespace tf_embed_ops {
namespace {

namespace tpu = ::tensorflow::tpu;
using Proto = tpu::TPUEmbeddingConfiguration;

absl::Status CheckTopLevelFields(const Proto& proto) {
  if (!Proto::Mode_IsValid(proto.mode())) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: mode has unknown value ", proto.mode(),
                     " (allowed: 0 UNSPECIFIED, 1 INFERENCE, 2 TRAINING, 3 BACKWARD_PASS_ONLY)"));
  }
  if (!Proto::ShardingStrategy_IsValid(proto.sharding_strategy())) {
    return absl::InvalidArgumentError(absl::StrCat("config: sharding_strategy has unknown value ",
                                                   proto.sharding_strategy(), " (allowed: 0 DIV_DEFAULT, 1 MOD)"));
  }
  // 0 is the proto default and means "not specified" (one host / core for a CPU run).
  if (proto.num_hosts() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("config: num_hosts must be >= 0, got ", proto.num_hosts()));
  }
  if (proto.num_tensor_cores() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: num_tensor_cores must be >= 0, got ", proto.num_tensor_cores()));
  }
  if (proto.batch_size_per_tensor_core() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: batch_size_per_tensor_core must be >= 0, got ", proto.batch_size_per_tensor_core()));
  }
  if (proto.table_descriptor_size() == 0) {
    return absl::InvalidArgumentError("config: no table_descriptor; a config needs at least one table");
  }
  return absl::OkStatus();
}

absl::Status TablesFromProto(const Proto& proto, EmbeddingConfig* config) {
  std::map<std::string, int> first_id;
  for (int t = 0; t < proto.table_descriptor_size(); ++t) {
    const auto& td = proto.table_descriptor(t);
    TableSpec table;
    if (auto s = TableFromProto(td, t, &table); !s.ok()) return s;
    const auto [it, inserted] = first_id.emplace(td.name(), t);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(TableContext(td.name(), t), ": name duplicates table_id ",
                                                     it->second, "; table names must be unique"));
    }
    // Every host shard must hold at least one row (SHAPE: "All embedding shards must be non-empty"); TF pads
    // the vocabulary to num_hosts for exactly this reason.
    if (table.vocabulary_size < proto.num_hosts()) {
      return absl::InvalidArgumentError(absl::StrCat(TableContext(td.name(), t), ": vocabulary_size ",
                                                     table.vocabulary_size, " is smaller than num_hosts ",
                                                     proto.num_hosts(), "; every host shard must be non-empty"));
    }
    config->tables.push_back(std::move(table));
  }
  return absl::OkStatus();
}

// Feature descriptors given (the V2 style; docs/semantics.md, "Tables, features and input forms"): the engine
// derives batch size and per-table feature
// counts from the input shapes, so setting them too is a contradiction.
absl::Status FeaturesFromProto(const Proto& proto, EmbeddingConfig* config) {
  if (proto.batch_size_per_tensor_core() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: batch_size_per_tensor_core is ", proto.batch_size_per_tensor_core(),
                     " but must be 0 (unset) when feature_descriptor is given; it is derived from the input shapes"));
  }
  const int num_tables = proto.table_descriptor_size();
  for (int t = 0; t < num_tables; ++t) {
    if (proto.table_descriptor(t).num_features() != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(TableContext(proto.table_descriptor(t).name(), t), ": num_features is ",
                       proto.table_descriptor(t).num_features(),
                       " but must be 0 (unset) when feature_descriptor is given; it is derived from the input shapes"));
    }
  }
  std::vector<int> features_per_table(num_tables, 0);
  for (int f = 0; f < proto.feature_descriptor_size(); ++f) {
    const auto& fd = proto.feature_descriptor(f);
    const std::string ctx = FeatureContext(fd.name(), f);
    if (fd.table_id() < 0 || fd.table_id() >= num_tables) {
      return absl::InvalidArgumentError(
          absl::StrCat(ctx, ": table_id ", fd.table_id(), " is out of range [0, ", num_tables, ")"));
    }
    // An empty input_shape is valid: the shape becomes known at the first batch.
    for (int d = 0; d < fd.input_shape_size(); ++d) {
      if (fd.input_shape(d) <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(ctx, ": input_shape[", d, "] must be > 0, got ",
                                                       fd.input_shape(d), " (input_shape [",
                                                       absl::StrJoin(fd.input_shape(), ", "), "])"));
      }
    }
    ++features_per_table[fd.table_id()];
    FeatureSpec feature;
    feature.name = fd.name();
    feature.table_id = fd.table_id();
    feature.input_shape.assign(fd.input_shape().begin(), fd.input_shape().end());
    config->features.push_back(std::move(feature));
  }
  for (int t = 0; t < num_tables; ++t) {
    if (features_per_table[t] == 0) {
      return absl::InvalidArgumentError(absl::StrCat(TableContext(proto.table_descriptor(t).name(), t),
                                                     ": no feature_descriptor uses this table; every table needs at "
                                                     "least one feature"));
    }
  }
  return absl::OkStatus();
}

// No feature descriptors (the V1 style): one feature per table, batch_size * num_features samples (TensorFlow's
// tpu_embedding_configuration_proto_rewrite.cc; docs/semantics.md, "Tables, features and input forms").
absl::Status SynthesizeFeatures(const Proto& proto, EmbeddingConfig* config) {
  const int32_t batch = proto.batch_size_per_tensor_core();
  if (batch <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config: batch_size_per_tensor_core must be > 0 when no feature_descriptor is given, got ", batch));
  }
  for (int t = 0; t < proto.table_descriptor_size(); ++t) {
    const auto& td = proto.table_descriptor(t);
    if (td.num_features() <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(TableContext(td.name(), t),
                                                     ": num_features must be > 0 when no "
                                                     "feature_descriptor is given, got ",
                                                     td.num_features()));
    }
    FeatureSpec feature;
    feature.name = td.name();
    feature.table_id = t;
    feature.input_shape = {static_cast<int64_t>(batch) * td.num_features()};
    config->features.push_back(std::move(feature));
  }
  config->features_synthesized = true;
  return absl::OkStatus();
}

// Tags index the learning_rates input of the send op, so they must cover [0, n) (OPT).  Tables may share one.
absl::Status CheckLearningRateTags(const EmbeddingConfig& config, int32_t* num_tags) {
  std::map<int32_t, int> first_table;
  for (int t = 0; t < static_cast<int>(config.tables.size()); ++t) {
    const LearningRate& lr = config.tables[t].optimization.learning_rate;
    if (lr.is_dynamic) first_table.emplace(lr.tag, t);
  }
  int32_t expected = 0;
  for (const auto& [tag, table_id] : first_table) {
    if (tag != expected) {
      std::vector<int32_t> used;
      for (const auto& entry : first_table) used.push_back(entry.first);
      return absl::InvalidArgumentError(absl::StrCat(
          TableContext(config.tables[table_id].name, table_id), ": optimization_parameters.learning_rate.dynamic.tag ",
          tag, " leaves a gap: dynamic learning-rate tags must be dense from 0, but tag ", expected,
          " is unused (tags used: [", absl::StrJoin(used, ", "), "])"));
    }
    ++expected;
  }
  *num_tags = expected;
  return absl::OkStatus();
}

}  // namespace

absl::Status EmbeddingConfigFromProto(const Proto& proto, EmbeddingConfig* out) {
  if (auto s = CheckTopLevelFields(proto); !s.ok()) return s;
  EmbeddingConfig config;
  config.mode = static_cast<EmbeddingMode>(proto.mode());
  config.num_hosts = proto.num_hosts();
  config.num_tensor_cores = proto.num_tensor_cores();
  config.batch_size_per_tensor_core = proto.batch_size_per_tensor_core();
  config.sharding_strategy = static_cast<ShardingStrategy>(proto.sharding_strategy());
  config.pipeline_execution_with_tensor_core = proto.pipeline_execution_with_tensor_core();
  if (auto s = TablesFromProto(proto, &config); !s.ok()) return s;
  if (proto.feature_descriptor_size() > 0) {
    if (auto s = FeaturesFromProto(proto, &config); !s.ok()) return s;
  } else {
    if (auto s = SynthesizeFeatures(proto, &config); !s.ok()) return s;
  }
  if (auto s = CheckLearningRateTags(config, &config.num_learning_rate_tags); !s.ok()) return s;
  *out = std::move(config);
  return absl::OkStatus();
}

absl::Status ParseEmbeddingConfigProto(const std::string& serialized, Proto* proto) {
  // First the rules Python's protobuf enforces and C++'s does not, so both accept exactly the same bytes.
  if (auto s = CheckStrictWireFormat(serialized, Proto::descriptor()); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config: could not parse ", serialized.size(),
                     " bytes as a serialized tensorflow.tpu.TPUEmbeddingConfiguration: ", s.message()));
  }
  if (!proto->ParseFromString(serialized)) {
    return absl::InvalidArgumentError(absl::StrCat("config: could not parse ", serialized.size(),
                                                   " bytes as a serialized tensorflow.tpu.TPUEmbeddingConfiguration "
                                                   "(corrupt or truncated)"));
  }
  return absl::OkStatus();
}

absl::Status ParseEmbeddingConfig(const std::string& serialized, EmbeddingConfig* out) {
  Proto proto;
  if (auto s = ParseEmbeddingConfigProto(serialized, &proto); !s.ok()) return s;
  return EmbeddingConfigFromProto(proto, out);
}

}  // namespace tf_embed_ops
