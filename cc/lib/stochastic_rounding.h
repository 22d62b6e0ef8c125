// The random bits of stochastic rounding, and the row load/store of 16-bit storage (docs/low_precision.md).
//
// The bits come from a counter-based generator: a pure function of (seed, step, table, buffer, row, column).
// Nothing is drawn from a shared stream, so a row's result does not depend on which thread updates it or in
// what order, and a step replayed with the same inputs gives the same bits.
//   row key  = MixKey chain over (seed, step, stream = table * 64 + buffer, row)   (once per row and buffer;
//              buffer 0 is the table, 1 + k its slot k)
//   bits     = lowbias32(low32(row key) ^ column * golden ratio) ^ high32(row key)  (once per element)
// lowbias32 (C. Wellons' 32-bit integer hash, a bijection) is used per element because it vectorizes with
// 32-bit multiplies; MixKey (MurmurHash3's fmix64) separates the rows.
#ifndef TF_EMBED_OPS_CC_LIB_STOCHASTIC_ROUNDING_H_
#define TF_EMBED_OPS_CC_LIB_STOCHASTIC_ROUNDING_H_

#include <cstdint>

#include "cc/lib/dynamic_table_key.h"
#include "cc/lib/storage_types.h"

namespace tf_embed_ops {

// What a store needs to round: the mode, and for stochastic rounding the generator's counters.
struct RoundingSpec {
  Rounding mode = Rounding::kStochastic;
  uint64_t seed = 0;
  int64_t step = 0;
  int64_t table = 0;  // the table's index in the config: tables of one step draw different bits
};

// The row key's first three links (seed, step, stream): the same for every row of one buffer in one step, so the
// row walk computes it once per call and each row's key costs one MixKey (RoundingRowKeyOf).
inline uint64_t RoundingStreamKey(const RoundingSpec& spec, int64_t buffer) {
  uint64_t k = MixKey(spec.seed ^ 0x5851f42d4c957f2dULL);
  k = MixKey(k ^ static_cast<uint64_t>(spec.step));
  return MixKey(k ^ (static_cast<uint64_t>(spec.table) * 64 + static_cast<uint64_t>(buffer)));
}

// The row key from its buffer's stream key: RoundingRowKeyOf(RoundingStreamKey(spec, b), row) is
// RoundingRowKey(spec, b, row).
inline uint64_t RoundingRowKeyOf(uint64_t stream_key, uint64_t row) { return MixKey(stream_key ^ row); }

inline uint64_t RoundingRowKey(const RoundingSpec& spec, int64_t buffer, int64_t row) {
  return RoundingRowKeyOf(RoundingStreamKey(spec, buffer), static_cast<uint64_t>(row));
}

inline uint32_t RoundingBits(uint64_t row_key, uint32_t column) {
  uint32_t x = static_cast<uint32_t>(row_key) ^ (column * 0x9e3779b9u);
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x ^ static_cast<uint32_t>(row_key >> 32);
}

// dst[d] = float(src[d]).
inline void LoadStoredRow(StorageType type, const uint16_t* src, float* dst, int64_t dim) {
  if (type == StorageType::kBfloat16) {
    for (int64_t d = 0; d < dim; ++d) dst[d] = Bfloat16ToFloat(src[d]);
  } else {
    for (int64_t d = 0; d < dim; ++d) dst[d] = Float16ToFloat(src[d]);
  }
}

// dst[d] = round(src[d]) to `type`; `row_key` is RoundingRowKey of this row and buffer (unused for nearest).
// The stochastic loops count columns in 32 bits, the width RoundingBits takes: a 64-bit counter narrowed in
// the loop cost the vectorised loop a shuffle per vector.  (A row has at most 2^31 - 1 columns.)
inline void StoreStoredRow(StorageType type, Rounding mode, uint64_t row_key, const float* src, uint16_t* dst,
                           int64_t dim) {
  const uint32_t n = static_cast<uint32_t>(dim);
  if (type == StorageType::kBfloat16) {
    if (mode == Rounding::kNearest) {
      for (uint32_t d = 0; d < n; ++d) dst[d] = FloatToBfloat16Nearest(src[d]);
    } else {
      for (uint32_t d = 0; d < n; ++d) dst[d] = FloatToBfloat16Stochastic(src[d], RoundingBits(row_key, d));
    }
  } else {
    if (mode == Rounding::kNearest) {
      for (uint32_t d = 0; d < n; ++d) dst[d] = FloatToFloat16Nearest(src[d]);
    } else {
      for (uint32_t d = 0; d < n; ++d) dst[d] = FloatToFloat16Stochastic(src[d], RoundingBits(row_key, d));
    }
  }
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_STOCHASTIC_ROUNDING_H_
