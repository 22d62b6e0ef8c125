// DynamicTable's eviction: by policy at the end of a step, by key, by the caller's scores; and the per-row
// statistics a policy reads (dynamic_table.h).
#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/lib/dynamic_table.h"
#include "cc/lib/dynamic_table_errors.h"

namespace tf_embed_ops {

using dynamic_table_internal::Invalid;
using dynamic_table_internal::L2NormOfExternalRows;
using dynamic_table_internal::ValidatePolicy;

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

}  // namespace tf_embed_ops
