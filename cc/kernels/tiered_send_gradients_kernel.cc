// Kernel of TfEmbed>TieredSendTPUEmbeddingGradients: SendTPUEmbeddingGradients over tiered tables.
//   Validate: features and ids (in [0, num_rows)), gradients (and their values with check_numerics), learning
//             rates, the tables against the config (rows, dimension, slots), the step, the rounding attrs.
//   Plan:     per table its accumulation plan; a lazy table's distinct rows (TieredRowCache::DistinctRows,
//             usually found by the batch's prefetch or lookup) against its cache's capacity, before any row is
//             made resident, evicted or written, and its plan built over the ids' positions among them (so the
//             walk reads each pinned record with one load: TieredRowStorage::ByPosition).
//   Pin:      under every table's exclusive lock, the rows of all lazy tables pinned first (a failure pins
//             nothing and writes no row).
//   Check:    with check_numerics, every table's update computed without writing (lazy tables over their pinned
//             rows, the others window by window); a rejected step releases the pins clean.
//   Update:   the one row walk of each lazy table (cc/lib/tiered_row_storage.h), released dirty; then tables whose
//             optimizer updates every row, window by window.  Each table's tracker (if any) marks the rows
//             written.
#define EIGEN_USE_THREADS

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/kernels/dynamic_table_kernel_util.h"
#include "cc/kernels/embedding_kernel_util.h"
#include "cc/kernels/tiered_table_kernel_util.h"
#include "cc/kernels/tiered_table_resource.h"
#include "cc/kernels/touched_rows_resource.h"
#include "cc/lib/gradient_accumulation.h"
#include "cc/lib/optimizers/registry.h"
#include "cc/lib/rounding_table_ids.h"
#include "cc/lib/tiered_row_storage.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tf_embed_ops {
namespace {

class TieredSendTPUEmbeddingGradientsOp : public tensorflow::OpKernel {
 public:
  explicit TieredSendTPUEmbeddingGradientsOp(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Init(ctx));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("NN", &num_learning_rates_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("check_numerics", &check_numerics_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("validate_only", &validate_only_));
    OP_REQUIRES(ctx, num_learning_rates_ == attrs_.config.num_learning_rate_tags,
                absl::InvalidArgumentError(absl::StrCat(
                    "learning_rates has ", num_learning_rates_, " entries but the config has ",
                    attrs_.config.num_learning_rate_tags, " dynamic learning-rate tags; give one scalar per tag")));
    tag_tables_ = TablesPerTag(attrs_.config);
    const int num_tables = attrs_.num_tables;
    std::vector<std::string> rounding;
    std::vector<int64_t> table_ids;
    int64_t seed = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rounding", &rounding));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rounding_seed", &seed));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rounding_table_ids", &table_ids));
    OP_REQUIRES(ctx, rounding.empty() || static_cast<int>(rounding.size()) == num_tables,
                absl::InvalidArgumentError(absl::StrCat("rounding has ", rounding.size(), " entries; give none (all \"",
                                                        "stochastic\") or one per table (", num_tables, ")")));
    std::vector<int64_t> rounding_ids;
    OP_REQUIRES_OK(ctx, ResolveRoundingTableIds(table_ids, num_tables, "rounding_table_ids", &rounding_ids));
    rounding_.resize(num_tables);
    for (int t = 0; t < num_tables; ++t) {
      const std::string mode = rounding.empty() ? "stochastic" : rounding[t];
      OP_REQUIRES(
          ctx, mode == "stochastic" || mode == "nearest",
          absl::InvalidArgumentError(absl::StrCat("rounding[", t, "] (table '", attrs_.config.tables[t].name,
                                                  "') is \"", mode, "\"; expected \"stochastic\" or \"nearest\"")));
      rounding_[t] = RoundingSpec{mode == "nearest" ? Rounding::kNearest : Rounding::kStochastic,
                                  static_cast<uint64_t>(seed), 0, rounding_ids[t]};
    }
  }

  void Compute(tensorflow::OpKernelContext* ctx) override {
    const int n = attrs_.num_features;
    const int num_tables = attrs_.num_tables;
    const EmbeddingConfig& config = attrs_.config;
    // Inputs: gradients[N], learning_rates[NN], splits[N], keys[N], weights[N], sample_shapes[N], tables[T], step.
    const int first_list = n + num_learning_rates_;
    const int first_table = first_list + 4 * n;

    // 1. Validate.
    std::vector<TieredTableRef> tables;
    OP_REQUIRES_OK(ctx, LookupTieredConfigTables(ctx, first_table, config, /*check_slots=*/true, &tables));
    int64_t step = 0;
    OP_REQUIRES_OK(ctx, ReadStep(ctx->input(first_table + num_tables), &step));
    std::vector<float> learning_rates;
    OP_REQUIRES_OK(ctx, ReadLearningRates(ctx, n, tag_tables_, &learning_rates));
    std::vector<FeatureBatch> batches;
    std::vector<int64_t> num_samples;
    OP_REQUIRES_OK(ctx, ValidateTieredFeatures(ctx, attrs_, first_list, &batches, &num_samples));
    std::vector<int64_t> ids_per_table(num_tables, 0);
    for (int f = 0; f < n; ++f) {
      const std::string label = attrs_.FeatureLabel(f);
      const TableSpec& spec = config.tables[config.features[f].table_id];
      tensorflow::TensorShape expected;
      OP_REQUIRES_OK(ctx, ActivationShape(batches[f], spec, label, &expected));
      OP_REQUIRES_OK(ctx, CheckFeatureGradient(ctx->input(f), f, expected, label, spec.name, check_numerics_));
      ids_per_table[config.features[f].table_id] += batches[f].num_ids;
    }
    for (int t = 0; t < num_tables; ++t) {
      OP_REQUIRES(ctx, ids_per_table[t] <= RowGradientPlan::kMaxIds,
                  absl::InvalidArgumentError(absl::StrCat("table '", config.tables[t].name, "': its features have ",
                                                          ids_per_table[t], " ids in all; at most ",
                                                          RowGradientPlan::kMaxIds, " per step are supported")));
    }

    // 2. Plan, and the capacity of every lazy table's cache.
    WorkspacePool::Scoped ws = workspaces_.Acquire();
    ws->layouts.resize(n);
    for (int f = 0; f < n; ++f) {
      BuildValidatedFeatureLayout(batches[f], num_samples[f], attrs_.combiners[f], &ws->layouts[f]);
    }
    ws->sources.resize(num_tables);
    ws->plans.resize(num_tables);
    std::vector<std::shared_ptr<const DistinctBatch>> distinct(num_tables);  // lazy tables'
    for (int t = 0; t < num_tables; ++t) {
      TieredRowCache* cache = tables[t]->cache();
      const bool lazy = !OptimizerUpdatesAllRows(config.tables[t].optimization.optimizer);
      if (lazy) {
        // The table's ids in the lookup's order, so that the batch's distinct rows are usually remembered.
        std::vector<int64_t> ids;
        for (int f = 0; f < n; ++f) {
          if (config.features[f].table_id == t)
            ids.insert(ids.end(), batches[f].ids, batches[f].ids + batches[f].num_ids);
        }
        distinct[t] = cache->DistinctRows(std::move(ids));
        const int64_t needed = static_cast<int64_t>(distinct[t]->rows.size());
        OP_REQUIRES(ctx, needed <= cache->capacity(), cache->TooManyRows(needed, What(t)));
      }
      std::vector<GradientSource>& sources = ws->sources[t];
      sources.clear();
      const int64_t* positions = lazy ? distinct[t]->positions.data() : nullptr;
      for (int f = 0; f < n; ++f) {
        if (config.features[f].table_id != t) continue;
        const int64_t* ids = batches[f].ids;
        if (lazy) {
          ids = positions;
          positions += batches[f].num_ids;
        }
        sources.push_back(GradientSource{ids, batches[f].num_ids, &ws->layouts[f], ctx->input(f).flat<float>().data()});
      }
      // A lazy table's plan is over positions in [0, its distinct rows); the other tables' over their rows.
      ws->plans[t].Build(&sources,
                         lazy ? static_cast<int64_t>(distinct[t]->rows.size()) : config.tables[t].vocabulary_size);
    }

    if (validate_only_ && !check_numerics_) return;
    TieredTableLocks locks(tables, /*exclusive=*/!validate_only_);
    const ShardFn shard = IntraOpShardFn(ctx);
    // 3. Pin every lazy table's rows before anything is checked or written: an I/O error or a CRC mismatch then
    //    changes no row.
    std::vector<TieredPin> pins(num_tables);
    auto release_all = [&](bool dirty) {
      for (int t = 0; t < num_tables; ++t) tables[t]->cache()->Release(&pins[t], dirty);
    };
    for (int t = 0; t < num_tables; ++t) {
      if (distinct[t] == nullptr) continue;
      const absl::Status s = tables[t]->cache()->Acquire(distinct[t]->rows, &pins[t]);
      if (!s.ok()) release_all(/*dirty=*/false);
      OP_REQUIRES_OK(ctx, s);
    }
    // 4. check_numerics: every table's update computed once without writing before any is written.
    if (check_numerics_) {
      for (int t = 0; t < num_tables; ++t) {
        const TableSpec& spec = config.tables[t];
        const float lr = TableLearningRate(spec, learning_rates);
        absl::StatusOr<NonFiniteUpdate> bad =
            distinct[t] != nullptr
                ? FindNonFinitePinnedPositions(spec.optimization, lr, ws->plans[t], tables[t]->layout(), pins[t],
                                               Rounding(t, step), shard)
                : FindNonFiniteTieredUpdate(spec.optimization, lr, ws->plans[t], tables[t]->cache(), Rounding(t, step),
                                            shard, What(t));
        if (!bad.ok() || bad->found) release_all(/*dirty=*/false);
        OP_REQUIRES_OK(ctx, bad.status());
        if (!bad->found) continue;
        std::vector<const int64_t*> ids;
        std::vector<int64_t> num_ids;
        for (const FeatureBatch& batch : batches) {
          ids.push_back(batch.ids);
          num_ids.push_back(batch.num_ids);
        }
        OP_REQUIRES_OK(ctx, NonFiniteUpdateError(attrs_, t, *bad, ids, num_ids, absl::StrCat("row ", bad->row)));
      }
    }
    if (validate_only_) {
      release_all(/*dirty=*/false);
      return;
    }

    // 5. The lazy tables' walks over their pinned rows.
    for (int t = 0; t < num_tables; ++t) {
      if (distinct[t] == nullptr) continue;
      const TableSpec& spec = config.tables[t];
      UpdatePinnedPositions(spec.optimization, TableLearningRate(spec, learning_rates), ws->plans[t],
                            tables[t]->layout(), pins[t], Rounding(t, step), shard);
    }
    release_all(/*dirty=*/true);
    // Touched-row tracking (docs/tracking.md): the rows written, still under the tables' exclusive locks.
    for (int t = 0; t < num_tables; ++t) {
      if (distinct[t] != nullptr) MarkTouchedRowList(tables[t].get(), distinct[t]->rows);
    }
    // 6. Tables whose optimizer updates every row, window by window.  Marked whole even when a window failed:
    //    the windows before it were written.
    for (int t = 0; t < num_tables; ++t) {
      const TableSpec& spec = config.tables[t];
      if (distinct[t] != nullptr) continue;
      const absl::Status s = UpdateTieredTable(spec.optimization, TableLearningRate(spec, learning_rates), ws->plans[t],
                                               tables[t]->cache(), Rounding(t, step), shard, What(t));
      MarkTouchedRows(tables[t].get(), ws->plans[t], /*all_rows=*/true);
      OP_REQUIRES_OK(ctx, s);
    }
  }

 private:
  std::string What(int t) const { return absl::StrCat("the update of table '", attrs_.config.tables[t].name, "'"); }
  RoundingSpec Rounding(int t, int64_t step) const {
    RoundingSpec spec = rounding_[t];
    spec.step = step;
    return spec;
  }

  FusedEmbeddingAttrs attrs_;
  WorkspacePool workspaces_;
  int num_learning_rates_ = 0;
  bool check_numerics_ = false;
  bool validate_only_ = false;
  std::vector<RoundingSpec> rounding_;                // per table; the step is the call's
  std::vector<std::vector<std::string>> tag_tables_;  // per dynamic tag: the tables that use it
};

REGISTER_KERNEL_BUILDER(Name("TfEmbed>TieredSendTPUEmbeddingGradients").Device(tensorflow::DEVICE_CPU),
                        TieredSendTPUEmbeddingGradientsOp);

}  // namespace
}  // namespace tf_embed_ops
