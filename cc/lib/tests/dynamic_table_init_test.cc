// The counter-based row initialiser of dynamic tables (docs/dynamic_tables_internals.md): values are pure
// functions of (seed, key, column) with the distributions' moments and bounds.
#include "cc/lib/dynamic_table_init.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "cc/lib/dynamic_table.h"
#include "cc/lib/dynamic_table_key.h"
#include "cc/lib/tests/dynamic_table_test_util.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace dynamic_test {
namespace {

// --- dynamic_table_init.h ----------------------------------------------------------------------------------

TEST(RowInitializerTest, ValuesArePureFunctionsOfSeedKeyAndColumn) {
  RowInitializer init;
  init.kind = RowInitializerKind::kNormal;
  init.mean = 0.5f;
  init.stddev = 2.0f;
  init.seed = 11;
  // The documented formula, computed here from its parts.
  const uint64_t b0 = MixKey(MixKey(MixKey(11) ^ static_cast<uint64_t>(int64_t{-3})) + (uint64_t{2} << 8) + 0);
  const uint64_t b1 = MixKey(MixKey(MixKey(11) ^ static_cast<uint64_t>(int64_t{-3})) + (uint64_t{2} << 8) + 1);
  const double u0 = static_cast<double>(b0 >> 11) * std::ldexp(1.0, -53);
  const double u1 = static_cast<double>(b1 >> 11) * std::ldexp(1.0, -53);
  const double z = std::sqrt(-2.0 * std::log(1.0 - u0)) * std::cos(2.0 * M_PI * u1);
  EXPECT_EQ(init.Value(-3, 2), 0.5f + 2.0f * static_cast<float>(z));
  // Column 3 is the other output of the same pair (draws of column 2): r sin instead of r cos.
  const double z3 = std::sqrt(-2.0 * std::log(1.0 - u0)) * std::sin(2.0 * M_PI * u1);
  EXPECT_EQ(init.Value(-3, 3), 0.5f + 2.0f * static_cast<float>(z3));
  EXPECT_EQ(init.Value(-3, 2), init.Value(-3, 2));
  EXPECT_NE(init.Value(-3, 2), init.Value(-3, 1));
  EXPECT_NE(init.Value(-3, 2), init.Value(3, 2));
  RowInitializer other = init;
  other.seed = 12;
  EXPECT_NE(init.Value(-3, 2), other.Value(-3, 2));
}

TEST(RowInitializerTest, FillRowIsValuePerColumn) {
  // FillRow computes normal columns a pair at a time; it must give exactly Value(key, column), odd dims included.
  for (const RowInitializerKind kind : {RowInitializerKind::kNormal, RowInitializerKind::kTruncatedNormal,
                                        RowInitializerKind::kUniform, RowInitializerKind::kConstant}) {
    RowInitializer init;
    init.kind = kind;
    init.mean = 0.1f;
    init.stddev = 1.0f;
    init.minval = -1.0f;
    init.maxval = 1.0f;
    init.value = 0.5f;
    init.seed = 4;
    for (const int64_t dim : {1, 2, 7, 64}) {
      std::vector<float> row(dim);
      for (int64_t key = -300; key < 300; key += 7) {
        init.FillRow(key, row.data(), dim);
        for (int64_t d = 0; d < dim; ++d) {
          EXPECT_EQ(row[d], init.Value(key, d)) << "kind " << static_cast<int>(kind) << " key " << key << " col " << d;
        }
      }
    }
  }
}

TEST(RowInitializerTest, PairedColumnsAreUncorrelated) {
  // Columns 2j and 2j + 1 are the cos and sin outputs of one Box-Muller pair: independent standard normals.
  RowInitializer init;
  init.kind = RowInitializerKind::kNormal;
  init.stddev = 1.0f;
  init.seed = 8;
  const int64_t n = 40000;
  double sxy = 0, sx = 0, sy = 0, sxx = 0, syy = 0;
  for (int64_t k = 0; k < n; ++k) {
    const double x = init.Value(k, 0), y = init.Value(k, 1);
    sx += x, sy += y, sxy += x * y, sxx += x * x, syy += y * y;
  }
  const double cov = sxy / n - (sx / n) * (sy / n);
  const double corr = cov / std::sqrt((sxx / n - sx * sx / n / n) * (syy / n - sy * sy / n / n));
  EXPECT_NEAR(corr, 0.0, 0.02);
  EXPECT_NEAR(sxx / n, 1.0, 0.03);
  EXPECT_NEAR(syy / n, 1.0, 0.03);
}

TEST(RowInitializerTest, DistributionsHaveTheirMomentsAndBounds) {
  RowInitializer init;
  init.seed = 3;
  const int64_t n = 40000;
  auto moments = [&](double* mean, double* sd, float* lo, float* hi) {
    double s = 0, s2 = 0;
    *lo = std::numeric_limits<float>::infinity();
    *hi = -*lo;
    for (int64_t k = 0; k < n; ++k) {
      const float v = init.Value(k * 7919 - 20000, k % 5);
      s += v;
      s2 += double{v} * v;
      *lo = std::min(*lo, v);
      *hi = std::max(*hi, v);
    }
    *mean = s / n;
    *sd = std::sqrt(s2 / n - *mean * *mean);
  };
  double mean, sd;
  float lo, hi;
  init.kind = RowInitializerKind::kUniform;
  init.minval = -0.5f;
  init.maxval = 1.5f;
  moments(&mean, &sd, &lo, &hi);
  EXPECT_NEAR(mean, 0.5, 0.02);
  EXPECT_NEAR(sd, 2.0 / std::sqrt(12.0), 0.02);
  EXPECT_GE(lo, -0.5f);
  EXPECT_LT(hi, 1.5f);
  init.kind = RowInitializerKind::kNormal;
  init.mean = 1.0f;
  init.stddev = 0.5f;
  moments(&mean, &sd, &lo, &hi);
  EXPECT_NEAR(mean, 1.0, 0.02);
  EXPECT_NEAR(sd, 0.5, 0.02);
  init.kind = RowInitializerKind::kTruncatedNormal;
  moments(&mean, &sd, &lo, &hi);
  EXPECT_NEAR(mean, 1.0, 0.02);
  // A standard normal truncated to [-2, 2] has standard deviation 0.8796.
  EXPECT_NEAR(sd, 0.5 * 0.8796, 0.02);
  EXPECT_GE(lo, 0.0f);
  EXPECT_LE(hi, 2.0f);
  init.kind = RowInitializerKind::kConstant;
  init.value = 0.25f;
  EXPECT_EQ(init.Value(99, 3), 0.25f);
  init.kind = RowInitializerKind::kZeros;
  EXPECT_EQ(init.Value(99, 3), 0.0f);
}

TEST(RowInitializerTest, RejectsNonFiniteAndInvertedParameters) {
  RowInitializer init;
  init.kind = RowInitializerKind::kUniform;
  init.minval = 1.0f;
  init.maxval = 0.0f;
  ExpectInvalid(init.Validate("t"), {"'t'", "minval"});
  init.minval = 0.0f;
  init.stddev = -1.0f;
  ExpectInvalid(init.Validate("t"), {"stddev", "-1"});
  init.stddev = std::nanf("");
  ExpectInvalid(init.Validate("t"), {"stddev", "nan"});
  init.stddev = 1.0f;
  EXPECT_TRUE(init.Validate("t").ok());
}

}  // namespace
}  // namespace dynamic_test
}  // namespace tf_embed_ops
