// Software prefetch of table rows.  Embedding rows are gathered at random (zipf ids over a table far larger
// than the caches), so the loops are bound by memory latency; asking for the rows a few iterations ahead
// overlaps those misses.  A hint only: no effect on results.
#ifndef TF_EMBED_OPS_CC_LIB_PREFETCH_H_
#define TF_EMBED_OPS_CC_LIB_PREFETCH_H_

#include <cstdint>

namespace tf_embed_ops {

// How many rows ahead the loops prefetch.
inline constexpr int64_t kPrefetchDistance = 8;

template <bool kForWrite>
inline void PrefetchRow(const float* row, int64_t dim) {
  constexpr int64_t kFloatsPerLine = 64 / sizeof(float);
  for (int64_t d = 0; d < dim; d += kFloatsPerLine) __builtin_prefetch(row + d, kForWrite ? 1 : 0, 3);
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_PREFETCH_H_
