// 16-bit storage conversions (cc/lib/storage_types.h) and the 16-bit row path of UpdateTable: round-to-nearest
// against the CPU's own conversion instruction (F16C) where present and against exhaustive round trips,
// stochastic rounding's bracketing and unbiasedness, and the 16-bit table update equal to the float32 one then
// rounded, for any sharding.
#include "cc/lib/storage_types.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "cc/lib/stochastic_rounding.h"
#include "cc/lib/table_update.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(StorageTypes, EveryBfloat16AndFloat16RoundTripsExactly) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float b = Bfloat16ToFloat(static_cast<uint16_t>(h));
    const float f = Float16ToFloat(static_cast<uint16_t>(h));
    if (!std::isnan(b)) EXPECT_EQ(FloatToBfloat16Nearest(b), h) << h;
    if (!std::isnan(f)) EXPECT_EQ(FloatToFloat16Nearest(f), h) << h;
    // Exactly representable values are never moved by stochastic rounding, whatever the bits.
    if (!std::isnan(b)) EXPECT_EQ(FloatToBfloat16Stochastic(b, 0xffffffffu), h) << h;
    if (!std::isnan(f)) EXPECT_EQ(FloatToFloat16Stochastic(f, 0xffffffffu), h) << h;
    EXPECT_EQ(std::isnan(b), std::isnan(Bfloat16ToFloat(FloatToBfloat16Nearest(b))));
    EXPECT_EQ(std::isnan(f), std::isnan(Float16ToFloat(FloatToFloat16Nearest(f))));
  }
}

TEST(StorageTypes, NearestRoundsTiesToEven) {
  // 1 + 2^-8 is half-way between bfloat16's 1 and 1 + 2^-7: ties go to the even mantissa (1).
  EXPECT_EQ(Bfloat16ToFloat(FloatToBfloat16Nearest(1.0f + 0.00390625f)), 1.0f);
  EXPECT_EQ(Bfloat16ToFloat(FloatToBfloat16Nearest(1.0f + 3 * 0.00390625f)), 1.0f + 4 * 0.00390625f);
  // float16: 1 + 2^-11 ties to 1; 65520 (half-way past the largest finite) overflows to inf.
  EXPECT_EQ(Float16ToFloat(FloatToFloat16Nearest(1.0f + 0.00048828125f)), 1.0f);
  EXPECT_TRUE(std::isinf(Float16ToFloat(FloatToFloat16Nearest(65520.0f))));
  EXPECT_EQ(Float16ToFloat(FloatToFloat16Nearest(65519.0f)), 65504.0f);
  // The smallest subnormal, and half of it (a tie, to zero).
  EXPECT_EQ(Float16ToFloat(FloatToFloat16Nearest(5.9604644775390625e-8f)), 5.9604644775390625e-8f);
  EXPECT_EQ(Float16ToFloat(FloatToFloat16Nearest(2.98023223876953125e-8f)), 0.0f);
}

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
}  // namespace
}  // namespace tf_embed_ops
#include <immintrin.h>
namespace tf_embed_ops {
namespace {
__attribute__((target("f16c"))) uint16_t HardwareFloat16(float f) {
  return static_cast<uint16_t>(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0));
}

TEST(StorageTypes, Float16NearestEqualsTheF16cInstruction) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "no F16C on this CPU";
  std::mt19937 rng(5);
  for (int i = 0; i < 2000000; ++i) {
    const uint32_t u = rng();
    const float f = FromBits(u);
    if (std::isnan(f)) continue;  // payloads: both quiet, not compared
    ASSERT_EQ(FloatToFloat16Nearest(f), HardwareFloat16(f)) << std::hex << u;
  }
}
#endif

TEST(StorageTypes, StochasticRoundsToANeighbourAndIsUnbiased) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  for (int i = 0; i < 200; ++i) {
    const float x = i == 0 ? 3.0e-6f : value(rng);  // i == 0: a float16 subnormal
    double sum_b = 0, sum_h = 0;
    constexpr int kDraws = 20000;
    const float lo_b = Bfloat16ToFloat(FloatToBfloat16Stochastic(x, 0));
    const float lo_h = Float16ToFloat(FloatToFloat16Stochastic(x, 0));
    for (int k = 0; k < kDraws; ++k) {
      const uint32_t bits = RoundingBits(RoundingRowKey(RoundingSpec{}, 0, i), static_cast<uint32_t>(k));
      const float b = Bfloat16ToFloat(FloatToBfloat16Stochastic(x, bits));
      const float h = Float16ToFloat(FloatToFloat16Stochastic(x, bits));
      ASSERT_TRUE(b == lo_b || b == Bfloat16ToFloat(FloatToBfloat16Stochastic(x, 0xffffffffu))) << x;
      ASSERT_TRUE(h == lo_h || h == Float16ToFloat(FloatToFloat16Stochastic(x, 0xffffffffu))) << x;
      sum_b += b;
      sum_h += h;
    }
    const float hi_b = Bfloat16ToFloat(FloatToBfloat16Stochastic(x, 0xffffffffu));
    const float hi_h = Float16ToFloat(FloatToFloat16Stochastic(x, 0xffffffffu));
    // 5 standard deviations of a Bernoulli mean (at most half a step / sqrt(draws)).
    EXPECT_NEAR(sum_b / kDraws, x, 5 * 0.5 * std::fabs(hi_b - lo_b) / std::sqrt(kDraws) + 1e-12) << x;
    EXPECT_NEAR(sum_h / kDraws, x, 5 * 0.5 * std::fabs(hi_h - lo_h) / std::sqrt(kDraws) + 1e-12) << x;
  }
}

TEST(StorageTypes, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (uint32_t r : {0u, 0xffffu, 0xffffffffu}) {
    EXPECT_EQ(Bfloat16ToFloat(FloatToBfloat16Stochastic(inf, r)), inf);
    EXPECT_EQ(Bfloat16ToFloat(FloatToBfloat16Stochastic(-inf, r)), -inf);
    EXPECT_TRUE(std::isnan(Bfloat16ToFloat(FloatToBfloat16Stochastic(nan, r))));
    EXPECT_TRUE(std::isnan(Bfloat16ToFloat(FloatToBfloat16Stochastic(FromBits(0x7f800001u), r))));  // signalling
    EXPECT_EQ(Float16ToFloat(FloatToFloat16Stochastic(inf, r)), inf);
    EXPECT_TRUE(std::isnan(Float16ToFloat(FloatToFloat16Stochastic(FromBits(0x7f800001u), r))));
    EXPECT_EQ(Float16ToFloat(FloatToFloat16Stochastic(-0.0f, r)), 0.0f);
    EXPECT_TRUE(std::signbit(Float16ToFloat(FloatToFloat16Stochastic(-0.0f, r))));
  }
}

// The 16-bit table path equals the float32 path followed by rounding to nearest, for any sharding.
const ShardFn kSerialShard = [](int64_t total, int64_t, const std::function<void(int64_t, int64_t)>& fn) {
  fn(0, total);
};
const ShardFn kBackwardsShard = [](int64_t total, int64_t, const std::function<void(int64_t, int64_t)>& fn) {
  for (int64_t b = total; b > 0; --b) fn(b - 1, b);  // backwards, one block at a time
};

TEST(StorageTypes, Bfloat16TableUpdateIsTheFloat32UpdateRounded) {
  constexpr int64_t kVocab = 300, kDim = 20, kIds = 900;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int64_t> id(0, kVocab - 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<int64_t> ids(kIds);
  for (auto& i : ids) i = id(rng);
  std::vector<float> grads(kIds * kDim);
  for (auto& g : grads) g = normal(rng);
  FeatureLayout layout;
  FeatureBatch batch{};
  batch.ids = ids.data();
  batch.num_ids = kIds;
  std::vector<int64_t> shape = {kIds};
  batch.sample_shape = shape;
  int64_t num_samples = 0;
  ASSERT_TRUE(ValidateFeatureBatch(batch, "f", &num_samples).ok());
  BuildValidatedFeatureLayout(batch, num_samples, Combiner::kSum, &layout);
  std::vector<GradientSource> sources = {GradientSource{ids.data(), kIds, &layout, grads.data()}};
  RowGradientPlan plan;
  plan.Build(&sources);

  TableOptimization o;
  o.optimizer = Adagrad{};
  std::vector<uint16_t> w16(kVocab * kDim), a16(kVocab * kDim);
  std::vector<float> w32(kVocab * kDim), a32(kVocab * kDim);
  for (int64_t i = 0; i < kVocab * kDim; ++i) {
    w16[i] = FloatToBfloat16Nearest(normal(rng));
    a16[i] = FloatToBfloat16Nearest(0.1f + std::fabs(normal(rng)));
    w32[i] = Bfloat16ToFloat(w16[i]);
    a32[i] = Bfloat16ToFloat(a16[i]);
  }
  TableBuffers f32{w32.data(), {a32.data()}, kVocab, kDim};
  UpdateTable(o, 0.1f, plan, f32, kSerialShard);
  for (const ShardFn& shard : {kSerialShard, kBackwardsShard}) {
    std::vector<uint16_t> w = w16, a = a16;
    StoredTableBuffers t;
    t.weights = StoredBuffer{w.data(), StorageType::kBfloat16};
    t.slots = {StoredBuffer{a.data(), StorageType::kBfloat16}};
    t.vocabulary_size = kVocab;
    t.dim = kDim;
    t.rounding.mode = Rounding::kNearest;
    UpdateTable(o, 0.1f, plan, t, shard);
    for (int64_t i = 0; i < kVocab * kDim; ++i) {
      ASSERT_EQ(w[i], FloatToBfloat16Nearest(w32[i])) << i;
      ASSERT_EQ(a[i], FloatToBfloat16Nearest(a32[i])) << i;
    }
  }
}

}  // namespace
}  // namespace tf_embed_ops
