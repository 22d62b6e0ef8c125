#include "cc/kernels/dynamic_table_source.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cc/lib/dynamic_table_update.h"
#include "cc/lib/optimizers/registry.h"
#include "cc/lib/touched_rows_update.h"

namespace tf_embed_ops {

DynamicRows::~DynamicRows() {
  if (tiered_ != nullptr) tiered_->cache().Release(&pin_, /*dirty=*/false);
}

absl::Status DynamicRows::Prepare(const int64_t* keys, int64_t n) {
  return tiered_ != nullptr ? tiered_->Prepare(keys, n) : absl::OkStatus();
}

absl::Status DynamicRows::FindOrInsert(const int64_t* keys, int64_t n, int64_t step, int64_t* rows, BatchStats* stats) {
  return tiered_ != nullptr ? tiered_->FindOrInsert(keys, n, step, rows, stats)
                            : resource_->table()->FindOrInsert(keys, n, step, rows, stats);
}

absl::Status DynamicRows::Pin(const std::vector<int64_t>& rows) {
  if (tiered_ == nullptr) return absl::OkStatus();
  TF_RETURN_IF_ERROR(tiered_->PinRows(rows.data(), static_cast<int64_t>(rows.size()), &pin_));
  records_ = std::make_unique<TieredRowStorage>(tiered_->layout(), pin_, /*window=*/false);
  return absl::OkStatus();
}

absl::Status DynamicRows::CheckCapacity(const TableOptimization& o, const RowGradientPlan& plan) const {
  if (tiered_ == nullptr || OptimizerUpdatesAllRows(o.optimizer) || plan.num_rows() <= tiered_->cache().capacity()) {
    return absl::OkStatus();
  }
  return tiered_->cache().TooManyRows(plan.num_rows(), absl::StrCat("dynamic table '", tiered_->name(), "'"));
}

absl::StatusOr<NonFiniteUpdate> DynamicRows::FindNonFinite(const TableOptimization& o, float lr,
                                                           const RowGradientPlan& plan, const RoundingSpec& rounding,
                                                           const ShardFn& shard) const {
  if (tiered_ != nullptr) return tiered_->FindNonFinite(o, lr, plan, rounding, shard);
  return FindNonFiniteDynamicUpdate(o, lr, plan, reader(), shard, rounding);
}

absl::Status DynamicRows::Update(const TableOptimization& o, float lr, const RowGradientPlan& plan,
                                 const RoundingSpec& rounding, const ShardFn& shard) {
  DynamicTable* table = resource_->table();
  if (tiered_ == nullptr) {
    UpdateDynamicTable(o, lr, plan, table, shard, rounding);  // marks a tracked table's rows after its walk
    return absl::OkStatus();
  }
  TF_RETURN_IF_ERROR(tiered_->Update(o, lr, plan, rounding, shard));
  // The cache is walked in windows: the tracker's one update is marked after them (docs/tracking.md).
  if (TouchedRows* touched = table->tracker(); touched != nullptr) {
    MarkUpdatedRows(plan, OptimizerUpdatesAllRows(o.optimizer), touched);
  }
  return absl::OkStatus();
}

absl::Status DynamicTableSource::ReadAttrs(tensorflow::OpKernelConstruction* ctx, const FusedEmbeddingAttrs& attrs,
                                           const FusedInputs&, bool update, Attrs* out) {
  if (!update) TF_RETURN_IF_ERROR(ctx->GetAttr("training", &out->training));
  return CheckKeysPerFeature(ctx, attrs.num_features);
}

absl::Status DynamicTableSource::Open(bool update) {
  TF_RETURN_IF_ERROR(LookupConfigTables(ctx_, inputs_.table(0), attrs_.config, /*check_slots=*/update, &tables_));
  return ReadStep(ctx_->input(inputs_.step()), &step_);
}

absl::Status DynamicTableSource::ReadIds(int f, const std::string& label, FeatureBatch* batch) {
  const DynamicTableResource& table = *tables_[attrs_.config.features[f].table_id];
  return ReadKeys(ctx_->input(inputs_.ids(f)), table, label, &string_keys_[f], &batch->ids);
}

void DynamicTableSource::Lock(bool exclusive) {
  std::vector<DynamicTableResource*> resources;
  for (const DynamicTableRef& t : tables_) resources.push_back(t.get());
  locks_.emplace(resources, exclusive);
  for (const DynamicTableRef& t : tables_) rows_.push_back(std::make_unique<DynamicRows>(t.get()));
}

absl::Status DynamicTableSource::ReadRows(const FusedFeatures& features) {
  const int num_tables = attrs_.num_tables;
  // Per table one key array (its features' keys in feature order), so admission counts the whole step.
  std::vector<std::vector<int64_t>> table_keys(num_tables);
  table_rows_.resize(num_tables);
  int64_t max_dim = 1;
  for (int t = 0; t < num_tables; ++t) {
    table_keys[t] = TableIds(attrs_, features, t);
    table_rows_[t].resize(table_keys[t].size());
    max_dim = std::max<int64_t>(max_dim, attrs_.config.tables[t].dimension);
  }
  first_id_ = FirstIdInTable(attrs_, features);
  zeros_.assign(max_dim, 0.0f);

  const bool training = source_attrs_.training;
  Lock(/*exclusive=*/training);
  if (training) {
    // Tiered tables: every table's batch must fit its cache and its row file must have room for the new keys,
    // checked (and the files grown) before any table inserts a key.
    for (int t = 0; t < num_tables; ++t) {
      TF_RETURN_IF_ERROR(rows_[t]->Prepare(table_keys[t].data(), static_cast<int64_t>(table_keys[t].size())));
    }
  }
  for (int t = 0; t < num_tables; ++t) {
    DynamicTableResource* resource = tables_[t].get();
    const int64_t num_keys = static_cast<int64_t>(table_keys[t].size());
    if (training) {
      BatchStats stats;
      // Fails only when an allocation (or a tiered table's write of its new rows) does; an earlier table's
      // inserts then stay (they are whole rows).
      TF_RETURN_IF_ERROR(rows_[t]->FindOrInsert(table_keys[t].data(), num_keys, step_, table_rows_[t].data(), &stats));
      resource->RecordLookup(step_, stats);
      // The fused update of this step takes these rows instead of probing every key again.
      resource->mutable_lookup_memo()->Remember(table_keys[t].data(), table_rows_[t].data(), num_keys,
                                                resource->reader().mapping_version());
    } else {
      resource->reader().Find(table_keys[t].data(), num_keys, table_rows_[t].data());
    }
  }
  // A tiered table's rows are read from its cache, pinned until the activations are computed.
  for (int t = 0; t < num_tables; ++t) TF_RETURN_IF_ERROR(rows_[t]->Pin(table_rows_[t]));
  return absl::OkStatus();
}

absl::Status DynamicTableSource::Plan(const FusedFeatures& features, bool validate_only, EmbeddingWorkspace* ws) {
  const int n = attrs_.num_features;
  feature_rows_.resize(n);
  for (int f = 0; f < n; ++f) feature_rows_[f].resize(features.batches[f].num_ids);
  Lock(/*exclusive=*/!validate_only);
  for (int t = 0; t < attrs_.num_tables; ++t) {
    const DynamicTable& table = tables_[t]->reader();
    std::vector<LookupMemo::Segment> segments;
    for (int f = 0; f < n; ++f) {
      if (attrs_.config.features[f].table_id != t) continue;
      segments.push_back(
          LookupMemo::Segment{features.batches[f].ids, features.batches[f].num_ids, feature_rows_[f].data()});
    }
    // The step's training lookup found these keys' rows already: probe again only when the keys or the table's
    // mapping differ from that lookup's.
    if (!tables_[t]->lookup_memo().Recall(segments, table.mapping_version())) {
      for (const LookupMemo::Segment& s : segments) table.Find(s.keys, s.num_keys, s.rows);
    }
    // Every row the table gave out is below its row bound, as a static table's ids are below its vocabulary: the
    // plan may de-duplicate through its dense index instead of hashing (the same plan, found with fewer probes).
    BuildPlan(
        ctx_, attrs_, inputs_, features, t, [this](int f) { return feature_rows_[f].data(); }, table.row_bound(), ws);
    TF_RETURN_IF_ERROR(rows_[t]->CheckCapacity(attrs_.config.tables[t].optimization, ws->plans[t]));
  }
  return absl::OkStatus();
}

absl::StatusOr<NonFiniteUpdate> DynamicTableSource::FindNonFinite(int t, float lr, const RowGradientPlan& plan,
                                                                  const ShardFn& shard) {
  return rows_[t]->FindNonFinite(attrs_.config.tables[t].optimization, lr, plan, Rounding(t), shard);
}

std::string DynamicTableSource::RowLabel(int t, int64_t row) const {
  return absl::StrCat("key ", tables_[t]->reader().KeyOf(row), " (row ", row, ")");
}

absl::Status DynamicTableSource::Update(int t, float lr, const RowGradientPlan& plan, const ShardFn& shard) {
  const TableOptimization& o = attrs_.config.tables[t].optimization;
  DynamicTable* table = tables_[t]->table();
  TF_RETURN_IF_ERROR(rows_[t]->Update(o, lr, plan, Rounding(t), shard));  // and its touched-row marks
  // Cannot fail: the step was validated.
  absl::StatusOr<int64_t> evicted = table->EndStep(step_);
  TF_RETURN_IF_ERROR(evicted.status());
  tables_[t]->RecordEvictions(step_, *evicted);
  return absl::OkStatus();
}

RoundingSpec DynamicTableSource::Rounding(int t) const {
  const DynamicTable& table = tables_[t]->reader();
  return RoundingSpec{table.options().rounding, table.options().initializer.seed, step_, t};
}

}  // namespace tf_embed_ops
