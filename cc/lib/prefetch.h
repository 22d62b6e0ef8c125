// Software prefetch of table rows.  Embedding rows are gathered at random (zipf ids over a table far larger
// than the caches), so the loops are bound by memory latency; asking for the rows a few iterations ahead
// overlaps those misses.  A hint only: no effect on results.
#ifndef TF_EMBED_OPS_CC_LIB_PREFETCH_H_
#define TF_EMBED_OPS_CC_LIB_PREFETCH_H_

#include <cstdint>

namespace tf_embed_ops {

// How many rows ahead the loops prefetch.
inline constexpr int64_t kPrefetchDistance = 8;

// One cache line into L1.  On x86-64 this is an asm statement, not __builtin_prefetch: GCC 12 dropped the
// builtin from the row walk of table_update.h once the walk became a template over row storages (the compiled
// walk had no table-row prefetch at all; the dynamic Adagrad step measured 1.5x slower for it).  An asm
// statement is always emitted.  kForWrite is kept as the intent; the instruction is prefetcht0 either way (what
// GCC emitted for a write prefetch without -mprfchw).
inline void PrefetchLine(const void* address) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(address)));
#else
  __builtin_prefetch(address, 0, 3);
#endif
}

template <bool kForWrite>
inline void PrefetchRow(const float* row, int64_t dim) {
  constexpr int64_t kFloatsPerLine = 64 / sizeof(float);
  for (int64_t d = 0; d < dim; d += kFloatsPerLine) PrefetchLine(row + d);
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_PREFETCH_H_
