#include "cc/lib/gradient_accumulation.h"

#include <algorithm>
#include <numeric>

#include "cc/lib/vector_isa.h"

namespace tf_embed_ops {
namespace {

// Fibonacci hashing: ids are often small consecutive integers, which this spreads over the table.
inline uint64_t Slot(int64_t row, int shift) { return (static_cast<uint64_t>(row) * 0x9E3779B97F4A7C15ull) >> shift; }

// How many ids ahead the index passes fetch their entry's cache line.  An id's entry (dense array or hash bucket)
// is a random line of an index far larger than L2 (4 MiB for a 1M-row vocabulary), and each id's load, compare
// and store wait on it; the entry of an id this far ahead is requested first, so the misses overlap.  A hint:
// the plan is the same with or without it.
constexpr int64_t kIndexPrefetchDistance = 4 * kPrefetchDistance;

// One source's fields, read once per source rather than once per id: the index passes store to int arrays and
// sums, and the compiler cannot keep these in registers across those stores.
struct SourceView {
  explicit SourceView(const GradientSource& s)
      : ids(s.ids),
        num_ids(s.num_ids),
        scale(s.layout->ScaleOrNull()),
        sample_of(s.layout->one_id_per_sample ? nullptr : s.layout->sample_of.data()),
        gradient(s.gradient) {}
  const int64_t* ids;
  int64_t num_ids;
  const float* scale;        // null: every factor is 1
  const int64_t* sample_of;  // null: id i is sample i
  const float* gradient;
};

// Adds id i's contribution to its row's sum `acc`, which starts from zero at the row's first contribution:
// Accumulate's expression in Accumulate's order, so a summed row is bitwise the gathered one.  (0.0f + x is
// not folded to x: it turns -0.0 into +0.0, as the gathered sum's zeroed start does.)
inline void AddContribution(const SourceView& s, int64_t i, int64_t dim, bool first, float* acc) {
  const float c = s.scale == nullptr ? 1.0f : s.scale[i];
  const float* dact = s.gradient + (s.sample_of == nullptr ? i : s.sample_of[i]) * dim;
  if (first) {
    for (int64_t d = 0; d < dim; ++d) acc[d] = 0.0f + c * dact[d];
  } else {
    for (int64_t d = 0; d < dim; ++d) acc[d] += c * dact[d];
  }
}

}  // namespace

void RowGradientPlan::Build(const std::vector<GradientSource>* sources, int64_t vocabulary_size, int64_t sum_dim) {
  sources_ = sources;
  int64_t total = 0;
  for (const GradientSource& s : *sources) total += s.num_ids;

  // Sized for the worst case (every id distinct) once, so the first pass writes through raw pointers with no
  // capacity checks; only the first num_rows_ entries are meaningful.
  if (static_cast<int64_t>(rows_.size()) < total) {
    rows_.resize(total);
    counts_.resize(total);
  }
  const bool dense = UsesDenseIndex(vocabulary_size, total);
  summed_dim_ = sum_dim > 0 && total <= kMaxSummedFloats / sum_dim ? sum_dim : 0;
  if (summed_dim_ == 0) unique_of_.resize(total);  // (a summing pass has no counting sort to feed)
  int64_t num_entries = 0;
  if (summed_dim_ > 0) {
    if (static_cast<int64_t>(sums_.size()) < total * summed_dim_) sums_.resize(total * summed_dim_);
    // The sums' row loop is compiled for the row loops' vector ISA (the same values on either).
    RunWithRowLoopIsa(
        [&] { num_entries = dense ? IndexByDenseArray<true>(vocabulary_size) : IndexByHash<true>(total); });
  } else {
    num_entries = dense ? IndexByDenseArray<false>(vocabulary_size) : IndexByHash<false>(total);
  }
  const int64_t num_rows = num_rows_;
  const int32_t* const counts = counts_.data();
  const int32_t* const unique_of = unique_of_.data();

  // Stable counting sort of the contributions by unique row: enumeration order is (source, position).  Summed
  // rows need only the counts (the walk's work split).
  offsets_.resize(num_rows + 1);
  cursor_.resize(num_rows);
  offsets_[0] = 0;
  for (int64_t u = 0; u < num_rows; ++u) {
    cursor_[u] = offsets_[u];
    offsets_[u + 1] = offsets_[u] + counts[u];
  }
  if (summed_dim_ > 0) {
    entries_.clear();
    return;
  }
  entries_.resize(num_entries);
  Entry* const entries = entries_.data();
  int64_t* const cursor = cursor_.data();
  int64_t n = 0;
  for (size_t f = 0; f < sources->size(); ++f) {
    const int64_t num_ids = (*sources)[f].num_ids;
    for (int64_t i = 0; i < num_ids; ++i, ++n) {
      if (unique_of[n] < 0) continue;
      entries[cursor[unique_of[n]]++] = Entry{static_cast<int32_t>(f), static_cast<int32_t>(i)};
    }
  }
}

template <bool kSum>
int64_t RowGradientPlan::IndexByHash(int64_t total) {
  // Capacity: a power of two at least twice the number of ids (load factor <= 0.5).
  int bits = 4;
  while ((int64_t{1} << bits) < 2 * total) ++bits;
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  const int shift = 64 - bits;
  buckets_.assign(mask + 1, Bucket{kEmptyRow, 0});
  Bucket* const buckets = buckets_.data();
  [[maybe_unused]] const int64_t dim = summed_dim_;
  [[maybe_unused]] float* const sums = sums_.data();
  int64_t* const rows = rows_.data();
  int32_t* const counts = counts_.data();
  [[maybe_unused]] int32_t* const unique_of = unique_of_.data();
  int32_t num_rows = 0;
  int64_t n = 0;
  int64_t num_entries = 0;
  for (const GradientSource& source : *sources_) {
    const SourceView s(source);
    for (int64_t i = 0; i < s.num_ids; ++i, ++n) {
      if (i + kIndexPrefetchDistance < s.num_ids) {
        const int64_t ahead = s.ids[i + kIndexPrefetchDistance];
        if (ahead >= 0) PrefetchLine(buckets + Slot(ahead, shift));
      }
      const int64_t row = s.ids[i];
      if (row < 0) {  // no row (a dynamic table's key that was not admitted): contributes nothing
        if constexpr (!kSum) unique_of[n] = -1;
        continue;
      }
      ++num_entries;
      uint64_t h = Slot(row, shift);
      int32_t u;
      bool first = false;
      for (;;) {
        Bucket& b = buckets[h];
        if (b.row == row) {
          u = b.unique;
          ++counts[u];
          break;
        }
        if (b.row == kEmptyRow) {
          u = num_rows++;
          b = Bucket{row, u};
          rows[u] = row;
          counts[u] = 1;
          first = true;
          break;
        }
        h = (h + 1) & mask;
      }
      if constexpr (kSum) {
        AddContribution(s, i, dim, first, sums + u * dim);
      } else {
        unique_of[n] = u;
      }
    }
  }
  num_rows_ = num_rows;
  return num_entries;
}

template <bool kSum>
int64_t RowGradientPlan::IndexByDenseArray(int64_t vocabulary_size) {
  // Filled with -1 once per growth; afterwards only the entries a step touched are reset (below).
  if (static_cast<int64_t>(dense_.size()) < vocabulary_size) dense_.resize(vocabulary_size, -1);
  int32_t* const dense = dense_.data();
  const uint64_t vocab = static_cast<uint64_t>(vocabulary_size);
  [[maybe_unused]] const int64_t dim = summed_dim_;
  [[maybe_unused]] float* const sums = sums_.data();
  int64_t* const rows = rows_.data();
  int32_t* const counts = counts_.data();
  [[maybe_unused]] int32_t* const unique_of = unique_of_.data();
  int32_t num_rows = 0;
  int64_t n = 0;
  int64_t num_entries = 0;
  for (const GradientSource& source : *sources_) {
    const SourceView s(source);
    for (int64_t i = 0; i < s.num_ids; ++i, ++n) {
      if (i + kIndexPrefetchDistance < s.num_ids) {
        const uint64_t ahead = static_cast<uint64_t>(s.ids[i + kIndexPrefetchDistance]);
        if (ahead < vocab) PrefetchLine(dense + ahead);
      }
      const int64_t row = s.ids[i];
      // One unsigned compare rejects negative ids (no row); ids >= vocabulary_size break the caller's
      // precondition and are dropped rather than indexing past the array.
      if (static_cast<uint64_t>(row) >= vocab) {
        if constexpr (!kSum) unique_of[n] = -1;
        continue;
      }
      ++num_entries;
      int32_t u = dense[row];
      const bool first = u < 0;
      if (first) {
        u = num_rows++;
        dense[row] = u;
        rows[u] = row;
        counts[u] = 1;
      } else {
        ++counts[u];
      }
      if constexpr (kSum) {
        AddContribution(s, i, dim, first, sums + u * dim);
      } else {
        unique_of[n] = u;
      }
    }
  }
  for (int32_t u = 0; u < num_rows; ++u) dense[rows[u]] = -1;
  num_rows_ = num_rows;
  return num_entries;
}

std::vector<int64_t> RowGradientPlan::OrderByRow() const {
  std::vector<int64_t> order(num_rows_);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [this](int64_t a, int64_t b) { return rows_[a] < rows_[b]; });
  return order;
}

}  // namespace tf_embed_ops
