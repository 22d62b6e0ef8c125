// DynamicTable's core (dynamic_table.h): row allocation and the training lookup FindOrInsert with its
// admission.  Creation is in dynamic_table_options.cc, eviction in dynamic_table_eviction.cc, checkpoints in
// dynamic_table_export.cc.
#include "cc/lib/dynamic_table.h"

#include <algorithm>
#include <cmath>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cc/lib/dynamic_table_errors.h"

namespace tf_embed_ops {
namespace {

int64_t SaturatingAdd(int64_t a, int64_t b, int64_t cap) { return a >= cap - b ? cap : a + b; }

}  // namespace

using dynamic_table_internal::Exhausted;
using dynamic_table_internal::Invalid;

DynamicTable::DynamicTable(const DynamicTableOptions& options, int log2_rows_per_chunk)
    : options_(options),
      weights_(options.storage, options.dim, log2_rows_per_chunk),
      init_scratch_(options.storage == StorageType::kFloat32 ? 0 : options.dim),
      meta_(1, log2_rows_per_chunk),
      decay_(1, log2_rows_per_chunk),
      log_(options.eviction_log_capacity) {
  slots_.reserve(options.slot_initial_values.size());
  for (size_t s = 0; s < options.slot_initial_values.size(); ++s) {
    const int64_t width = options.slot_widths.empty() ? options.dim : options.slot_widths[s];
    slots_.emplace_back(options.slot_storage, width, log2_rows_per_chunk);
  }
}

absl::Status DynamicTable::ValidateStep(int64_t step, const char* what) const {
  if (step < 0) return Invalid(name(), absl::StrCat(what, ": step must be >= 0, got ", step));
  return absl::OkStatus();
}

bool DynamicTable::Grow(int64_t extra) {
  // New rows come from the free list first, then from [high_water_, ...).
  const int64_t num_free = high_water_ - size_;
  const int64_t rows = high_water_ + std::max<int64_t>(0, extra - num_free);
  if (!meta_.Reserve(rows)) return false;
  if (!options_.external_rows) {
    if (!weights_.Reserve(rows)) return false;
    for (StoredRowArena& s : slots_) {
      if (!s.Reserve(rows)) return false;
    }
  }
  if (decays() && !decay_.Reserve(rows)) return false;
  if (tracker_ != nullptr && !tracker_->Reserve(rows)) return false;
  if (!index_.Fits(size_ + extra) || index_.num_buckets() == 0) {
    return index_.Rehash(std::max(size_ + extra, options_.initial_capacity), KeyOfFn());
  }
  return true;
}

int64_t DynamicTable::AllocateRow() {
  ++mapping_version_;
  if (free_head_ >= 0) {
    const int64_t row = free_head_;
    free_head_ = meta_.At(row)->key;
    return row;
  }
  return high_water_++;
}

void DynamicTable::InitRow(int64_t row, int64_t key, int64_t count, int64_t step) {
  RowMeta* meta = meta_.At(row);
  meta->key = key;
  meta->count = static_cast<uint32_t>(std::min(count, kMaxCount));
  meta->last_step = step;
  if (options_.external_rows) {
    // The caller writes the row (FindOrInsert reports it).
  } else if (weights_.type() == StorageType::kFloat32) {
    options_.initializer.FillRow(key, Weights(row), options_.dim);
  } else {  // initialised in float32, then rounded to nearest (as a 16-bit static table's variable)
    options_.initializer.FillRow(key, init_scratch_.data(), options_.dim);
    weights_.Write(row, init_scratch_.data());
  }
  if (!options_.external_rows) {
    for (size_t s = 0; s < slots_.size(); ++s) slots_[s].Fill(row, options_.slot_initial_values[s]);
  }
  if (decays()) *decay_.At(row) = Decay{0.0f, 0};  // the first round adds the whole count
  index_.Insert(key, row);
  ++size_;
}

void DynamicTable::RemoveRow(int64_t row) {
  ++mapping_version_;
  index_.Erase(KeyOf(row), KeyOfFn());
  RowMeta* meta = meta_.At(row);
  meta->key = free_head_;
  meta->last_step = -1;
  meta->count = 0;
  free_head_ = row;
  --size_;
}

void DynamicTable::Find(const int64_t* keys, int64_t n, int64_t* rows) const {
  index_.FindBatch(keys, n, KeyOfFn(), rows);
}

absl::Status DynamicTable::FindOrInsert(const int64_t* keys, int64_t n, int64_t step, int64_t* rows, BatchStats* stats,
                                        std::vector<int64_t>* inserted) {
  if (n < 0) return Invalid(name(), absl::StrCat("FindOrInsert: negative batch size ", n));
  if (absl::Status s = ValidateStep(step, "FindOrInsert"); !s.ok()) return s;
  BatchStats local;
  BatchStats& st = stats != nullptr ? *stats : local;
  st = BatchStats{};

  // 1. Existing keys (reads only); misses grouped per distinct key in first-occurrence order.
  Find(keys, n, rows);
  enum class Decision { kAdmit, kPending, kDrop };
  struct Miss {
    int64_t key;
    int64_t count;  // occurrences in this batch, then the total with the pending count
    Decision decision;
    int64_t row;
  };
  std::vector<Miss> misses;
  std::unordered_map<int64_t, int64_t> miss_of;  // key -> index in misses
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] != kNotAdmitted) continue;
    auto [it, inserted] = miss_of.emplace(keys[i], static_cast<int64_t>(misses.size()));
    if (inserted) {
      misses.push_back(Miss{keys[i], 1, Decision::kDrop, kNotAdmitted});
    } else {
      ++misses[it->second].count;
    }
  }

  // 2. Admission decisions, on each key's count after the whole batch.  Nothing is written yet.
  const AdmissionOptions& a = options_.admission;
  const bool bloom = bloom_.enabled();
  const bool counting = a.min_count > 1 && !bloom;
  int64_t admitted = 0;
  int64_t new_pending = 0;  // pending entries this batch creates
  if (bloom) {
    try {
      for (const Miss& m : misses) bloom_.Stage(m.key, m.count);
    } catch (const std::bad_alloc&) {
      bloom_.Discard();
      return Exhausted(name(), absl::StrCat("cannot stage ", misses.size(), " Bloom admission updates"));
    }
  }
  for (Miss& m : misses) {
    if (bloom) {
      // The key's estimate after the whole batch (the counters are written only once the rows are allocated).
      m.count = bloom_.EstimateStaged(m.key);
      const bool reached = m.count >= a.min_count;
      if (reached && size_ + admitted < options_.max_rows) {
        m.decision = Decision::kAdmit;
        ++admitted;
      } else if (reached) {
        ++st.refused_full;
      } else {
        ++st.below_admission;
      }
      continue;
    }
    bool has_entry = false;
    if (counting) {
      auto it = pending_.find(m.key);
      if (it != pending_.end()) {
        has_entry = true;
        m.count = SaturatingAdd(it->second.count, m.count, kMaxCount);
      }
    }
    // A key that must wait keeps (or takes) a pending entry if there is room; entries that admitted keys free
    // are reused from the next batch on, so the decision does not depend on the order of the batch.
    const bool can_count = counting && (has_entry || num_pending() + new_pending < a.max_pending_keys);
    if (m.count >= a.min_count && size_ + admitted < options_.max_rows) {
      m.decision = Decision::kAdmit;
      ++admitted;
      continue;
    }
    if (m.count >= a.min_count) {
      ++st.refused_full;  // its count is kept (when it can be) so it is admitted once there is room
    } else if (can_count) {
      ++st.below_admission;
    } else {
      ++st.untracked;  // no counter for it: these sightings are lost (the documented bound)
    }
    if (can_count) {
      m.decision = Decision::kPending;
      if (!has_entry) ++new_pending;
    }
  }

  // 3. Allocation, before any write.
  if (!Grow(admitted)) {
    bloom_.Discard();
    return Exhausted(name(), absl::StrCat("cannot allocate ", admitted, " more rows (size ", size_, ")"));
  }
  try {
    pending_.reserve(pending_.size() + new_pending);
    if (inserted != nullptr) inserted->reserve(inserted->size() + admitted);
  } catch (const std::bad_alloc&) {
    bloom_.Discard();
    return Exhausted(name(), absl::StrCat("cannot allocate ", new_pending, " pending admission counts"));
  }

  // 4. Writes: the Bloom counters, new rows, pending counts, existing rows' metadata, and the output rows of new
  // keys; refused keys go to the log when the admission asks for it.
  if (bloom) bloom_.Commit();
  for (Miss& m : misses) {
    if (m.decision != Decision::kAdmit && a.log_refused) log_.Append(m.key, step, LogKind::kRefused);
    if (m.decision == Decision::kAdmit) {
      m.row = AllocateRow();
      InitRow(m.row, m.key, m.count, step);
      if (inserted != nullptr) inserted->push_back(m.row);
      if (counting) pending_.erase(m.key);
    } else if (m.decision == Decision::kPending) {
      Pending& p = pending_.try_emplace(m.key, Pending{0, step}).first->second;
      p.count = m.count;
      p.last_step = std::max(p.last_step, step);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] != kNotAdmitted) {
      RowMeta* meta = meta_.At(rows[i]);
      if (meta->count < kMaxCount) meta->count = meta->count + 1;
      if (meta->last_step < step) meta->last_step = step;
    } else {
      rows[i] = misses[miss_of.find(keys[i])->second].row;
    }
  }
  if (tracker_ != nullptr) {
    // Found rows changed their count and last step, new rows appeared: one store per id.
    tracker_->BeginUpdate();
    tracker_->MarkRows(rows, n);
  }
  st.inserts = admitted;
  counters_.inserts += st.inserts;
  counters_.below_admission += st.below_admission;
  counters_.untracked += st.untracked;
  counters_.refused_full += st.refused_full;
  latest_step_ = std::max(latest_step_, step);
  return absl::OkStatus();
}

bool DynamicTable::DenseFloat32Rows() const {
  if (options_.external_rows || high_water_ == 0) return false;
  if (weights_.type() != StorageType::kFloat32 || weights_.direct_rows() < high_water_) return false;
  for (const StoredRowArena& s : slots_) {
    if (s.type() != StorageType::kFloat32 || s.direct_rows() < high_water_) return false;
  }
  return true;
}

bool DynamicTable::EnableTracking() {
  if (tracker_ != nullptr) return true;
  std::unique_ptr<TouchedRows> tracker;
  try {
    tracker = std::make_unique<TouchedRows>(capacity());
  } catch (const std::bad_alloc&) {
    return false;
  }
  if (!tracker->ok()) return false;
  tracker->AttachEvictionLog(&log_);
  tracker_ = std::move(tracker);
  return true;
}

int64_t DynamicTable::MemoryBytes() const {
  int64_t bytes = weights_.MemoryBytes() + meta_.MemoryBytes() + index_.MemoryBytes();
  for (const StoredRowArena& s : slots_) bytes += s.MemoryBytes();
  if (tracker_ != nullptr) bytes += tracker_->MemoryBytes();
  return bytes + PendingBytes() + bloom_.MemoryBytes() + decay_.MemoryBytes() + log_.MemoryBytes();
}

int64_t DynamicTable::PendingBytes() const {
  // The hash map's bucket array, and per entry its node: the next pointer and the (key, count, last step) pair.
  // The allocator's own per-node header is not included (it depends on the allocator).
  constexpr int64_t kNodeBytes = sizeof(void*) + sizeof(std::pair<const int64_t, Pending>);
  return static_cast<int64_t>(pending_.bucket_count() * sizeof(void*)) + num_pending() * kNodeBytes;
}

}  // namespace tf_embed_ops
