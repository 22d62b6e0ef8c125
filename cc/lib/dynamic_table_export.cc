// DynamicTable's checkpoint side: Export / Import of the rows and pending counts, and of the policies' state
// (Bloom counters, decayed counts).  Import validates the whole checkpoint before it replaces anything.
#include <algorithm>
#include <cmath>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/lib/dynamic_table.h"
#include "cc/lib/dynamic_table_errors.h"

namespace tf_embed_ops {

using dynamic_table_internal::Exhausted;
using dynamic_table_internal::Invalid;

DynamicTablePolicyState DynamicTable::ExportPolicyState() const {
  DynamicTablePolicyState state;
  state.bloom_counters = bloom_.bytes();
  if (decays()) {
    std::vector<int64_t> rows = LiveRows();
    std::sort(rows.begin(), rows.end(), [this](int64_t x, int64_t y) { return KeyOf(x) < KeyOf(y); });
    for (const int64_t r : rows) {
      state.decayed_keys.push_back(KeyOf(r));
      state.decayed_counts.push_back(decay_.At(r)->decayed);
    }
  }
  return state;
}

absl::Status DynamicTable::ImportPolicyState(const std::vector<uint8_t>& bloom_counters, int64_t num_parts,
                                             const std::vector<int64_t>& decayed_keys,
                                             const std::vector<float>& decayed_counts) {
  const int64_t part = static_cast<int64_t>(bloom_.bytes().size());
  const int64_t got = static_cast<int64_t>(bloom_counters.size());
  if (bloom_.enabled() ? (num_parts < 1 || got != num_parts * part) : got != 0) {
    return Invalid(name(), absl::StrCat("ImportPolicyState: the checkpoint has ", got, " bytes of Bloom counters in ",
                                        num_parts, " part(s), the table's filter takes ", part,
                                        " bytes per part (num_counters and counter_bits must match)"));
  }
  if (decayed_keys.size() != decayed_counts.size()) {
    return Invalid(name(), absl::StrCat("ImportPolicyState: ", decayed_keys.size(), " decayed keys and ",
                                        decayed_counts.size(), " decayed counts"));
  }
  if (!decayed_keys.empty() && !decays()) {
    return Invalid(name(),
                   "ImportPolicyState: the checkpoint has decayed counts but the table's eviction is not "
                   "DecayedLFU");
  }
  for (size_t i = 0; i < decayed_counts.size(); ++i) {
    if (!std::isfinite(decayed_counts[i]) || decayed_counts[i] < 0) {
      return Invalid(name(), absl::StrCat("ImportPolicyState: key ", decayed_keys[i], " has decayed count ",
                                          decayed_counts[i], " (must be finite and >= 0)"));
    }
  }
  if (bloom_.enabled()) {
    std::vector<uint8_t>& bytes = *bloom_.mutable_bytes();
    std::copy_n(bloom_counters.data(), part, bytes.data());
    for (int64_t k = 1; k < num_parts; ++k) bloom_.AddSaturating(bloom_counters.data() + k * part);
  }
  std::vector<int64_t> rows(decayed_keys.size());
  Find(decayed_keys.data(), static_cast<int64_t>(decayed_keys.size()), rows.data());
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] != kNotAdmitted) decay_.At(rows[i])->decayed = decayed_counts[i];
  }
  return absl::OkStatus();
}

DynamicTableContents DynamicTable::Export() const {
  DynamicTableContents c = ExportRows(LiveRows());
  ExportPending(&c);
  return c;
}

DynamicTableContents DynamicTable::ExportRows(std::vector<int64_t> rows) const {
  std::sort(rows.begin(), rows.end(), [this](int64_t x, int64_t y) { return KeyOf(x) < KeyOf(y); });
  const int64_t n = static_cast<int64_t>(rows.size());
  const int64_t dim = options_.dim;
  DynamicTableContents c;
  c.dim = dim;
  c.keys.resize(n);
  c.counts.resize(n);
  c.last_steps.resize(n);
  const bool rows_here = !options_.external_rows;
  c.weights.resize(rows_here ? n * dim : 0);
  for (const StoredRowArena& s : slots_) {
    c.slot_widths.push_back(s.width());
    c.slots.emplace_back(rows_here ? n * s.width() : 0);
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = rows[i];
    c.keys[i] = KeyOf(r);
    c.counts[i] = CountOf(r);
    c.last_steps[i] = LastStepOf(r);
    if (!rows_here) continue;
    weights_.Read(r, c.weights.data() + i * dim);  // 16-bit rows widen exactly
    for (size_t s = 0; s < slots_.size(); ++s) slots_[s].Read(r, c.slots[s].data() + i * slot_width(s));
  }
  return c;
}

void DynamicTable::ExportPending(DynamicTableContents* c) const {
  std::vector<std::pair<int64_t, Pending>> pending(pending_.begin(), pending_.end());
  std::sort(pending.begin(), pending.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  for (const auto& [key, p] : pending) {
    c->pending_keys.push_back(key);
    c->pending_counts.push_back(p.count);
    c->pending_last_steps.push_back(p.last_step);
  }
}

// An import's own arenas and index, n rows each (Import); `ok` false when an allocation failed.
struct DynamicTable::FreshStorage {
  FreshStorage(const DynamicTable& t, int64_t n)
      : log2_rows(__builtin_ctzll(static_cast<uint64_t>(t.meta_.rows_per_chunk()))),
        weights(t.weights_.type(), t.dim(), log2_rows),
        meta(1, log2_rows),
        decay(1, log2_rows) {
    slots.reserve(t.slots_.size());
    for (const StoredRowArena& s : t.slots_) slots.emplace_back(s.type(), s.width(), log2_rows);
    ok = meta.Reserve(n) && (!t.decays() || decay.Reserve(n)) &&
         index.Rehash(std::max(n, t.options_.initial_capacity), t.KeyOfFn());  // (empty: reads no key)
    if (!t.options_.external_rows) {
      ok = ok && weights.Reserve(n);
      for (StoredRowArena& s : slots) ok = ok && s.Reserve(n);
    }
  }
  // Exchanges these with the table's: the old ones go with this object.
  void SwapInto(DynamicTable* t) {
    std::swap(t->weights_, weights);
    std::swap(t->slots_, slots);
    std::swap(t->meta_, meta);
    std::swap(t->decay_, decay);
    std::swap(t->index_, index);
  }

  int log2_rows;
  StoredRowArena weights;
  std::vector<StoredRowArena> slots;
  ChunkedArena<RowMeta> meta;
  ChunkedArena<Decay> decay;
  KeyIndex index;
  bool ok = false;
};

absl::Status DynamicTable::Import(const DynamicTableContents& c) {
  const int64_t dim = options_.dim;
  if (c.dim != dim) {
    return Invalid(name(), absl::StrCat("Import: the checkpoint has dim ", c.dim, ", the table has dim ", dim));
  }
  if (c.slots.size() != slots_.size()) {
    return Invalid(name(), absl::StrCat("Import: the checkpoint has ", c.slots.size(), " slots, the table's optimizer ",
                                        slots_.size()));
  }
  if (c.slot_widths.size() != c.slots.size()) {
    return Invalid(name(),
                   absl::StrCat("Import: ", c.slot_widths.size(), " slot widths for ", c.slots.size(), " slots"));
  }
  for (size_t s = 0; s < slots_.size(); ++s) {
    if (c.slot_widths[s] != slot_width(s)) {
      return Invalid(name(), absl::StrCat("Import: slot ", s, " of the checkpoint has ", c.slot_widths[s],
                                          " values per row, the table's optimizer keeps ", slot_width(s),
                                          " (1: one value per row, ", dim, ": one per column)"));
    }
  }
  const int64_t n = static_cast<int64_t>(c.keys.size());
  if (n > options_.max_rows) {
    return Invalid(name(), absl::StrCat("Import: ", n, " rows do not fit max_rows = ", options_.max_rows));
  }
  auto check_size = [&](const char* what, size_t got, int64_t want) {
    return static_cast<int64_t>(got) == want
               ? absl::OkStatus()
               : Invalid(name(), absl::StrCat("Import: ", what, " has ", got, " values, expected ", want));
  };
  // A table with external rows stores no row values (the caller writes them to its records): it takes them
  // (checked, then left to the caller) or none.
  const int64_t rows_n = options_.external_rows && c.weights.empty() ? 0 : n;
  for (absl::Status s : {check_size("weights", c.weights.size(), rows_n * dim),
                         check_size("counts", c.counts.size(), n), check_size("last_steps", c.last_steps.size(), n)}) {
    if (!s.ok()) return s;
  }
  for (size_t s = 0; s < c.slots.size(); ++s) {
    if (absl::Status st = check_size("a slot", c.slots[s].size(), rows_n * slot_width(s)); !st.ok()) return st;
  }
  const int64_t np = static_cast<int64_t>(c.pending_keys.size());
  for (absl::Status s : {check_size("pending_counts", c.pending_counts.size(), np),
                         check_size("pending_last_steps", c.pending_last_steps.size(), np)}) {
    if (!s.ok()) return s;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (c.counts[i] < 0 || c.counts[i] > kMaxCount || c.last_steps[i] < 0) {
      return Invalid(
          name(), absl::StrCat("Import: row ", i, " (key ", c.keys[i], ") has count ", c.counts[i], " and last step ",
                               c.last_steps[i], "; counts must be in [0, ", kMaxCount, "] and steps >= 0"));
    }
  }
  for (int64_t i = 0; i < np; ++i) {
    if (c.pending_counts[i] < 1 || c.pending_counts[i] > kMaxCount || c.pending_last_steps[i] < 0) {
      return Invalid(name(), absl::StrCat("Import: pending key ", c.pending_keys[i], " has count ", c.pending_counts[i],
                                          " and last step ", c.pending_last_steps[i]));
    }
  }
  std::vector<int64_t> sorted = c.keys;
  std::sort(sorted.begin(), sorted.end());
  if (auto d = std::adjacent_find(sorted.begin(), sorted.end()); d != sorted.end()) {
    return Invalid(name(), absl::StrCat("Import: key ", *d, " appears more than once"));
  }
  std::vector<int64_t> sorted_pending = c.pending_keys;
  std::sort(sorted_pending.begin(), sorted_pending.end());
  if (auto d = std::adjacent_find(sorted_pending.begin(), sorted_pending.end()); d != sorted_pending.end()) {
    return Invalid(name(), absl::StrCat("Import: pending key ", *d, " appears more than once"));
  }
  for (const int64_t key : sorted_pending) {
    if (std::binary_search(sorted.begin(), sorted.end(), key)) {
      return Invalid(name(), absl::StrCat("Import: key ", key, " is both a row and a pending key"));
    }
  }

  // Allocate for n rows from an empty table: the rows become 0..n-1 (a fresh free list).  Past the table's
  // capacity, the import gets fresh arenas and index of n rows (one slab each: every row direct, as in a table
  // created with that capacity, dynamic_table_arena.h), which replace the old ones once everything is allocated;
  // within it, the table's own are reused.
  bool allocated = true;
  std::optional<FreshStorage> fresh;
  if (n > capacity()) {
    try {
      fresh.emplace(*this, n);
    } catch (const std::bad_alloc&) {
    }
    allocated = fresh.has_value() && fresh->ok && (tracker_ == nullptr || tracker_->Reserve(n));
  } else {
    const int64_t old_size = size_, old_high_water = high_water_;
    size_ = high_water_ = 0;
    allocated = Grow(n);  // (a rehash re-inserts the old rows, which fit: the old index held fewer than n)
    size_ = old_size;
    high_water_ = old_high_water;
  }
  std::unordered_map<int64_t, Pending> pending;
  if (allocated) {
    try {
      pending.reserve(np);
      for (int64_t i = 0; i < np; ++i)
        pending[c.pending_keys[i]] = Pending{c.pending_counts[i], c.pending_last_steps[i]};
    } catch (const std::bad_alloc&) {
      allocated = false;
    }
  }
  if (!allocated) {
    return Exhausted(name(), absl::StrCat("cannot allocate ", n, " rows to import"));
  }
  // Now the old content goes (with the old arenas, when fresh ones replace them).
  if (fresh.has_value()) fresh->SwapInto(this);
  index_.Clear();
  ++mapping_version_;  // an import of no rows allocates none, but its keys lost their rows all the same
  size_ = high_water_ = 0;
  free_head_ = -1;
  pending_.swap(pending);
  counters_ = DynamicTableCounters{};
  log_.Restart();  // every reader's cursor is stale: the content was replaced
  if (bloom_.enabled()) std::fill(bloom_.mutable_bytes()->begin(), bloom_.mutable_bytes()->end(), 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = AllocateRow();
    RowMeta* meta = meta_.At(row);
    meta->key = c.keys[i];
    meta->count = static_cast<uint32_t>(c.counts[i]);
    meta->last_step = c.last_steps[i];
    if (!options_.external_rows) {
      weights_.Write(row, c.weights.data() + i * dim);  // 16-bit: rounded to nearest (exact for 16-bit values)
      for (size_t s = 0; s < slots_.size(); ++s) slots_[s].Write(row, c.slots[s].data() + i * slot_width(s));
    }
    if (decays()) *decay_.At(row) = Decay{static_cast<float>(c.counts[i]), static_cast<uint32_t>(c.counts[i])};
    index_.Insert(c.keys[i], row);
    ++size_;
  }
  if (tracker_ != nullptr) {
    // A restore: every consumer of the tracker takes the whole table next time.
    tracker_->BeginUpdate();
    tracker_->MarkAll();
  }
  return absl::OkStatus();
}
}  // namespace tf_embed_ops
