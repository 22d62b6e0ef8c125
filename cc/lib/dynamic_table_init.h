// Deterministic initial values of a dynamic table's new rows (docs/dynamic_tables_internals.md, "Determinism").
//
// A row is a pure function of (seed, key, column): each value comes from a counter-based generator, i.e. a hash
// of those three numbers (and a draw number), never from a stateful random stream.  So a key's initial row is
// the same whatever order keys arrive in, whichever thread inserts it, and whether it was evicted and comes
// back: the property that makes dynamic tables reproducible at any thread count.
//
//   bits(seed, key, column, draw) = MixKey(MixKey(MixKey(seed) ^ key) + column * 2^8 + draw)   (uint64 wrap)
//   uniform01 = top 53 bits / 2^53                      in [0, 1)
//   uniform   = min + (max - min) * uniform01           (float)
//   normal    = mean + stddev * z, with z from Box-Muller in double over column PAIRS: columns 2j and 2j + 1
//               share draws 0 and 1 of column 2j (u = uniform01 of them), r = sqrt(-2 ln(1 - u0)),
//               z[2j] = r cos(2 pi u1), z[2j + 1] = r sin(2 pi u1) (both outputs of one pair: one log, one
//               sqrt and one sincos per two values; 1 - u0 is in (0, 1], so the log is finite)
//   truncated = per column, the z of draws (2a, 2a + 1) of its pair's even column for the first attempt a whose
//               |z| <= 2 (TF's truncated normal bound); after kMaxTruncatedAttempts it is clamped to +-2 stddev.
// Double precision for the transcendental step keeps the float result stable to the last bit on any libm that
// rounds within a few double ulps.
#ifndef TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_INIT_H_
#define TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_INIT_H_

#include <cmath>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cc/lib/dynamic_table_key.h"

namespace tf_embed_ops {

enum class RowInitializerKind { kZeros, kConstant, kUniform, kNormal, kTruncatedNormal };

struct RowInitializer {
  RowInitializerKind kind = RowInitializerKind::kZeros;
  float value = 0.0f;   // kConstant
  float minval = 0.0f;  // kUniform: [minval, maxval)
  float maxval = 0.0f;
  float mean = 0.0f;  // kNormal, kTruncatedNormal
  float stddev = 0.0f;
  uint64_t seed = 0;

  static constexpr int kMaxTruncatedAttempts = 64;

  // Finite parameters, minval <= maxval, stddev >= 0.  `table` names the table in the message.
  absl::Status Validate(const std::string& table) const {
    auto bad = [&](const char* what, float v) {
      return absl::InvalidArgumentError(
          absl::StrCat("dynamic table '", table, "': initializer ", what, " = ", v, " is not allowed"));
    };
    for (const auto& [name, v] : {std::pair<const char*, float>{"value", value},
                                  {"minval", minval},
                                  {"maxval", maxval},
                                  {"mean", mean},
                                  {"stddev", stddev}}) {
      if (!std::isfinite(v)) return bad(name, v);
    }
    if (kind == RowInitializerKind::kUniform && !(minval <= maxval)) return bad("minval (above maxval)", minval);
    if (stddev < 0.0f) return bad("stddev", stddev);
    return absl::OkStatus();
  }

  // The per-key part of the generator's counter, computed once per row.
  static uint64_t KeyState(uint64_t seed, int64_t key) { return MixKey(MixKey(seed) ^ static_cast<uint64_t>(key)); }
  static uint64_t Bits(uint64_t key_state, int64_t column, uint64_t draw) {
    return MixKey(key_state + (static_cast<uint64_t>(column) << 8) + draw);
  }
  static double Uniform01(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }
  // Both Box-Muller outputs of the pair of columns (even_column, even_column + 1) from its draws first_draw and
  // first_draw + 1: z[0] for the even column, z[1] for the odd one.
  static void StandardNormalPair(uint64_t key_state, int64_t even_column, uint64_t first_draw, double z[2]) {
    const double u0 = Uniform01(Bits(key_state, even_column, first_draw));
    const double u1 = Uniform01(Bits(key_state, even_column, first_draw + 1));
    const double r = std::sqrt(-2.0 * std::log(1.0 - u0));
    double sin_angle, cos_angle;
    ::sincos(2.0 * M_PI * u1, &sin_angle, &cos_angle);  // glibc: one range reduction for both (same values)
    z[0] = r * cos_angle;
    z[1] = r * sin_angle;
  }
  // One column's output of its pair (Value() of a single column; the pair function keeps it bitwise FillRow's).
  static double StandardNormal(uint64_t key_state, int64_t column, uint64_t first_draw) {
    double z[2];
    StandardNormalPair(key_state, column & ~int64_t{1}, first_draw, z);
    return z[column & 1];
  }

  // The value of column `column` of key `key`'s initial row.
  float Value(int64_t key, int64_t column) const { return ValueFromState(KeyState(seed, key), column); }

  // The whole row: Value(key, d) for every column, normal values computed a pair of columns at a time (a
  // truncated normal's first attempt too; the few rejected columns retry one by one).
  void FillRow(int64_t key, float* row, int64_t dim) const {
    const uint64_t state = KeyState(seed, key);
    if (kind != RowInitializerKind::kNormal && kind != RowInitializerKind::kTruncatedNormal) {
      for (int64_t d = 0; d < dim; ++d) row[d] = ValueFromState(state, d);
      return;
    }
    const bool truncated = kind == RowInitializerKind::kTruncatedNormal;
    int64_t d = 0;
    for (; d + 1 < dim; d += 2) {
      double z[2];
      StandardNormalPair(state, d, 0, z);
      for (int i = 0; i < 2; ++i) {
        row[d + i] = truncated && !(std::fabs(z[i]) <= 2.0) ? ValueFromState(state, d + i)
                                                            : mean + stddev * static_cast<float>(z[i]);
      }
    }
    if (d < dim) row[d] = ValueFromState(state, d);
  }

 private:
  float ValueFromState(uint64_t state, int64_t column) const {
    switch (kind) {
      case RowInitializerKind::kZeros:
        return 0.0f;
      case RowInitializerKind::kConstant:
        return value;
      case RowInitializerKind::kUniform: {
        const float u = static_cast<float>(Uniform01(Bits(state, column, 0)));
        // u < 1 but minval + (maxval - minval) * u can round up to maxval; keep the interval half-open.
        const float v = minval + (maxval - minval) * u;
        return v < maxval ? v : minval;
      }
      case RowInitializerKind::kNormal:
        return mean + stddev * static_cast<float>(StandardNormal(state, column, 0));
      case RowInitializerKind::kTruncatedNormal: {
        double z = 0.0;
        for (int a = 0; a < kMaxTruncatedAttempts; ++a) {
          z = StandardNormal(state, column, 2 * static_cast<uint64_t>(a));
          if (std::fabs(z) <= 2.0) break;
        }
        z = std::fmin(std::fmax(z, -2.0), 2.0);
        return mean + stddev * static_cast<float>(z);
      }
    }
    return 0.0f;
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_INIT_H_
