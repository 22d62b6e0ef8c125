// pybind11 module tf_embed_ops._config: exposes cc/config (the one parser and validator) to Python.
// Placeholder surface, extended by the config loader work: parse() validates and returns a summary dict.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "cc/config/config_parser.h"

namespace py = pybind11;

PYBIND11_MODULE(_config, m) {
  m.doc() = "tf_embed_ops C++ config parser and validator (cc/config).";
  m.def(
      "validate",
      [](py::bytes serialized) {
        tf_embed_ops::EmbeddingConfig config;
        absl::Status status = tf_embed_ops::ParseEmbeddingConfig(std::string(serialized), &config);
        if (!status.ok()) throw py::value_error(std::string(status.message()));
        return static_cast<int>(config.tables.size());
      },
      py::arg("serialized"), "Parses and validates a serialized TPUEmbeddingConfiguration; returns #tables.");
}
