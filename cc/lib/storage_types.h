// Storage element types of tables and slots (docs/low_precision.md): float32, bfloat16 and float16 (IEEE
// binary16).  16-bit elements are held as their raw uint16_t bits so this header needs no TensorFlow or Eigen
// type; the kernels reinterpret Eigen::bfloat16 / Eigen::half buffers, which have the same layout.
//
// Every conversion here is plain integer and fp32 arithmetic with a fixed rounding (no FMA, no fast-math, no
// F16C/AVX-512 instructions), so the baseline and the AVX2 clones of the row loops (vector_isa.h) give the same
// bits, and so does any other machine.
//
// Rounding float32 -> 16 bits:
//   nearest:    round to nearest, ties to even (as TensorFlow's casts); overflow goes to +-inf.
//   stochastic: rounds |x| up to the next 16-bit value with probability (|x| - lo) / (hi - lo), else down,
//               where lo <= |x| < hi are the neighbouring 16-bit values; `random` supplies the uniform bits.
//               Adding k uniform random bits below the kept mantissa and truncating does exactly that (the
//               dropped bits ARE the position of |x| between lo and hi), so the rounding is unbiased:
//               E[round(x)] = x.  For float16 subnormals (|x| < 2^-14) the probability is resolved to 2^-23 of a
//               step.  NaN stays a quiet NaN of the same sign, +-inf stays +-inf.
#ifndef TF_EMBED_OPS_CC_LIB_STORAGE_TYPES_H_
#define TF_EMBED_OPS_CC_LIB_STORAGE_TYPES_H_

#include <cstdint>
#include <cstring>

namespace tf_embed_ops {

enum class StorageType { kFloat32, kBfloat16, kFloat16 };
enum class Rounding { kNearest, kStochastic };

inline constexpr int64_t StorageBytes(StorageType type) { return type == StorageType::kFloat32 ? 4 : 2; }
inline const char* StorageTypeName(StorageType type) {
  switch (type) {
    case StorageType::kFloat32:
      return "float32";
    case StorageType::kBfloat16:
      return "bfloat16";
    case StorageType::kFloat16:
      return "float16";
  }
  return "?";
}

namespace storage_internal {

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace storage_internal

// ---------------------------------------------------------------------------------------------- bfloat16

inline float Bfloat16ToFloat(uint16_t b) { return storage_internal::FromBits(static_cast<uint32_t>(b) << 16); }

// Round to nearest even.
inline uint16_t FloatToBfloat16Nearest(float f) {
  const uint32_t u = storage_internal::Bits(f);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(nan ? ((u >> 16) | 0x40u) : rounded);
}

// Stochastic: the low 16 bits of `random` are added below the kept mantissa.
inline uint16_t FloatToBfloat16Stochastic(float f, uint32_t random) {
  const uint32_t u = storage_internal::Bits(f);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  // +-inf has zero low bits and a 16-bit addend cannot carry out of them, so it stays +-inf.
  const uint32_t rounded = (u + (random & 0xffffu)) >> 16;
  return static_cast<uint16_t>(nan ? ((u >> 16) | 0x40u) : rounded);
}

// ---------------------------------------------------------------------------------------------- float16

inline float Float16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float32.
    bits = storage_internal::Bits(static_cast<float>(mantissa) * 5.9604644775390625e-8f);
  } else if (exponent == 0x1fu) {
    bits = 0x7f800000u | (mantissa << 13);
  } else {
    bits = ((exponent + 112u) << 23) | (mantissa << 13);
  }
  return storage_internal::FromBits(sign | bits);
}

namespace storage_internal {

// |x| < 2^-14 (float16 subnormal range) to a float16 magnitude in units of 2^-24, round to nearest even: adding
// 0.5f (whose ulp is 2^-24) rounds in float32's own round-to-nearest-even, and the low bits are the result (0x400
// when it rounds up to the smallest normal, which is that normal's encoding).
inline uint32_t SubnormalF16Nearest(uint32_t abs_bits) { return Bits(FromBits(abs_bits) + 0.5f) - 0x3f000000u; }

// Same range, stochastic: v = |x| * 2^24 (exact), rounded up with probability frac(v), resolved to 2^-23.
inline uint32_t SubnormalF16Stochastic(uint32_t abs_bits, uint32_t random23) {
  const float v = FromBits(abs_bits) * 16777216.0f;
  const uint32_t lo = static_cast<uint32_t>(v);
  const uint32_t frac = static_cast<uint32_t>((v - static_cast<float>(lo)) * 8388608.0f);
  return lo + (random23 < frac ? 1u : 0u);
}

}  // namespace storage_internal

// Round to nearest even (the value of TensorFlow's cast, and of the F16C instruction).
inline uint16_t FloatToFloat16Nearest(float f) {
  const uint32_t u = storage_internal::Bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  uint32_t h;
  if (a > 0x7f800000u) {
    h = 0x7e00u | ((a >> 13) & 0x3ffu);  // quiet NaN, payload truncated
  } else if (a >= 0x477ff000u) {
    h = 0x7c00u;  // >= 65520 (half-way between 65504 and 2^16) and inf: inf
  } else if (a >= 0x38800000u) {
    const uint32_t m = a - 0x38000000u;  // float exponent bias 127 -> half's 15
    h = (m + 0xfffu + ((m >> 13) & 1u)) >> 13;
  } else {
    h = storage_internal::SubnormalF16Nearest(a);
  }
  return static_cast<uint16_t>(sign | h);
}

// Stochastic: 13 random bits below a normal's kept mantissa, 23 for a subnormal's probability.
inline uint16_t FloatToFloat16Stochastic(float f, uint32_t random) {
  const uint32_t u = storage_internal::Bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  uint32_t h;
  if (a > 0x7f800000u) {
    h = 0x7e00u | ((a >> 13) & 0x3ffu);
  } else if (a >= 0x47800000u) {
    h = 0x7c00u;  // >= 2^16 and inf
  } else if (a >= 0x38800000u) {
    // Between 65504 and 2^16 a carry reaches 0x7c00: rounding "up" past the largest finite value is inf.
    h = (a - 0x38000000u + (random & 0x1fffu)) >> 13;
  } else {
    h = storage_internal::SubnormalF16Stochastic(a, random >> 9);
  }
  return static_cast<uint16_t>(sign | h);
}

// ---------------------------------------------------------------------------------------------- generic

inline float StoredToFloat(StorageType type, uint16_t bits) {
  return type == StorageType::kBfloat16 ? Bfloat16ToFloat(bits) : Float16ToFloat(bits);
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_STORAGE_TYPES_H_
