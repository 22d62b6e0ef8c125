#include "cc/lib/gradient_accumulation.h"

#include <algorithm>
#include <numeric>

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
  buckets_.assign(capacity, -1);
  rows_.clear();
  counts_.clear();
  unique_of_.resize(total);
  int64_t n = 0;
  for (const GradientSource& s : *sources) {
    for (int64_t i = 0; i < s.num_ids; ++i, ++n) {
      const int64_t row = s.ids[i];
      uint64_t h = Slot(row, shift);
      while (buckets_[h] != -1 && rows_[buckets_[h]] != row) h = (h + 1) & (capacity - 1);
      if (buckets_[h] == -1) {
        buckets_[h] = static_cast<int32_t>(rows_.size());
        rows_.push_back(row);
        counts_.push_back(0);
      }
      unique_of_[n] = buckets_[h];
      ++counts_[buckets_[h]];
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

std::vector<int64_t> RowGradientPlan::OrderByRow() const {
  std::vector<int64_t> order(rows_.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [this](int64_t a, int64_t b) { return rows_[a] < rows_[b]; });
  return order;
}

}  // namespace tf_embed_ops
