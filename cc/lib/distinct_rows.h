// The distinct rows of a batch of ids, ascending: what a tiered table's lookup, prefetch and update make resident
// (docs/tiered_tables.md).  A batch of Zipf ids repeats its hot rows many times, and sorting all of its ids just to
// drop the repeats is most of the cost; a bitmap of the table's rows does it in one pass over the ids and one scan
// of the bitmap.  The scan costs about a nanosecond a word and sorting about 30 per id (6,800 random rows of a
// million: 90 against 230 us, measured), so the bitmap is used while it has at most kWordsPerId words per id.
//
// FindDistinctRows also gives each id its row's position among the distinct rows.  A tiered step's kernels then
// address the pinned records by position (records[position]: one load) instead of looking each row up in a map
// on every access (the walk asks for each buffer of each row, and again for its prefetch), and the step's
// gradient plan is built over positions, so its dense index spans the batch's rows, not the table's.  Positions
// keep the rows' order (rows[p] < rows[q] iff p < q).
#ifndef TF_EMBED_OPS_CC_LIB_DISTINCT_ROWS_H_
#define TF_EMBED_OPS_CC_LIB_DISTINCT_ROWS_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cc/lib/vector_isa.h"

namespace tf_embed_ops {

// Whether the bitmap (rather than a sort) finds the distinct rows of n ids over num_rows rows.
inline bool UsesDistinctRowBitmap(int64_t n, int64_t num_rows) {
  constexpr int64_t kWordsPerId = 16;
  return n >= 128 && num_rows / 64 / kWordsPerId <= n;
}

// Sorts `rows` ascending and drops repeats.  Every row must be in [0, num_rows) (the callers validated the ids).
inline void SortDistinctRows(std::vector<int64_t>* rows, int64_t num_rows) {
  const int64_t n = static_cast<int64_t>(rows->size());
  if (!UsesDistinctRowBitmap(n, num_rows)) {
    std::sort(rows->begin(), rows->end());
    rows->erase(std::unique(rows->begin(), rows->end()), rows->end());
    return;
  }
  std::vector<uint64_t> bits(static_cast<size_t>((num_rows + 63) / 64), 0);
  for (const int64_t r : *rows) bits[static_cast<size_t>(r >> 6)] |= uint64_t{1} << (r & 63);
  rows->clear();
  for (size_t w = 0; w < bits.size(); ++w) {
    for (uint64_t b = bits[w]; b != 0; b &= b - 1) {
      rows->push_back(static_cast<int64_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(b))));
    }
  }
}

// A batch's distinct rows and, for each of its ids, where its row is among them.
struct DistinctBatch {
  std::vector<int64_t> rows;       // ascending, distinct
  std::vector<int64_t> positions;  // per id: rows[positions[i]] == ids[i]
};

// The distinct rows of `ids` (each in [0, num_rows): the callers validated them) and each id's position.
inline DistinctBatch FindDistinctRows(const std::vector<int64_t>& ids, int64_t num_rows) {
  DistinctBatch batch;
  const size_t n = ids.size();
  batch.positions.resize(n);
  if (!UsesDistinctRowBitmap(static_cast<int64_t>(n), num_rows)) {
    batch.rows = ids;
    std::sort(batch.rows.begin(), batch.rows.end());
    batch.rows.erase(std::unique(batch.rows.begin(), batch.rows.end()), batch.rows.end());
    for (size_t i = 0; i < n; ++i) {
      batch.positions[i] = std::lower_bound(batch.rows.begin(), batch.rows.end(), ids[i]) - batch.rows.begin();
    }
    return batch;
  }
  // The bitmap, then each word's rank (the set bits before it) while its rows are listed; an id's position is
  // its word's rank plus the set bits below it in the word.
  const size_t words = static_cast<size_t>((num_rows + 63) / 64);
  std::vector<uint64_t> bits(words, 0);
  for (const int64_t r : ids) bits[static_cast<size_t>(r >> 6)] |= uint64_t{1} << (r & 63);
  std::vector<int64_t> rank(words);
  for (size_t w = 0; w < words; ++w) {
    rank[w] = static_cast<int64_t>(batch.rows.size());
    for (uint64_t b = bits[w]; b != 0; b &= b - 1) {
      batch.rows.push_back(static_cast<int64_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(b))));
    }
  }
  // (Compiled for AVX2 where the CPU has it: the baseline build has no POPCNT instruction.)
  RunWithRowLoopIsa([&] {
    for (size_t i = 0; i < n; ++i) {
      const size_t w = static_cast<size_t>(ids[i] >> 6);
      const uint64_t below = (uint64_t{1} << (ids[i] & 63)) - 1;
      batch.positions[i] = rank[w] + __builtin_popcountll(bits[w] & below);
    }
  });
  return batch;
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_DISTINCT_ROWS_H_
