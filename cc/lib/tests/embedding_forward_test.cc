// Tests of embedding_forward.h (the forward pass of one feature) and simulated_quantization.h.
#include "cc/lib/embedding_forward.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cc/lib/combiner.h"
#include "cc/lib/simulated_quantization.h"
#include "cc/lib/storage_types.h"
#include "cc/lib/tests/feature_test_util.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace {

using testing_util::DenseFeature;
using testing_util::Feature;
using testing_util::RaggedFeature;

TEST(QuantizerTest, ClipsThenRoundsToTheNearestBucketHalfUp) {
  SimulatedQuantization q;
  q.enabled = true;
  q.lower = -1.0f;
  q.upper = 1.0f;
  q.num_buckets = 5;  // levels -1, -0.5, 0, 0.5, 1
  const Quantizer quantize(q);
  EXPECT_EQ(quantize(0.3f), 0.5f);
  EXPECT_EQ(quantize(-0.2f), 0.0f);
  EXPECT_EQ(quantize(0.25f), 0.5f);  // a tie rounds up
  EXPECT_EQ(quantize(-0.74f), -0.5f);
  EXPECT_EQ(quantize(1.7f), 1.0f);
  EXPECT_EQ(quantize(-30.0f), -1.0f);
}

TEST(CombineSamplesTest, WeightedMeanWithAnEmptySample) {
  // Table rows r = [r, 10 r].  Sample 0 = {id 1 (w 1), id 3 (w 3)}, sample 1 empty, sample 2 = {id 2}.
  std::vector<float> table;
  for (int r = 0; r < 4; ++r) table.insert(table.end(), {static_cast<float>(r), 10.0f * r});
  const Feature f = RaggedFeature({0, 2, 2, 3}, {1, 3, 2}, {1.0f, 3.0f, 2.0f}, Combiner::kMean, {});
  std::vector<float> out(6, -7.0f);
  CombineSamples(f.layout, f.ids.data(), table.data(), 2, nullptr, 0, 3, out.data());
  EXPECT_EQ(out, (std::vector<float>{2.5f, 25.0f, 0.0f, 0.0f, 2.0f, 20.0f}));
  // A sub-range writes only its samples.
  std::vector<float> part(6, -7.0f);
  CombineSamples(f.layout, f.ids.data(), table.data(), 2, nullptr, 2, 3, part.data());
  EXPECT_EQ(part, (std::vector<float>{-7.0f, -7.0f, -7.0f, -7.0f, 2.0f, 20.0f}));
}

TEST(CombineSamplesTest, QuantizesEachGatheredElementBeforeWeighting) {
  std::vector<float> table = {0.3f, -0.2f, /**/ 0.9f, 5.0f};
  SimulatedQuantization q;
  q.enabled = true;
  q.lower = -1.0f;
  q.upper = 1.0f;
  q.num_buckets = 5;
  const Quantizer quantize(q);
  // Sum of 2 * Q(row 0) + 1 * Q(row 1) = 2 * [0.5, 0] + [1, 1].
  const Feature ragged = RaggedFeature({0, 2}, {0, 1}, {2.0f, 1.0f}, Combiner::kSum, {});
  std::vector<float> out(2);
  CombineSamples(ragged.layout, ragged.ids.data(), table.data(), 2, &quantize, 0, 1, out.data());
  EXPECT_EQ(out, (std::vector<float>{2.0f, 1.0f}));
  // Dense input: each sample is its one quantized row.
  const Feature dense = DenseFeature({1, 0}, {});
  std::vector<float> dense_out(4);
  CombineSamples(dense.layout, dense.ids.data(), table.data(), 2, &quantize, 0, 2, dense_out.data());
  EXPECT_EQ(dense_out, (std::vector<float>{1.0f, 1.0f, 0.5f, 0.0f}));
}

// CombineFeatureRows (what every kind of table's lookup calls) reads rows by address, in any storage type: the
// same activations as CombineSamples over one array, with the rows scattered and a missing row read as zeros.
TEST(CombineSamplesTest, FeatureRowsByAddressInEveryStorageType) {
  const std::vector<float> values = {0.5f, -2.0f, /**/ 1.25f, 3.0f, /**/ -0.75f, 8.0f};  // exact in 16 bits
  const Feature f = RaggedFeature({0, 2, 2, 3}, {2, 0, 1}, {1.0f, 3.0f, 2.0f}, Combiner::kSqrtn, {});
  std::vector<float> expected(6);
  CombineSamples(f.layout, f.ids.data(), values.data(), 2, nullptr, 0, 3, expected.data());
  for (StorageType type : {StorageType::kFloat32, StorageType::kBfloat16, StorageType::kFloat16}) {
    SCOPED_TRACE(StorageTypeName(type));
    // Each row on its own, in reverse order, as a cache's records or an arena's chunks are.
    std::vector<std::vector<char>> rows(3, std::vector<char>(2 * sizeof(float)));
    for (int r = 0; r < 3; ++r) {
      for (int d = 0; d < 2; ++d) {
        const float x = values[r * 2 + d];
        if (type == StorageType::kFloat32) {
          std::memcpy(rows[2 - r].data() + d * 4, &x, 4);
        } else {
          const uint16_t bits = type == StorageType::kBfloat16 ? FloatToBfloat16Nearest(x) : FloatToFloat16Nearest(x);
          std::memcpy(rows[2 - r].data() + d * 2, &bits, 2);
        }
      }
    }
    const auto row_address = [&](int64_t i) -> const void* { return rows[2 - f.ids[i]].data(); };
    std::vector<float> out(6, -7.0f);
    CombineFeatureRows(f.layout, type, row_address, 2, nullptr, 0, 3, out.data());
    EXPECT_EQ(out, expected);
    // A key without a row (here id 2's) reads a row of zeros: as a table whose row 2 is zero.
    std::vector<float> zeroed = values;
    zeroed[4] = zeroed[5] = 0.0f;
    std::vector<float> expected_zeroed(6);
    CombineSamples(f.layout, f.ids.data(), zeroed.data(), 2, nullptr, 0, 3, expected_zeroed.data());
    const std::vector<char> zeros(8, 0);
    const auto missing = [&](int64_t i) -> const void* { return f.ids[i] == 2 ? zeros.data() : row_address(i); };
    CombineFeatureRows(f.layout, type, missing, 2, nullptr, 0, 3, out.data());
    EXPECT_EQ(out, expected_zeroed);
  }
}

}  // namespace
}  // namespace tf_embed_ops
