#include "cc/ops/embedding_shape_fns.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "cc/config/config_parser.h"
#include "tensorflow/core/framework/common_shape_fns.h"

namespace tf_embed_ops {
namespace {

using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// "feature 3 ('watched')", as the kernels name features.
std::string FeatureLabel(const EmbeddingConfig& config, int feature) {
  const std::string& name = config.features[feature].name;
  return name.empty() ? absl::StrCat("feature ", feature) : absl::StrCat("feature ", feature, " ('", name, "')");
}

// Activation shape of feature i: sample_shape (as far as it is known statically) + [dim of its table].
absl::Status ActivationShape(InferenceContext* c, const EmbeddingConfig& config, int feature, int sample_shape_input,
                             ShapeHandle* out) {
  if (feature >= static_cast<int>(config.features.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("the config has ", config.features.size(), " feature descriptors but the op has more features"));
  }
  const int64_t dim = config.tables[config.features[feature].table_id].dimension;
  ShapeHandle sample_shape;
  ShapeHandle samples;
  absl::Status status = c->WithRank(c->input(sample_shape_input), 1, &sample_shape);
  if (status.ok()) status = c->MakeShapeFromShapeTensor(sample_shape_input, &samples);
  if (status.ok()) status = c->Concatenate(samples, c->Vector(dim), out);
  if (status.ok()) return status;
  return absl::InvalidArgumentError(
      absl::StrCat(FeatureLabel(config, feature), ": sample_shapes[", feature, "]: ", status.message()));
}

absl::Status ParseConfigAttr(InferenceContext* c, EmbeddingConfig* config) {
  std::string serialized;
  TF_RETURN_IF_ERROR(c->GetAttr("config", &serialized));
  return ParseEmbeddingConfig(serialized, config);
}

}  // namespace

absl::Status ActivationsShapeFn(InferenceContext* c) {
  int n;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  EmbeddingConfig config;
  TF_RETURN_IF_ERROR(ParseConfigAttr(c, &config));
  for (int i = 0; i < n; ++i) {
    ShapeHandle unused;
    absl::Status status = c->WithRank(c->input(n + i), 1, &unused);          // ids
    if (status.ok()) status = c->WithRank(c->input(2 * n + i), 1, &unused);  // weights
    if (!status.ok() && i < static_cast<int>(config.features.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          FeatureLabel(config, i), ": embedding_indices and aggregation_weights must be rank 1: ", status.message()));
    }
    TF_RETURN_IF_ERROR(status);
    ShapeHandle out;
    TF_RETURN_IF_ERROR(ActivationShape(c, config, i, 3 * n + i, &out));
    c->set_output(i, out);
  }
  return absl::OkStatus();
}

absl::Status SendGradientsShapeFn(InferenceContext* c) {
  int n, nn;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  TF_RETURN_IF_ERROR(c->GetAttr("NN", &nn));
  EmbeddingConfig config;
  TF_RETURN_IF_ERROR(ParseConfigAttr(c, &config));
  // Inputs: gradients[N], learning_rates[NN], splits[N], ids[N], weights[N], sample_shapes[N], tables, slots.
  const int first_sample_shape = n + nn + 3 * n;
  for (int i = 0; i < n; ++i) {
    ShapeHandle expected, merged;
    TF_RETURN_IF_ERROR(ActivationShape(c, config, i, first_sample_shape + i, &expected));
    if (absl::Status s = c->Merge(c->input(i), expected, &merged); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          FeatureLabel(config, i), ": the gradient (inputs[", i, "]) has shape ", c->DebugString(c->input(i)),
          ", expected ", c->DebugString(expected), " (sample_shape + [dim]): ", s.message()));
    }
  }
  for (int i = 0; i < nn; ++i) {
    ShapeHandle unused;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(n + i), 0, &unused));
  }
  return absl::OkStatus();
}

}  // namespace tf_embed_ops
