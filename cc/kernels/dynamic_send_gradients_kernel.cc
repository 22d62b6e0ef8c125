// Kernel of TfEmbed>DynamicSendTPUEmbeddingGradients: SendTPUEmbeddingGradients over dynamic tables.
//   Validate: features, gradients (and their values with check_numerics), learning rates, the tables against
//             the config (dimension, slot count, key dtypes), the step; string keys are fingerprinted.  Nothing
//             is written before all of it passed.
//   Plan:     under each table's exclusive lock (all tables, address order): keys -> rows, taken from the
//             step's training lookup when its keys and the table's mapping are unchanged (LookupMemo), else
//             with Find (never inserting: the rows are the ones this step's training lookup made); a
//             RowGradientPlan over the rows (keys without a row, -1, contribute nothing).
//   Check:    with check_numerics, a dry run of every table's update (writes nothing; see the static kernel).
//   Update:   per table the one row walk (UpdateDynamicTable; a tiered table's over its cache), then the table's
//             end-of-step eviction (not with validate_only, which stops after Check and holds the tables shared).
#define EIGEN_USE_THREADS

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/kernels/dynamic_table_kernel_util.h"
#include "cc/kernels/dynamic_table_resource.h"
#include "cc/kernels/embedding_kernel_util.h"
#include "cc/lib/dynamic_table_update.h"
#include "cc/lib/gradient_accumulation.h"
#include "cc/lib/tiered_dynamic_table.h"
#include "cc/lib/touched_rows_update.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tf_embed_ops {
namespace {

class DynamicSendTPUEmbeddingGradientsOp : public tensorflow::OpKernel {
 public:
  explicit DynamicSendTPUEmbeddingGradientsOp(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Init(ctx));
    OP_REQUIRES_OK(ctx, CheckKeysPerFeature(ctx, attrs_.num_features));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("NN", &num_learning_rates_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("check_numerics", &check_numerics_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("validate_only", &validate_only_));
    OP_REQUIRES(ctx, num_learning_rates_ == attrs_.config.num_learning_rate_tags,
                absl::InvalidArgumentError(absl::StrCat(
                    "learning_rates has ", num_learning_rates_, " entries but the config has ",
                    attrs_.config.num_learning_rate_tags, " dynamic learning-rate tags; give one scalar per tag")));
    tag_tables_ = TablesPerTag(attrs_.config);
  }

  void Compute(tensorflow::OpKernelContext* ctx) override {
    const int n = attrs_.num_features;
    const EmbeddingConfig& config = attrs_.config;
    // Inputs: gradients[N], learning_rates[NN], splits[N], keys[N], weights[N], sample_shapes[N], tables[T], step.
    const int first_list = n + num_learning_rates_;
    const int first_table = first_list + 4 * n;

    // 1. Validate.
    std::vector<DynamicTableRef> tables;
    OP_REQUIRES_OK(ctx, LookupConfigTables(ctx, first_table, config, /*check_slots=*/true, &tables));
    int64_t step = 0;
    OP_REQUIRES_OK(ctx, ReadStep(ctx->input(first_table + attrs_.num_tables), &step));
    std::vector<float> learning_rates;
    OP_REQUIRES_OK(ctx, ReadLearningRates(ctx, n, tag_tables_, &learning_rates));
    std::vector<FeatureBatch> batches(n);
    std::vector<int64_t> num_samples(n);
    std::vector<std::vector<int64_t>> string_keys(n);
    std::vector<int64_t> keys_per_table(attrs_.num_tables, 0);
    for (int f = 0; f < n; ++f) {
      const std::string label = attrs_.FeatureLabel(f);
      const int t = config.features[f].table_id;
      const TableSpec& spec = config.tables[t];
      FeatureBatch& batch = batches[f];
      OP_REQUIRES_OK(ctx, ReadFeatureBatch(ctx, first_list, n, f, label, &batch));
      OP_REQUIRES_OK(ctx, ReadKeys(ctx->input(first_list + n + f), *tables[t], label, &string_keys[f], &batch.ids));
      OP_REQUIRES_OK(ctx, ValidateFeatureBatch(batch, label, &num_samples[f]));
      tensorflow::TensorShape expected;
      OP_REQUIRES_OK(ctx, ActivationShape(batch, spec, label, &expected));
      OP_REQUIRES_OK(ctx, CheckFeatureGradient(ctx->input(f), f, expected, label, spec.name, check_numerics_));
      keys_per_table[t] += batch.num_ids;
    }
    for (int t = 0; t < attrs_.num_tables; ++t) {
      OP_REQUIRES(ctx, keys_per_table[t] <= RowGradientPlan::kMaxIds,
                  absl::InvalidArgumentError(absl::StrCat("table '", config.tables[t].name, "': its features have ",
                                                          keys_per_table[t], " keys in all; at most ",
                                                          RowGradientPlan::kMaxIds, " per step are supported")));
    }

    // 2. Layouts and per-feature row arrays (allocations only).
    WorkspacePool::Scoped ws = workspaces_.Acquire();
    ws->layouts.resize(n);
    for (int f = 0; f < n; ++f) {
      BuildValidatedFeatureLayout(batches[f], num_samples[f], attrs_.combiners[f], &ws->layouts[f]);
    }
    std::vector<std::vector<int64_t>> rows(n);
    for (int f = 0; f < n; ++f) rows[f].resize(batches[f].num_ids);
    ws->sources.resize(attrs_.num_tables);
    ws->plans.resize(attrs_.num_tables);

    // 3. Update every table under its exclusive lock.
    std::vector<DynamicTableResource*> resources;
    for (const DynamicTableRef& t : tables) resources.push_back(t.get());
    DynamicTableLocks locks(resources, /*exclusive=*/!validate_only_);
    const ShardFn shard = IntraOpShardFn(ctx);
    for (int t = 0; t < attrs_.num_tables; ++t) {
      const DynamicTable* table = &tables[t]->reader();
      std::vector<GradientSource>& sources = ws->sources[t];
      sources.clear();
      std::vector<LookupMemo::Segment> segments;
      for (int f = 0; f < n; ++f) {
        if (config.features[f].table_id != t) continue;
        segments.push_back(LookupMemo::Segment{batches[f].ids, batches[f].num_ids, rows[f].data()});
        sources.push_back(
            GradientSource{rows[f].data(), batches[f].num_ids, &ws->layouts[f], ctx->input(f).flat<float>().data()});
      }
      // The step's training lookup found these keys' rows already: probe again only when the keys or the
      // table's mapping differ from that lookup's.
      if (!tables[t]->lookup_memo().Recall(segments, table->mapping_version())) {
        for (const LookupMemo::Segment& s : segments) table->Find(s.keys, s.num_keys, s.rows);
      }
      ws->plans[t].Build(&sources);
      // A tiered table's lazy step pins its rows at once: refused here, before any table is updated, when they
      // do not fit its cache (a non-lazy step walks in windows that always fit).
      if (const TieredDynamicTable* tiered = tables[t]->tiered();
          tiered != nullptr && !UpdatesAllRows(config.tables[t].optimization) &&
          ws->plans[t].num_rows() > tiered->cache().capacity()) {
        OP_REQUIRES_OK(ctx, tiered->cache().TooManyRows(ws->plans[t].num_rows(),
                                                        absl::StrCat("dynamic table '", tiered->name(), "'")));
      }
    }
    // check_numerics: every table's update is computed once without writing before any is written (see
    // SendTPUEmbeddingGradients), so a step that would introduce a NaN or +-inf changes no table.
    if (check_numerics_) {
      for (int t = 0; t < attrs_.num_tables; ++t) {
        const TableSpec& spec = config.tables[t];
        const DynamicTable* table = &tables[t]->reader();
        const float lr = TableLearningRate(spec, learning_rates);
        NonFiniteUpdate bad;
        if (TieredDynamicTable* tiered = tables[t]->tiered(); tiered != nullptr) {
          absl::StatusOr<NonFiniteUpdate> found =
              tiered->FindNonFinite(spec.optimization, lr, ws->plans[t], Rounding16(*table, step, t), shard);
          OP_REQUIRES_OK(ctx, found.status());
          bad = *found;
        } else {
          bad = FindNonFiniteDynamicUpdate(spec.optimization, lr, ws->plans[t], *table, shard,
                                           Rounding16(*table, step, t));
        }
        if (!bad.found) continue;
        std::vector<const int64_t*> ids;
        std::vector<int64_t> num_ids;
        for (int f = 0; f < n; ++f) {
          ids.push_back(rows[f].data());
          num_ids.push_back(batches[f].num_ids);
        }
        OP_REQUIRES_OK(ctx, NonFiniteUpdateError(attrs_, t, bad, ids, num_ids,
                                                 absl::StrCat("key ", table->KeyOf(bad.row), " (row ", bad.row, ")")));
      }
    }
    if (validate_only_) return;
    for (int t = 0; t < attrs_.num_tables; ++t) {
      DynamicTable* table = tables[t]->table();
      const TableSpec& spec = config.tables[t];
      const float lr = TableLearningRate(spec, learning_rates);
      if (TieredDynamicTable* tiered = tables[t]->tiered(); tiered != nullptr) {
        // The same walk over the rows pinned in the cache; fails only on I/O (a lazy step then changed no row).
        OP_REQUIRES_OK(ctx, tiered->Update(spec.optimization, lr, ws->plans[t], Rounding16(*table, step, t), shard));
      } else {
        UpdateDynamicTable(spec.optimization, lr, ws->plans[t], table, shard, Rounding16(*table, step, t));
      }
      if (TouchedRows* touched = table->tracker(); touched != nullptr) {  // docs/tracking.md
        MarkUpdatedRows(ws->plans[t], UpdatesAllRows(spec.optimization), touched);
      }
      // Cannot fail: the step was validated.
      absl::StatusOr<int64_t> evicted = table->EndStep(step);
      OP_REQUIRES_OK(ctx, evicted.status());
      tables[t]->RecordEvictions(step, *evicted);
    }
  }

 private:
  // How a 16-bit table's rows are rounded at `step`: the table's own mode and seed (its initializer's, mixed
  // differently by RoundingRowKey), the step, and the table's index in the config.
  static RoundingSpec Rounding16(const DynamicTable& table, int64_t step, int t) {
    return RoundingSpec{table.options().rounding, table.options().initializer.seed, step, t};
  }

  FusedEmbeddingAttrs attrs_;
  WorkspacePool workspaces_;
  int num_learning_rates_ = 0;
  bool check_numerics_ = false;
  bool validate_only_ = false;                        // checks only: shared locks, nothing written
  std::vector<std::vector<std::string>> tag_tables_;  // per dynamic tag: the tables that use it
};

REGISTER_KERNEL_BUILDER(Name("TfEmbed>DynamicSendTPUEmbeddingGradients").Device(tensorflow::DEVICE_CPU),
                        DynamicSendTPUEmbeddingGradientsOp);

}  // namespace
}  // namespace tf_embed_ops
