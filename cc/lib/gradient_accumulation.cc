#include "cc/lib/gradient_accumulation.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "cc/lib/prefetch.h"

namespace tf_embed_ops {
namespace {

// Fibonacci hashing: ids are often small consecutive integers, which this spreads over the table.
inline uint64_t Slot(int64_t row, int shift) { return (static_cast<uint64_t>(row) * 0x9E3779B97F4A7C15ull) >> shift; }

}  // namespace

void RowGradientPlan::Build(const std::vector<GradientSource>* sources) {
  sources_ = sources;
  int64_t total = 0;
  for (const GradientSource& s : *sources) total += s.num_ids;

  // Capacity: a power of two at least twice the number of ids (load factor <= 0.5).
  int bits = 4;
  while ((int64_t{1} << bits) < 2 * total) ++bits;
  const int64_t capacity = int64_t{1} << bits;
  const int shift = 64 - bits;
  // Key and value side by side: one cache line per probe.
  buckets_.assign(capacity, Bucket{-1, 0});
  rows_.clear();
  counts_.clear();
  unique_of_.resize(total);
  int64_t n = 0;
  for (const GradientSource& s : *sources) {
    for (int64_t i = 0; i < s.num_ids; ++i, ++n) {
      const int64_t row = s.ids[i];
      uint64_t h = Slot(row, shift);
      while (buckets_[h].row != -1 && buckets_[h].row != row) h = (h + 1) & (capacity - 1);
      if (buckets_[h].row == -1) {
        buckets_[h] = Bucket{row, static_cast<int64_t>(rows_.size())};
        rows_.push_back(row);
        counts_.push_back(0);
      }
      unique_of_[n] = buckets_[h].unique;
      ++counts_[buckets_[h].unique];
    }
  }

  // Stable counting sort of the contributions by unique row: enumeration order is (source, position).
  offsets_.assign(rows_.size() + 1, 0);
  for (size_t u = 0; u < rows_.size(); ++u) offsets_[u + 1] = offsets_[u] + counts_[u];
  entries_.resize(total);
  cursor_.assign(offsets_.begin(), offsets_.end() - 1);
  n = 0;
  for (size_t f = 0; f < sources->size(); ++f) {
    for (int64_t i = 0; i < (*sources)[f].num_ids; ++i, ++n) {
      entries_[cursor_[unique_of_[n]]++] = Entry{static_cast<int32_t>(f), i};
    }
  }
}

void RowGradientPlan::Accumulate(int64_t u, int64_t dim, float* g) const {
  std::memset(g, 0, sizeof(float) * dim);
  for (int64_t k = offsets_[u]; k < offsets_[u + 1]; ++k) {
    if (k + kPrefetchDistance < static_cast<int64_t>(entries_.size())) {
      // Next rows' gradients: entries are contiguous across unique rows, so this also covers row u + 1.
      const Entry& ahead = entries_[k + kPrefetchDistance];
      const GradientSource& a = (*sources_)[ahead.source];
      PrefetchRow<false>(a.gradient + a.layout->sample_of[ahead.position] * dim, dim);
    }
    const GradientSource& s = (*sources_)[entries_[k].source];
    const int64_t i = entries_[k].position;
    const float c = s.layout->scale[i];
    const float* dact = s.gradient + s.layout->sample_of[i] * dim;
    for (int64_t d = 0; d < dim; ++d) g[d] += c * dact[d];
  }
}

std::vector<int64_t> RowGradientPlan::OrderByRow() const {
  std::vector<int64_t> order(rows_.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [this](int64_t a, int64_t b) { return rows_[a] < rows_[b]; });
  return order;
}

}  // namespace tf_embed_ops
