// Kernel of TfEmbed>DynamicEmbeddingActivations: the static EmbeddingActivations over dynamic tables.
//   Validate: every feature's structure (FeatureLayout), the tables against the config, each feature's key
//             dtype against its table's; string keys are fingerprinted.
//   Rows:     per table, the keys of all its features (feature order) -> rows: FindOrInsert for a training
//             lookup (admission counted over the whole step, held exclusively), Find otherwise (shared).
//   Combine:  the static forward pass (cc/lib/embedding_forward.h) with arena rows (a tiered table's: its
//             records, pinned in its cache), a row of zeros for a key without a row, under the same lock (rows
//             must not move or be evicted meanwhile).
#define EIGEN_USE_THREADS

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/kernels/dynamic_table_kernel_util.h"
#include "cc/kernels/dynamic_table_resource.h"
#include "cc/kernels/embedding_kernel_util.h"
#include "cc/lib/embedding_forward.h"
#include "cc/lib/tiered_dynamic_table.h"
#include "cc/lib/tiered_row_storage.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tf_embed_ops {
namespace {

// The pinned rows of a step's tiered tables, released (clean: a lookup writes nothing) when the kernel returns.
class TieredPins {
 public:
  explicit TieredPins(int num_tables) : pins_(num_tables), tables_(num_tables, nullptr) {}
  ~TieredPins() {
    for (size_t t = 0; t < pins_.size(); ++t) {
      if (tables_[t] != nullptr) tables_[t]->cache().Release(&pins_[t], /*dirty=*/false);
    }
  }
  TieredPins(const TieredPins&) = delete;
  TieredPins& operator=(const TieredPins&) = delete;

  absl::Status Pin(int t, TieredDynamicTable* table, const std::vector<int64_t>& rows) {
    TF_RETURN_IF_ERROR(table->PinRows(rows.data(), static_cast<int64_t>(rows.size()), &pins_[t]));
    tables_[t] = table;
    return absl::OkStatus();
  }
  const TieredPin& pin(int t) const { return pins_[t]; }

 private:
  std::vector<TieredPin> pins_;
  std::vector<TieredDynamicTable*> tables_;
};

class DynamicEmbeddingActivationsOp : public tensorflow::OpKernel {
 public:
  explicit DynamicEmbeddingActivationsOp(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Init(ctx));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("training", &training_));
    OP_REQUIRES_OK(ctx, CheckKeysPerFeature(ctx, attrs_.num_features));
  }

  void Compute(tensorflow::OpKernelContext* ctx) override {
    const int n = attrs_.num_features;
    const EmbeddingConfig& config = attrs_.config;
    // Inputs: splits[N], keys[N], weights[N], sample_shapes[N], tables[T], step.
    const int first_table = 4 * n;

    // 1. Validate everything before the first write.
    std::vector<DynamicTableRef> tables;
    OP_REQUIRES_OK(ctx, LookupConfigTables(ctx, first_table, config, /*check_slots=*/false, &tables));
    int64_t step = 0;
    OP_REQUIRES_OK(ctx, ReadStep(ctx->input(first_table + attrs_.num_tables), &step));
    std::vector<FeatureBatch> batches(n);
    std::vector<int64_t> num_samples(n);
    std::vector<tensorflow::TensorShape> output_shapes(n);
    std::vector<std::vector<int64_t>> string_keys(n);
    std::vector<int64_t> keys_per_table(attrs_.num_tables, 0);
    for (int f = 0; f < n; ++f) {
      const std::string label = attrs_.FeatureLabel(f);
      const int t = config.features[f].table_id;
      OP_REQUIRES_OK(ctx, ReadFeatureBatch(ctx, 0, n, f, label, &batches[f]));
      OP_REQUIRES_OK(ctx, ReadKeys(ctx->input(n + f), *tables[t], label, &string_keys[f], &batches[f].ids));
      OP_REQUIRES_OK(ctx, ValidateFeatureBatch(batches[f], label, &num_samples[f]));
      OP_REQUIRES_OK(ctx, ActivationShape(batches[f], config.tables[t], label, &output_shapes[f]));
      keys_per_table[t] += batches[f].num_ids;
    }

    // 2. Allocate outputs and layouts (sizes are validated now).
    std::vector<tensorflow::Tensor*> outputs(n);
    WorkspacePool::Scoped workspace = workspaces_.Acquire();
    std::vector<FeatureLayout>& layouts = workspace->layouts;
    layouts.resize(n);
    for (int f = 0; f < n; ++f) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(f, output_shapes[f], &outputs[f]));
      BuildValidatedFeatureLayout(batches[f], num_samples[f], attrs_.combiners[f], &layouts[f]);
    }
    // Per table one key array (its features' keys in feature order), so admission counts the whole step.
    std::vector<std::vector<int64_t>> table_keys(attrs_.num_tables), table_rows(attrs_.num_tables);
    std::vector<int64_t> first_key(n);
    for (int t = 0; t < attrs_.num_tables; ++t) table_keys[t].reserve(keys_per_table[t]);
    for (int f = 0; f < n; ++f) {
      std::vector<int64_t>& keys = table_keys[config.features[f].table_id];
      first_key[f] = static_cast<int64_t>(keys.size());
      keys.insert(keys.end(), batches[f].ids, batches[f].ids + batches[f].num_ids);
    }
    int64_t max_dim = 1;
    for (int t = 0; t < attrs_.num_tables; ++t) {
      table_rows[t].resize(table_keys[t].size());
      max_dim = std::max<int64_t>(max_dim, config.tables[t].dimension);
    }
    const std::vector<float> zeros(max_dim, 0.0f);  // the default row of a key without a row

    // 3. Rows and the forward pass, under the tables' locks.
    std::vector<DynamicTableResource*> resources;
    for (const DynamicTableRef& t : tables) resources.push_back(t.get());
    DynamicTableLocks locks(resources, /*exclusive=*/training_);
    if (training_) {
      // Tiered tables: every table's batch must fit its cache and its row file must have room for the new keys,
      // checked (and the files grown) before any table inserts a key.
      for (int t = 0; t < attrs_.num_tables; ++t) {
        if (TieredDynamicTable* tiered = tables[t]->tiered(); tiered != nullptr) {
          OP_REQUIRES_OK(ctx, tiered->Prepare(table_keys[t].data(), static_cast<int64_t>(table_keys[t].size())));
        }
      }
    }
    for (int t = 0; t < attrs_.num_tables; ++t) {
      DynamicTableResource* resource = tables[t].get();
      const int64_t num_keys = static_cast<int64_t>(table_keys[t].size());
      if (training_) {
        BatchStats stats;
        // Fails only when an allocation (or a tiered table's write of its new rows) does; an earlier table's
        // inserts then stay (they are whole rows).
        TieredDynamicTable* tiered = resource->tiered();
        OP_REQUIRES_OK(ctx, tiered != nullptr ? tiered->FindOrInsert(table_keys[t].data(), num_keys, step,
                                                                     table_rows[t].data(), &stats)
                                              : resource->table()->FindOrInsert(table_keys[t].data(), num_keys, step,
                                                                                table_rows[t].data(), &stats));
        resource->RecordLookup(step, stats);
        // The fused update of this step takes these rows instead of probing every key again.
        resource->mutable_lookup_memo()->Remember(table_keys[t].data(), table_rows[t].data(), num_keys,
                                                  resource->reader().mapping_version());
      } else {
        resource->reader().Find(table_keys[t].data(), num_keys, table_rows[t].data());
      }
    }
    // A tiered table's rows are read from its cache, pinned until the activations are computed.
    TieredPins pins(attrs_.num_tables);
    std::vector<std::unique_ptr<TieredRowStorage>> records(attrs_.num_tables);
    for (int t = 0; t < attrs_.num_tables; ++t) {
      if (TieredDynamicTable* tiered = tables[t]->tiered(); tiered != nullptr) {
        OP_REQUIRES_OK(ctx, pins.Pin(t, tiered, table_rows[t]));
        records[t] = std::make_unique<TieredRowStorage>(tiered->layout(), pins.pin(t), /*window=*/false);
      }
    }
    const ShardFn shard = IntraOpShardFn(ctx);
    for (int f = 0; f < n; ++f) {
      const int t = config.features[f].table_id;
      const TableSpec& spec = config.tables[t];
      const SimulatedQuantization& q = spec.optimization.simulated_quantization;
      std::unique_ptr<Quantizer> quantizer = q.enabled ? std::make_unique<Quantizer>(q) : nullptr;
      const DynamicTable* table = &tables[t]->reader();
      const int64_t* rows = table_rows[t].data() + first_key[f];
      const float* zero_row = zeros.data();
      const FeatureLayout& layout = layouts[f];
      const int64_t dim = spec.dimension;
      const int64_t ids_per_sample = layout.num_samples ? batches[f].num_ids / layout.num_samples + 1 : 1;
      float* dst = outputs[f]->flat<float>().data();
      const StorageType storage = table->buffer_type(0);
      // The forward pass over weights_of(row), buffer 0 of a row: in the table's arena, or in a tiered table's
      // pinned record (compiled once for each, so the in-memory loop has no tiered branch).
      const auto combine = [&](const auto& weights_of) {
        if (storage == StorageType::kFloat32) {
          const auto row_of = [&weights_of, rows, zero_row](int64_t i) {
            return rows[i] == DynamicTable::kNotAdmitted ? zero_row : static_cast<const float*>(weights_of(rows[i]));
          };
          shard(layout.num_samples, ids_per_sample * dim * 3, [&](int64_t begin, int64_t end) {
            CombineSampleRows(layout, row_of, dim, quantizer.get(), begin, end, dst);
          });
        } else {
          // 16-bit rows are widened as they are read; all-zero bits are +0 in both 16-bit types.
          const uint16_t* zero_bits = reinterpret_cast<const uint16_t*>(zero_row);
          const auto row_of = [&weights_of, rows, zero_bits](int64_t i) {
            return rows[i] == DynamicTable::kNotAdmitted ? zero_bits
                                                         : static_cast<const uint16_t*>(weights_of(rows[i]));
          };
          shard(layout.num_samples, ids_per_sample * dim * 3, [&](int64_t begin, int64_t end) {
            CombineSampleRows(layout, storage, row_of, dim, quantizer.get(), begin, end, dst);
          });
        }
      };
      if (const TieredRowStorage* records_of_t = records[t].get(); records_of_t != nullptr) {
        combine([records_of_t](int64_t row) -> const void* { return records_of_t->Row(0, row); });
      } else {
        combine([table](int64_t row) -> const void* { return table->BufferRow(0, row); });
      }
    }
  }

 private:
  FusedEmbeddingAttrs attrs_;
  WorkspacePool workspaces_;
  bool training_ = false;
};

REGISTER_KERNEL_BUILDER(Name("TfEmbed>DynamicEmbeddingActivations").Device(tensorflow::DEVICE_CPU),
                        DynamicEmbeddingActivationsOp);

}  // namespace
}  // namespace tf_embed_ops
