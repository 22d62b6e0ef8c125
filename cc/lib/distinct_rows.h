// The distinct rows of a batch of ids, ascending: what a tiered table's lookup, prefetch and update make resident
// (docs/tiered_tables.md).  A batch of Zipf ids repeats its hot rows many times, and sorting all of its ids just to
// drop the repeats is most of the cost; a bitmap of the table's rows does it in one pass over the ids and one scan
// of the bitmap.  The scan costs about a nanosecond a word and sorting about 30 per id (6,800 random rows of a
// million: 90 against 230 us, measured), so the bitmap is used while it has at most kWordsPerId words per id.
#ifndef TF_EMBED_OPS_CC_LIB_DISTINCT_ROWS_H_
#define TF_EMBED_OPS_CC_LIB_DISTINCT_ROWS_H_

#include <algorithm>
#include <cstdint>
#include <vector>

namespace tf_embed_ops {

// Sorts `rows` ascending and drops repeats.  Every row must be in [0, num_rows) (the callers validated the ids).
inline void SortDistinctRows(std::vector<int64_t>* rows, int64_t num_rows) {
  constexpr int64_t kWordsPerId = 16;
  const int64_t n = static_cast<int64_t>(rows->size());
  if (n < 128 || num_rows / 64 / kWordsPerId > n) {
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

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_DISTINCT_ROWS_H_
