#include "cc/lib/dynamic_table.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tf_embed_ops {
namespace {

absl::Status Invalid(const std::string& table, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("dynamic table '", table, "': ", what));
}

int64_t SaturatingAdd(int64_t a, int64_t b, int64_t cap) { return a >= cap - b ? cap : a + b; }

absl::Status ValidatePolicy(const std::string& name, int64_t max_rows, const EvictionOptions& p, const char* what) {
  switch (p.policy) {
    case EvictionPolicy::kNone:
      return absl::OkStatus();
    case EvictionPolicy::kLru:
    case EvictionPolicy::kLfu:
    case EvictionPolicy::kDecayedLfu:
      if (p.target_rows <= 0 || p.target_rows > max_rows) {
        return Invalid(name, absl::StrCat(what, ": LRU/LFU/DecayedLFU target_rows must be in [1, max_rows = ", max_rows,
                                          "], got ", p.target_rows));
      }
      if (p.policy == EvictionPolicy::kDecayedLfu && !(p.decay > 0.0 && p.decay <= 1.0)) {
        return Invalid(name, absl::StrCat(what, ": DecayedLFU decay must be in (0, 1], got ", p.decay));
      }
      return absl::OkStatus();
    case EvictionPolicy::kTtl:
      if (p.ttl_steps <= 0) return Invalid(name, absl::StrCat(what, ": TTL ttl_steps must be > 0, got ", p.ttl_steps));
      return absl::OkStatus();
    case EvictionPolicy::kL2Norm:
      if (!(p.min_norm >= 0.0) || !std::isfinite(p.min_norm)) {
        return Invalid(name, absl::StrCat(what, ": L2Norm min_norm must be finite and >= 0, got ", p.min_norm));
      }
      return absl::OkStatus();
    case EvictionPolicy::kCountAndAge:
      if (p.min_count < 1 || p.min_count > DynamicTable::kMaxCount || p.ttl_steps < 0) {
        return Invalid(name, absl::StrCat(what, ": CountAndAge needs min_count in [1, ", DynamicTable::kMaxCount,
                                          "] and max_age_steps >= 0, got ", p.min_count, " and ", p.ttl_steps));
      }
      return absl::OkStatus();
  }
  return Invalid(name, absl::StrCat(what, ": unknown eviction policy ", static_cast<int>(p.policy)));
}

// L2Norm reads every row's weights, which a table with external rows does not hold.
absl::Status L2NormOfExternalRows(const std::string& name, const char* what) {
  return Invalid(name, absl::StrCat(what, ": L2Norm eviction reads every row's weights, which this table keeps in ",
                                    "a row file (a tiered table): use LRU, LFU, DecayedLFU, TTL or CountAndAge"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<DynamicTable>> DynamicTable::Create(const DynamicTableOptions& o) {
  const std::string& t = o.name;
  if (o.dim <= 0 || o.dim > kMaxDim) {
    return Invalid(t, absl::StrCat("dim must be in [1, ", kMaxDim, "], got ", o.dim));
  }
  const int64_t num_slots = static_cast<int64_t>(o.slot_initial_values.size());
  if (num_slots > kMaxSlots) {
    return Invalid(t, absl::StrCat("at most ", kMaxSlots, " optimizer slots, got ", num_slots));
  }
  for (int64_t s = 0; s < num_slots; ++s) {
    if (!std::isfinite(o.slot_initial_values[s])) {
      return Invalid(t, absl::StrCat("slot ", s, " initial value must be finite, got ", o.slot_initial_values[s]));
    }
  }
  if (!o.slot_widths.empty() && static_cast<int64_t>(o.slot_widths.size()) != num_slots) {
    return Invalid(t, absl::StrCat(o.slot_widths.size(), " slot widths for ", num_slots,
                                   " slot initial values (one of each per optimizer slot)"));
  }
  int64_t slot_floats = 0;
  for (size_t s = 0; s < o.slot_widths.size(); ++s) {
    if (o.slot_widths[s] != 1 && o.slot_widths[s] != o.dim) {
      return Invalid(t, absl::StrCat("slot ", s, " width must be 1 (one value per row) or dim = ", o.dim, ", got ",
                                     o.slot_widths[s]));
    }
    slot_floats += o.slot_widths[s];
  }
  if (o.slot_widths.empty()) slot_floats = num_slots * o.dim;
  if (o.max_rows <= 0 || o.max_rows > KeyIndex::kMaxRows) {
    return Invalid(t, absl::StrCat("max_rows must be in [1, ", KeyIndex::kMaxRows, "], got ", o.max_rows));
  }
  if (o.initial_capacity <= 0 || o.initial_capacity > o.max_rows) {
    return Invalid(
        t, absl::StrCat("initial_capacity must be in [1, max_rows = ", o.max_rows, "], got ", o.initial_capacity));
  }
  if (o.rows_per_chunk <= 0 || o.rows_per_chunk > kMaxRowsPerChunk || (o.rows_per_chunk & (o.rows_per_chunk - 1))) {
    return Invalid(t, absl::StrCat("rows_per_chunk must be a power of two in [1, ", kMaxRowsPerChunk, "], got ",
                                   o.rows_per_chunk));
  }
  // The largest table these options allow must be addressable: max_rows (rounded up to whole chunks) times the
  // floats of a row and its slots, in bytes, within int64.  dim <= 2^20, slots <= 16 and max_rows < 2^31 bound
  // it by 2^56, but the check keeps that true if the limits above ever change.
  const int64_t rows_bound = (o.max_rows + o.rows_per_chunk - 1) / o.rows_per_chunk * o.rows_per_chunk;
  const int64_t floats_per_row = o.dim + slot_floats;
  if (rows_bound > std::numeric_limits<int64_t>::max() / 4 / floats_per_row) {
    return Invalid(t, absl::StrCat("max_rows = ", o.max_rows, " rows of ", floats_per_row,
                                   " floats overflow a 64-bit byte count"));
  }
  if (absl::Status s = o.initializer.Validate(t); !s.ok()) return s;
  const AdmissionOptions& a = o.admission;
  if (a.min_count < 1 || a.min_count > kMaxCount) {
    return Invalid(t, absl::StrCat("admission min_count must be in [1, ", kMaxCount, "], got ", a.min_count));
  }
  if (a.min_count > 1 && a.max_pending_keys <= 0 && a.bloom_num_counters == 0) {
    return Invalid(t, absl::StrCat("admission with min_count = ", a.min_count, " needs max_pending_keys > 0, got ",
                                   a.max_pending_keys));
  }
  if (a.max_pending_keys < 0 || a.pending_ttl_steps < 0) {
    return Invalid(t, absl::StrCat("admission max_pending_keys and pending_ttl_steps must be >= 0, got ",
                                   a.max_pending_keys, " and ", a.pending_ttl_steps));
  }
  if (a.bloom_num_counters < 0 || a.bloom_num_counters > CountingBloomFilter::kMaxCounters) {
    return Invalid(t, absl::StrCat("BloomAdmission num_counters must be in [1, ", CountingBloomFilter::kMaxCounters,
                                   "], got ", a.bloom_num_counters));
  }
  if (a.bloom_num_counters > 0) {
    if (a.bloom_num_hashes < 1 || a.bloom_num_hashes > CountingBloomFilter::kMaxHashes) {
      return Invalid(t, absl::StrCat("BloomAdmission num_hashes must be in [1, ", CountingBloomFilter::kMaxHashes,
                                     "], got ", a.bloom_num_hashes));
    }
    if (!CountingBloomFilter::ValidBits(a.bloom_counter_bits)) {
      return Invalid(t, absl::StrCat("BloomAdmission counter_bits must be 4, 8 or 16, got ", a.bloom_counter_bits));
    }
    if (a.min_count > (int64_t{1} << a.bloom_counter_bits) - 1) {
      return Invalid(
          t, absl::StrCat("BloomAdmission min_count = ", a.min_count, " does not fit counters of ",
                          a.bloom_counter_bits, " bits (at most ", (int64_t{1} << a.bloom_counter_bits) - 1, ")"));
    }
  }
  if (o.eviction_log_capacity < 1 || o.eviction_log_capacity > EvictionLog::kMaxCapacity) {
    return Invalid(t, absl::StrCat("eviction_log_capacity must be in [1, ", EvictionLog::kMaxCapacity, "], got ",
                                   o.eviction_log_capacity));
  }
  int log2_rows = 0;
  while ((int64_t{1} << log2_rows) < o.rows_per_chunk) ++log2_rows;
  if (absl::Status s = ValidatePolicy(t, o.max_rows, o.eviction, "eviction"); !s.ok()) return s;
  if (o.external_rows && o.eviction.policy == EvictionPolicy::kL2Norm) return L2NormOfExternalRows(t, "eviction");
  std::unique_ptr<DynamicTable> table(new DynamicTable(o, log2_rows));
  if (a.bloom_num_counters > 0 && !table->bloom_.Init(a.bloom_num_counters, a.bloom_num_hashes, a.bloom_counter_bits)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("dynamic table '", t, "': cannot allocate ", a.bloom_num_counters, " Bloom admission counters"));
  }
  if (!table->Grow(o.initial_capacity)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("dynamic table '", t, "': cannot allocate initial_capacity = ", o.initial_capacity, " rows"));
  }
  return table;
}

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
  // The probe compares the key stored in the row's metadata: prefetch that record (it may straddle two lines).
  auto prefetch_meta = [this](int64_t row) {
    const char* meta = reinterpret_cast<const char*>(meta_.At(row));
    __builtin_prefetch(meta, 0, 3);
    __builtin_prefetch(meta + sizeof(RowMeta) - 1, 0, 3);
  };
  index_.FindBatch(keys, n, KeyOfFn(), prefetch_meta, rows);
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
      return absl::ResourceExhaustedError(
          absl::StrCat("dynamic table '", name(), "': cannot stage ", misses.size(), " Bloom admission updates"));
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
    return absl::ResourceExhaustedError(
        absl::StrCat("dynamic table '", name(), "': cannot allocate ", admitted, " more rows (size ", size_, ")"));
  }
  try {
    pending_.reserve(pending_.size() + new_pending);
    if (inserted != nullptr) inserted->reserve(inserted->size() + admitted);
  } catch (const std::bad_alloc&) {
    bloom_.Discard();
    return absl::ResourceExhaustedError(
        absl::StrCat("dynamic table '", name(), "': cannot allocate ", new_pending, " pending admission counts"));
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

std::vector<int64_t> DynamicTable::LiveRows() const {
  std::vector<int64_t> rows;
  rows.reserve(size_);
  index_.ForEachRow([&rows](int64_t row) { rows.push_back(row); });
  std::sort(rows.begin(), rows.end());
  return rows;
}

int64_t DynamicTable::EvictRows(const std::vector<int64_t>& rows, int64_t step, LogKind kind) {
  if (tracker_ != nullptr && !rows.empty()) {
    // One record of evictions (eviction_log.h): the tracker reads these entries from the log, from the sequence
    // where this update's begin (docs/tracking.md).
    tracker_->BeginUpdate();
    tracker_->MarkEvictions(log_.next_seq());
  }
  for (const int64_t row : rows) {
    log_.Append(KeyOf(row), step, kind);
    RemoveRow(row);
  }
  counters_.evictions += static_cast<int64_t>(rows.size());
  return static_cast<int64_t>(rows.size());
}

absl::StatusOr<int64_t> DynamicTable::Evict(const EvictionOptions& p, int64_t step) {
  if (absl::Status s = ValidateStep(step, "Evict"); !s.ok()) return s;
  if (absl::Status s = ValidatePolicy(name(), options_.max_rows, p, "Evict"); !s.ok()) return s;
  if (p.policy == EvictionPolicy::kL2Norm && options_.external_rows) return L2NormOfExternalRows(name(), "Evict");
  if (p.policy == EvictionPolicy::kDecayedLfu && !decays()) {
    return Invalid(name(),
                   "Evict: DecayedLFU needs decayed counts, which a table keeps only when DecayedLFU is its "
                   "own eviction policy");
  }
  latest_step_ = std::max(latest_step_, step);
  if (p.policy == EvictionPolicy::kNone) return 0;
  // One sweep over the row arenas in row order (live rows have last_step >= 0): threshold rules pick victims as
  // they go, capacity rules score every row and select afterwards.  Decayed LFU's round runs even under the
  // target, since it is what ages the counts.
  const bool capacity = IsCapacityPolicy(p.policy);
  if (capacity && p.policy != EvictionPolicy::kDecayedLfu && size_ <= p.target_rows) return 0;
  // Capacity rules: a bounded heap when few rows go, else every score into a vector and nth_element.
  const int64_t excess = capacity ? size_ - p.target_rows : 0;
  const bool use_heap = excess > 0 && excess <= size_ / 16;
  std::vector<int64_t> victims;
  std::vector<ScoredRow> scored;
  LowestK lowest(use_heap ? excess : 0);
  if (excess > 0 && !use_heap) scored.reserve(size_);
  auto offer = [&](const ScoredRow& r) {
    if (use_heap) {
      lowest.Offer(r);
    } else if (excess > 0) {
      scored.push_back(r);
    }
  };
  const double min_sq = p.min_norm * p.min_norm;
  std::vector<float> widened;  // a 16-bit row's values, for its norm
  for (int64_t r = 0; r < high_water_; ++r) {
    const RowMeta* meta = meta_.At(r);
    const int64_t last = meta->last_step;
    if (last < 0) continue;  // a free row
    switch (p.policy) {
      case EvictionPolicy::kTtl:
        if (step - last > p.ttl_steps) victims.push_back(r);
        break;
      case EvictionPolicy::kCountAndAge:
        if (static_cast<int64_t>(meta->count) < p.min_count && step - last > p.ttl_steps) victims.push_back(r);
        break;
      case EvictionPolicy::kL2Norm: {
        // Compared as sqrt(sum of squares in double) < min_norm, as the documented reference does.
        const double sq = RowSquaredNorm(r, &widened);
        if (sq < min_sq && std::sqrt(sq) < p.min_norm) victims.push_back(r);
        break;
      }
      case EvictionPolicy::kLru:
        offer(ScoredRow{static_cast<double>(last), last, meta->key, r});
        break;
      case EvictionPolicy::kLfu:
        offer(ScoredRow{static_cast<double>(meta->count), last, meta->key, r});
        break;
      case EvictionPolicy::kDecayedLfu: {
        Decay* d = decay_.At(r);
        const uint32_t count = meta->count;
        d->decayed = static_cast<float>(static_cast<double>(d->decayed) * p.decay + (count - d->seen));
        d->seen = count;
        offer(ScoredRow{d->decayed, last, meta->key, r});
        break;
      }
      case EvictionPolicy::kNone:
        break;
    }
  }
  if (use_heap) {
    victims = lowest.Rows();
  } else if (excess > 0) {
    victims = LowestRows(&scored, excess);
  }
  return EvictRows(victims, step, LogKind::kEvicted);
}

absl::StatusOr<int64_t> DynamicTable::EndStep(int64_t step) {
  if (absl::Status s = ValidateStep(step, "EndStep"); !s.ok()) return s;
  const int64_t ttl = options_.admission.pending_ttl_steps;
  if (ttl > 0) {
    for (auto it = pending_.begin(); it != pending_.end();) {
      it = step - it->second.last_step > ttl ? pending_.erase(it) : std::next(it);
    }
  }
  return Evict(options_.eviction, step);
}

int64_t DynamicTable::EvictKeys(const int64_t* keys, int64_t n) {
  std::vector<int64_t> rows(std::max<int64_t>(n, 0));
  Find(keys, n, rows.data());
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  rows.erase(std::remove(rows.begin(), rows.end(), kNotAdmitted), rows.end());
  return EvictRows(rows, std::max<int64_t>(latest_step_, 0), LogKind::kErased);
}

absl::StatusOr<int64_t> DynamicTable::EvictByScore(const int64_t* keys, const float* scores, int64_t n,
                                                   int64_t target_rows, int64_t step) {
  if (n < 0) return Invalid(name(), absl::StrCat("EvictByScore: negative number of scores ", n));
  if (absl::Status s = ValidateStep(step, "EvictByScore"); !s.ok()) return s;
  if (target_rows < 0 || target_rows > options_.max_rows) {
    return Invalid(name(),
                   absl::StrCat("EvictByScore: max_rows must be in [0, ", options_.max_rows, "], got ", target_rows));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(scores[i])) {
      return Invalid(name(), absl::StrCat("EvictByScore: the score of key ", keys[i], " (position ", i,
                                          ") is not finite: ", scores[i], "; nothing was evicted"));
    }
  }
  std::vector<int64_t> rows(n);
  Find(keys, n, rows.data());
  std::vector<ScoredRow> scored;
  scored.reserve(n);
  std::vector<int64_t> seen_rows;
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] == kNotAdmitted) continue;
    scored.push_back(ScoredRow{scores[i], LastStepOf(rows[i]), keys[i], rows[i]});
    seen_rows.push_back(rows[i]);
  }
  std::sort(seen_rows.begin(), seen_rows.end());
  if (auto d = std::adjacent_find(seen_rows.begin(), seen_rows.end()); d != seen_rows.end()) {
    return Invalid(name(), absl::StrCat("EvictByScore: key ", KeyOf(*d), " has more than one score"));
  }
  latest_step_ = std::max(latest_step_, step);
  return EvictRows(LowestRows(&scored, size_ - target_rows), step, LogKind::kEvicted);
}

// The norm of the row as stored: a 16-bit row is widened exactly to float32 first.
double DynamicTable::RowSquaredNorm(int64_t row, std::vector<float>* scratch) const {
  if (weights_.type() == StorageType::kFloat32) return SquaredNorm(Weights(row), options_.dim);
  scratch->resize(options_.dim);
  weights_.Read(row, scratch->data());
  return SquaredNorm(scratch->data(), options_.dim);
}

DynamicTableRowStats DynamicTable::RowStats() const {
  DynamicTableRowStats st;
  st.keys.reserve(size_);
  st.counts.reserve(size_);
  st.last_steps.reserve(size_);
  if (!options_.external_rows) st.norms.reserve(size_);
  std::vector<float> widened;
  for (int64_t r = 0; r < high_water_; ++r) {
    const RowMeta* meta = meta_.At(r);
    if (meta->last_step < 0) continue;
    st.keys.push_back(meta->key);
    st.counts.push_back(meta->count);
    st.last_steps.push_back(meta->last_step);
    if (!options_.external_rows) st.norms.push_back(static_cast<float>(std::sqrt(RowSquaredNorm(r, &widened))));
  }
  return st;
}

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

  // Allocate for n rows from an empty table: the rows become 0..n-1 (a fresh free list).
  const int64_t old_size = size_, old_high_water = high_water_;
  size_ = high_water_ = 0;
  const bool grown = Grow(n);
  size_ = old_size;
  high_water_ = old_high_water;
  std::unordered_map<int64_t, Pending> pending;
  bool pending_ok = grown;
  if (grown) {
    try {
      pending.reserve(np);
      for (int64_t i = 0; i < np; ++i)
        pending[c.pending_keys[i]] = Pending{c.pending_counts[i], c.pending_last_steps[i]};
    } catch (const std::bad_alloc&) {
      pending_ok = false;
    }
  }
  if (!grown || !pending_ok) {
    return absl::ResourceExhaustedError(
        absl::StrCat("dynamic table '", name(), "': cannot allocate ", n, " rows to import"));
  }
  // Grow() sized the index for n rows (a rehash there re-inserted the old rows, which fit: the old index held
  // fewer than n); now the old content goes.
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
