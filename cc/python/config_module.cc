// pybind11 module tf_embed_ops._config: exposes cc/config (the one parser and validator) to Python.  parse()
// runs exactly the validation the kernels run and returns the validated model as plain Python data; errors
// carry the C++ message unchanged (InvalidArgumentError subclasses ValueError, UnimplementedError subclasses
// NotImplementedError; tf_embed_ops.config re-raises them as its ConfigError classes).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>

#include "cc/config/config_parser.h"
#include "cc/python/optimizer_dict.h"

namespace py = pybind11;

namespace tf_embed_ops {
namespace {

namespace tpu = ::tensorflow::tpu;
using Proto = tpu::TPUEmbeddingConfiguration;

struct InvalidArgument : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct Unimplemented : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void ThrowIfError(const absl::Status& status) {
  if (status.ok()) return;
  const std::string message(status.message());
  if (absl::IsInvalidArgument(status)) throw InvalidArgument(message);
  if (absl::IsUnimplemented(status)) throw Unimplemented(message);
  throw std::runtime_error(message);
}

// Presence comes from the proto (the model stores an absent bound as +-inf): None means "no bound".
py::tuple ClipBounds(const tpu::ClippingLimits& limits) {
  py::object lower = limits.has_lower() ? py::object(py::float_(limits.lower().value())) : py::object(py::none());
  py::object upper = limits.has_upper() ? py::object(py::float_(limits.upper().value())) : py::object(py::none());
  return py::make_tuple(lower, upper);
}

py::dict TableDict(const TableSpec& table, const Proto::TableDescriptor& td) {
  const TableOptimization& opt = table.optimization;
  const tpu::OptimizationParameters& p = td.optimization_parameters();
  py::dict lr;
  lr["dynamic"] = opt.learning_rate.is_dynamic;
  lr["constant"] = opt.learning_rate.constant;
  lr["tag"] = opt.learning_rate.tag;
  py::object quantization = py::none();
  if (opt.simulated_quantization.enabled) {
    py::dict q;
    q["num_buckets"] = opt.simulated_quantization.num_buckets;
    q["lower"] = opt.simulated_quantization.lower;
    q["upper"] = opt.simulated_quantization.upper;
    quantization = q;
  }
  py::dict d;
  d["name"] = table.name;
  d["vocabulary_size"] = table.vocabulary_size;
  d["dimension"] = table.dimension;
  d["num_features"] = table.num_features;
  d["optimizer"] = OptimizerDict(opt.optimizer);
  d["learning_rate"] = lr;
  d["weight_clipping"] = ClipBounds(p.clipping_limits());
  d["gradient_clipping"] = ClipBounds(p.gradient_clipping_limits());
  d["weight_decay_factor"] = opt.weight_decay_factor;
  d["multiply_weight_decay_factor_by_learning_rate"] = opt.multiply_weight_decay_factor_by_learning_rate;
  d["gradient_accumulation"] = opt.gradient_accumulation;
  d["gradient_accumulation_status"] =
      std::string(tpu::GradientAccumulationStatus::Status_Name(p.gradient_accumulation_status()));
  d["low_dimensional_packing_status"] =
      std::string(tpu::LowDimensionalPackingStatus::Status_Name(p.low_dimensional_packing_status()));
  d["simulated_quantization"] = quantization;
  return d;
}

py::dict ConfigDict(const EmbeddingConfig& config, const Proto& proto) {
  py::list tables;
  for (size_t t = 0; t < config.tables.size(); ++t) {
    tables.append(TableDict(config.tables[t], proto.table_descriptor(static_cast<int>(t))));
  }
  py::list features;
  for (const FeatureSpec& f : config.features) {
    py::dict d;
    d["name"] = f.name;
    d["table_id"] = f.table_id;
    d["input_shape"] = f.input_shape;
    features.append(d);
  }
  py::dict d;
  d["tables"] = tables;
  d["features"] = features;
  d["features_synthesized"] = config.features_synthesized;
  d["mode"] = std::string(Proto::Mode_Name(proto.mode()));
  d["num_hosts"] = config.num_hosts;
  d["num_tensor_cores"] = config.num_tensor_cores;
  d["batch_size_per_tensor_core"] = config.batch_size_per_tensor_core;
  d["sharding_strategy"] = std::string(Proto::ShardingStrategy_Name(proto.sharding_strategy()));
  d["pipeline_execution_with_tensor_core"] = config.pipeline_execution_with_tensor_core;
  d["num_learning_rate_tags"] = config.num_learning_rate_tags;
  return d;
}

py::dict Parse(const py::bytes& serialized) {
  const std::string bytes(serialized);
  Proto proto;
  EmbeddingConfig config;
  absl::Status status;
  {
    // Parsing and validation touch no Python object; let other threads run.
    py::gil_scoped_release release;
    status = ParseEmbeddingConfigProto(bytes, &proto);
    if (status.ok()) status = EmbeddingConfigFromProto(proto, &config);
  }
  ThrowIfError(status);
  py::dict d = ConfigDict(config, proto);
  // The message as C++ parsed it: tf_embed_ops.config builds its Python view from these bytes, never from the
  // caller's, so the Python view cannot read the input differently from the kernels.
  d["serialized"] = py::bytes(proto.SerializeAsString());
  return d;
}

}  // namespace
}  // namespace tf_embed_ops

PYBIND11_MODULE(_config, m) {
  m.doc() = "tf_embed_ops C++ config parser and validator (cc/config).";
  py::register_exception<tf_embed_ops::InvalidArgument>(m, "InvalidArgumentError", PyExc_ValueError);
  py::register_exception<tf_embed_ops::Unimplemented>(m, "UnimplementedError", PyExc_NotImplementedError);
  m.def("parse", &tf_embed_ops::Parse, py::arg("serialized"),
        "Parses and validates a serialized TPUEmbeddingConfiguration; returns the validated model as a dict\n"
        "(its 'serialized' entry: the message as parsed, re-serialized).\n"
        "Raises InvalidArgumentError (ValueError) or UnimplementedError (NotImplementedError) with the C++ "
        "message.");
  m.def("supported_optimizers", &tf_embed_ops::SupportedOptimizers,
        "Proto field names of the optimizers the kernels run, each with its slots (name, default initial value).");
  m.def("optimizer_schema", &tf_embed_ops::OptimizerSchemaList,
        "The optimizer schema (cc/lib/optimizers/schema.h): one dict per optimizer, in schema order.");
}
