// The one kernel of the fused lookup ops (TfEmbed>EmbeddingActivations, TieredEmbeddingActivations,
// DynamicEmbeddingActivations), a template over where the tables live (table_source.h):
//   Validate: the tables against the config, every feature (structure, ids or keys) and what the source checks
//             before reading a row (variable dtypes and shapes, a tiered cache's capacity).
//   Rows:     the outputs allocated, the source's rows found (inserted for a training lookup) or pinned.
//   Combine:  the forward pass (cc/lib/embedding_forward.h) of each feature over the rows, in parallel over
//             samples; tables may be float32, bfloat16 or float16 (docs/low_precision.md), activations are float32.
#define EIGEN_USE_THREADS

#include <memory>
#include <string>
#include <vector>

#include "cc/kernels/dense_table_source.h"
#include "cc/kernels/dynamic_table_source.h"
#include "cc/kernels/embedding_kernel_util.h"
#include "cc/kernels/fused_op_signature.h"
#include "cc/kernels/table_source.h"
#include "cc/kernels/tiered_table_source.h"
#include "cc/lib/embedding_forward.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_embed_ops {
namespace {

// One feature's activations: row_address(i) is the address of the `type` row its id i reads.
template <typename RowAddress>
void CombineFeature(const TableSpec& spec, const FeatureLayout& layout, int64_t num_ids, StorageType type,
                    const RowAddress& row_address, const ShardFn& shard, float* dst) {
  const SimulatedQuantization& q = spec.optimization.simulated_quantization;
  std::unique_ptr<Quantizer> quantizer = q.enabled ? std::make_unique<Quantizer>(q) : nullptr;
  const int64_t dim = spec.dimension;
  const int64_t ids_per_sample = layout.num_samples ? num_ids / layout.num_samples + 1 : 1;
  shard(layout.num_samples, ids_per_sample * dim * 3, [&](int64_t begin, int64_t end) {
    CombineFeatureRows(layout, type, row_address, dim, quantizer.get(), begin, end, dst);
  });
}

template <typename Source>
class EmbeddingActivationsOp : public tensorflow::OpKernel {
 public:
  explicit EmbeddingActivationsOp(tensorflow::OpKernelConstruction* ctx)
      : OpKernel(ctx), inputs_(FusedInputs::Lookup(0, 0)) {
    OP_REQUIRES_OK(ctx, attrs_.Init(ctx));
    inputs_ = FusedInputs::Lookup(attrs_.num_features, attrs_.num_tables);
    OP_REQUIRES_OK(ctx, Source::ReadAttrs(ctx, attrs_, inputs_, /*update=*/false, &source_attrs_));
  }

  void Compute(tensorflow::OpKernelContext* ctx) override {
    const int n = attrs_.num_features;
    const EmbeddingConfig& config = attrs_.config;
    Source source(ctx, attrs_, inputs_, source_attrs_);

    // 1. Validate everything before anything is sized by the inputs.
    OP_REQUIRES_OK(ctx, source.Open(/*update=*/false));
    FusedFeatures features;
    OP_REQUIRES_OK(ctx, ValidateFeatures(ctx, attrs_, inputs_, &source, /*gradients=*/false,
                                         /*check_numerics=*/false, &features));
    OP_REQUIRES_OK(ctx, source.PrepareLookup(features));

    // 2. Allocate (the sizes are validated now), lay out each feature, read the rows.
    WorkspacePool::Scoped workspace = workspaces_.Acquire();
    std::vector<FeatureLayout>& layouts = workspace->layouts;
    layouts.resize(n);
    std::vector<tensorflow::Tensor*> outputs(n);
    for (int f = 0; f < n; ++f) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(f, features.activations[f], &outputs[f]));
      BuildValidatedFeatureLayout(features.batches[f], features.num_samples[f], attrs_.combiners[f], &layouts[f],
                                  LayoutParts::kGrouping);
    }
    OP_REQUIRES_OK(ctx, source.ReadRows(features));

    // 3. Combine each feature's samples.
    const ShardFn shard = IntraOpShardFn(ctx);
    for (int f = 0; f < n; ++f) {
      const int t = config.features[f].table_id;
      source.WithRows(t, f, features, [&](StorageType type, const auto& row_address) {
        CombineFeature(config.tables[t], layouts[f], features.batches[f].num_ids, type, row_address, shard,
                       outputs[f]->flat<float>().data());
      });
    }
  }

 private:
  FusedEmbeddingAttrs attrs_;
  FusedInputs inputs_;
  typename Source::Attrs source_attrs_;
  WorkspacePool workspaces_;
};

REGISTER_KERNEL_BUILDER(Name("TfEmbed>EmbeddingActivations").Device(tensorflow::DEVICE_CPU),
                        EmbeddingActivationsOp<DenseTableSource>);
REGISTER_KERNEL_BUILDER(Name("TfEmbed>TieredEmbeddingActivations").Device(tensorflow::DEVICE_CPU),
                        EmbeddingActivationsOp<TieredTableSource>);
REGISTER_KERNEL_BUILDER(Name("TfEmbed>DynamicEmbeddingActivations").Device(tensorflow::DEVICE_CPU),
                        EmbeddingActivationsOp<DynamicTableSource>);

}  // namespace
}  // namespace tf_embed_ops
