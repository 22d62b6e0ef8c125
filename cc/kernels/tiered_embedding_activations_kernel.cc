// Kernel of TfEmbed>TieredEmbeddingActivations: the static EmbeddingActivations over tiered tables.
//   Validate: every feature's structure (FeatureLayout) and ids against its table's rows, the tables against the
//             config; each table's distinct ids against its cache's capacity.
//   Rows:     per table (shared lock), its distinct ids made resident and pinned (TieredRowCache::Acquire).
//   Combine:  the static forward pass (cc/lib/embedding_forward.h) over the pinned records, each id's record found
//             by its position among the distinct rows (TieredRowCache::DistinctRows), then release them.
#define EIGEN_USE_THREADS

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/kernels/embedding_kernel_util.h"
#include "cc/kernels/tiered_table_kernel_util.h"
#include "cc/kernels/tiered_table_resource.h"
#include "cc/lib/embedding_forward.h"
#include "cc/lib/tiered_row_storage.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tf_embed_ops {
namespace {

class TieredEmbeddingActivationsOp : public tensorflow::OpKernel {
 public:
  explicit TieredEmbeddingActivationsOp(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Init(ctx));
  }

  void Compute(tensorflow::OpKernelContext* ctx) override {
    const int n = attrs_.num_features;
    const EmbeddingConfig& config = attrs_.config;
    // Inputs: splits[N], keys[N], weights[N], sample_shapes[N], tables[T].
    std::vector<TieredTableRef> tables;
    OP_REQUIRES_OK(ctx, LookupTieredConfigTables(ctx, 4 * n, config, /*check_slots=*/false, &tables));
    std::vector<FeatureBatch> batches(n);
    std::vector<int64_t> num_samples(n);
    std::vector<tensorflow::TensorShape> output_shapes(n);
    OP_REQUIRES_OK(ctx, ValidateTieredFeatures(ctx, attrs_, 0, &batches, &num_samples));
    for (int f = 0; f < n; ++f) {
      const TableSpec& spec = config.tables[config.features[f].table_id];
      OP_REQUIRES_OK(ctx, ActivationShape(batches[f], spec, attrs_.FeatureLabel(f), &output_shapes[f]));
    }
    // Each table's distinct ids (its features' ids in feature order, found once per batch: a prefetch may have),
    // checked against its capacity before any row is read.
    std::vector<std::shared_ptr<const DistinctBatch>> distinct(attrs_.num_tables);
    for (int t = 0; t < attrs_.num_tables; ++t) {
      std::vector<int64_t> ids;
      for (int f = 0; f < n; ++f) {
        if (config.features[f].table_id == t)
          ids.insert(ids.end(), batches[f].ids, batches[f].ids + batches[f].num_ids);
      }
      TieredRowCache* cache = tables[t]->cache();
      distinct[t] = cache->DistinctRows(std::move(ids));
      const int64_t needed = static_cast<int64_t>(distinct[t]->rows.size());
      OP_REQUIRES(ctx, needed <= cache->capacity(),
                  cache->TooManyRows(needed, absl::StrCat("the lookup of table '", config.tables[t].name, "'")));
    }

    std::vector<tensorflow::Tensor*> outputs(n);
    WorkspacePool::Scoped workspace = workspaces_.Acquire();
    std::vector<FeatureLayout>& layouts = workspace->layouts;
    layouts.resize(n);
    for (int f = 0; f < n; ++f) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(f, output_shapes[f], &outputs[f]));
      BuildValidatedFeatureLayout(batches[f], num_samples[f], attrs_.combiners[f], &layouts[f]);
    }
    const ShardFn shard = IntraOpShardFn(ctx);
    TieredTableLocks locks(tables, /*exclusive=*/false);
    for (int t = 0; t < attrs_.num_tables; ++t) {
      TieredRowCache* cache = tables[t]->cache();
      TieredPin pin;
      OP_REQUIRES_OK(ctx, cache->Acquire(distinct[t]->rows, &pin));
      const TieredRowStorage storage = TieredRowStorage::ByPosition(cache->layout(), pin);
      const int64_t* positions = distinct[t]->positions.data();  // the table's features' ids, in feature order
      for (int f = 0; f < n; ++f) {
        if (config.features[f].table_id != t) continue;
        Combine(config.tables[t], layouts[f], batches[f].num_ids, positions, storage, shard,
                outputs[f]->flat<float>().data());
        positions += batches[f].num_ids;
      }
      cache->Release(&pin, /*dirty=*/false);
    }
  }

 private:
  // One feature's activations; `positions[i]`: where id i's row is among the pinned rows (storage ByPosition).
  static void Combine(const TableSpec& spec, const FeatureLayout& layout, int64_t num_ids, const int64_t* positions,
                      const TieredRowStorage& storage, const ShardFn& shard, float* dst) {
    const SimulatedQuantization& q = spec.optimization.simulated_quantization;
    std::unique_ptr<Quantizer> quantizer = q.enabled ? std::make_unique<Quantizer>(q) : nullptr;
    const int64_t dim = spec.dimension;
    const int64_t* ids = positions;
    const int64_t ids_per_sample = layout.num_samples ? num_ids / layout.num_samples + 1 : 1;
    const StorageType type = storage.type(0);
    if (type == StorageType::kFloat32) {
      const auto row_of = [&storage, ids](int64_t i) { return static_cast<const float*>(storage.Row(0, ids[i])); };
      shard(layout.num_samples, ids_per_sample * dim * 3, [&](int64_t begin, int64_t end) {
        CombineSampleRows(layout, row_of, dim, quantizer.get(), begin, end, dst);
      });
    } else {
      const auto row_of = [&storage, ids](int64_t i) { return static_cast<const uint16_t*>(storage.Row(0, ids[i])); };
      shard(layout.num_samples, ids_per_sample * dim * 3, [&](int64_t begin, int64_t end) {
        CombineSampleRows(layout, type, row_of, dim, quantizer.get(), begin, end, dst);
      });
    }
  }

  FusedEmbeddingAttrs attrs_;
  WorkspacePool workspaces_;
};

REGISTER_KERNEL_BUILDER(Name("TfEmbed>TieredEmbeddingActivations").Device(tensorflow::DEVICE_CPU),
                        TieredEmbeddingActivationsOp);

}  // namespace
}  // namespace tf_embed_ops
