#include "cc/kernels/tiered_table_source.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "cc/kernels/dynamic_table_kernel_util.h"
#include "cc/kernels/tiered_table_kernel_util.h"
#include "cc/kernels/touched_rows_resource.h"
#include "cc/lib/optimizers/registry.h"

namespace tf_embed_ops {

absl::Status TieredTableSource::ReadAttrs(tensorflow::OpKernelConstruction* ctx, const FusedEmbeddingAttrs& attrs,
                                          const FusedInputs&, bool update, Attrs* out) {
  if (!update) return absl::OkStatus();
  return ReadRoundingAttrs(ctx, attrs.config, &out->rounding);
}

TieredTableSource::~TieredTableSource() {
  for (size_t t = 0; t < tables_.size(); ++t) tables_[t]->cache()->Release(&pins_[t], /*dirty=*/false);
}

absl::Status TieredTableSource::Open(bool update) {
  distinct_.resize(attrs_.num_tables);
  TF_RETURN_IF_ERROR(LookupTieredConfigTables(ctx_, inputs_.table(0), attrs_.config, /*check_slots=*/update, &tables_));
  if (update) TF_RETURN_IF_ERROR(ReadStep(ctx_->input(inputs_.step()), &step_));
  return absl::OkStatus();
}

absl::Status TieredTableSource::FindDistinct(const FusedFeatures& features, int t, const std::string& what) {
  TieredRowCache* cache = tables_[t]->cache();
  // In the lookup's order, so that the batch's distinct rows are usually remembered (a prefetch may have found
  // them already).
  distinct_[t] = cache->DistinctRows(TableIds(attrs_, features, t));
  const int64_t needed = static_cast<int64_t>(distinct_[t]->rows.size());
  if (needed > cache->capacity()) return cache->TooManyRows(needed, what);
  return absl::OkStatus();
}

absl::Status TieredTableSource::PinDistinct() {
  for (int t = 0; t < attrs_.num_tables; ++t) {
    if (Lazy(t)) TF_RETURN_IF_ERROR(tables_[t]->cache()->Acquire(distinct_[t]->rows, &pins_[t]));
  }
  return absl::OkStatus();
}

absl::Status TieredTableSource::PrepareLookup(const FusedFeatures& features) {
  first_id_ = FirstIdInTable(attrs_, features);
  for (int t = 0; t < attrs_.num_tables; ++t) {
    TF_RETURN_IF_ERROR(
        FindDistinct(features, t, absl::StrCat("the lookup of table '", attrs_.config.tables[t].name, "'")));
  }
  return absl::OkStatus();
}

absl::Status TieredTableSource::ReadRows(const FusedFeatures&) {
  locks_.emplace(tables_, /*exclusive=*/false);
  TF_RETURN_IF_ERROR(PinDistinct());
  for (int t = 0; t < attrs_.num_tables; ++t) {
    storages_.push_back(
        std::make_unique<TieredRowStorage>(TieredRowStorage::ByPosition(tables_[t]->cache()->layout(), pins_[t])));
  }
  return absl::OkStatus();
}

absl::Status TieredTableSource::Plan(const FusedFeatures& features, bool, EmbeddingWorkspace* ws) {
  first_id_ = FirstIdInTable(attrs_, features);
  for (int t = 0; t < attrs_.num_tables; ++t) {
    const bool lazy = !OptimizerUpdatesAllRows(attrs_.config.tables[t].optimization.optimizer);
    if (lazy) TF_RETURN_IF_ERROR(FindDistinct(features, t, What(t)));
    // A lazy table's plan is over positions in [0, its distinct rows); the other tables' over their rows.
    const int64_t* positions = lazy ? distinct_[t]->positions.data() : nullptr;
    BuildPlan(
        ctx_, attrs_, inputs_, features, t,
        [&](int f) { return lazy ? positions + first_id_[f] : features.batches[f].ids; },
        lazy ? static_cast<int64_t>(distinct_[t]->rows.size()) : attrs_.config.tables[t].vocabulary_size, ws);
  }
  return absl::OkStatus();
}

absl::Status TieredTableSource::Pin(bool validate_only) {
  locks_.emplace(tables_, /*exclusive=*/!validate_only);
  return PinDistinct();
}

absl::StatusOr<NonFiniteUpdate> TieredTableSource::FindNonFinite(int t, float lr, const RowGradientPlan& plan,
                                                                 const ShardFn& shard) {
  const TableOptimization& o = attrs_.config.tables[t].optimization;
  if (Lazy(t)) return FindNonFinitePinnedPositions(o, lr, plan, tables_[t]->layout(), pins_[t], Rounding(t), shard);
  return FindNonFiniteTieredUpdate(o, lr, plan, tables_[t]->cache(), Rounding(t), shard, What(t));
}

std::vector<int> TieredTableSource::UpdateOrder() const {
  // The lazy tables' walks over their pinned rows first, then the window-by-window walks (which may fail on I/O
  // part-way).
  std::vector<int> order;
  for (int t = 0; t < attrs_.num_tables; ++t) {
    if (Lazy(t)) order.push_back(t);
  }
  for (int t = 0; t < attrs_.num_tables; ++t) {
    if (!Lazy(t)) order.push_back(t);
  }
  return order;
}

absl::Status TieredTableSource::Update(int t, float lr, const RowGradientPlan& plan, const ShardFn& shard) {
  const TableOptimization& o = attrs_.config.tables[t].optimization;
  if (Lazy(t)) {
    UpdatePinnedPositions(o, lr, plan, tables_[t]->layout(), pins_[t], Rounding(t), shard);
    tables_[t]->cache()->Release(&pins_[t], /*dirty=*/true);
    // Touched-row tracking (docs/tracking.md): the rows written, still under the tables' exclusive locks.
    MarkTouchedRowList(tables_[t].get(), distinct_[t]->rows);
    return absl::OkStatus();
  }
  // Marked whole even when a window failed: the windows before it were written.
  const absl::Status s = UpdateTieredTable(o, lr, plan, tables_[t]->cache(), Rounding(t), shard, What(t));
  MarkTouchedRows(tables_[t].get(), plan, /*all_rows=*/true);
  return s;
}

std::string TieredTableSource::What(int t) const {
  return absl::StrCat("the update of table '", attrs_.config.tables[t].name, "'");
}

RoundingSpec TieredTableSource::Rounding(int t) const {
  RoundingSpec spec = source_attrs_.rounding[t];
  spec.step = step_;
  return spec;
}

}  // namespace tf_embed_ops
