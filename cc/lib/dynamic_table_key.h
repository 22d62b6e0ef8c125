// Keys of dynamic-vocabulary tables (docs/dynamic_tables_internals.md, "Keys").  A dynamic table is keyed by any int64;
// string ids are reduced to a 64-bit fingerprint by the ops (TensorFlow's farmhash64, see
// cc/kernels/dynamic_table_kernel_util.h) before they reach the table, so the core only ever sees int64.
//
// MixKey is MurmurHash3's 64-bit finaliser: the hash the key index and the row initialiser build on, so
// consecutive ids (0, 1, 2, ...) land far apart.
#ifndef TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_KEY_H_
#define TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_KEY_H_

#include <cstdint>

namespace tf_embed_ops {

// MurmurHash3's fmix64: a bijection of uint64 with full avalanche.
inline constexpr uint64_t MixKey(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_KEY_H_
