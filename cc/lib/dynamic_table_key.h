// Keys of dynamic-vocabulary tables (docs/dynamic_tables.md, "Keys").  A dynamic table is keyed by any int64;
// string ids are reduced to a 64-bit fingerprint before they reach the table, so the core only ever sees int64.
//
// StringFingerprint64 is FNV-1a (64-bit) over the bytes followed by the MurmurHash3 64-bit finaliser.  FNV-1a
// alone is a published, trivially reproducible hash, but its low bits mix poorly for short strings; the
// finaliser is a bijection on 64 bits, so it spreads the bits without adding collisions.  Both steps are plain
// arithmetic with no platform dependence (bytes are read one at a time), so a fingerprint is the same on every
// machine and in every language that reimplements these few lines.
//
// MixKey is the finaliser alone: the hash the key index and the row initialiser build on, so consecutive ids
// (0, 1, 2, ...) land far apart.
#ifndef TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_KEY_H_
#define TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_KEY_H_

#include <cstdint>
#include <string_view>

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

// FNV-1a 64 of the bytes, as the FNV reference defines it (offset basis 0xcbf29ce484222325, prime 0x100000001b3).
inline constexpr uint64_t Fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : bytes) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

// The 64-bit fingerprint of a string id, as the int64 key the table stores (two's complement reinterpretation,
// so every fingerprint, including those with the top bit set, is a valid key).
inline constexpr int64_t StringFingerprint64(std::string_view bytes) {
  return static_cast<int64_t>(MixKey(Fnv1a64(bytes)));
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_KEY_H_
