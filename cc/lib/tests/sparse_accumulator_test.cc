// The TensorFlow-free core of the sparse conditional accumulator: SparseRowSum's canonical aggregation (each
// gradient's duplicate indices summed first, per-row counts, rows extracted in ascending order, optionally
// divided by their own count), its memory reuse and sharding, the index table and radix sort under it, the
// gradient validation and its messages, and the deadline timer (docs/sparse_accumulator.md).
#include "cc/lib/sparse_accumulator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cc/lib/sparse_accumulator_deadline_timer.h"
#include "cc/lib/sparse_accumulator_validation.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace {

template <typename T>
struct Extracted {
  std::vector<int64_t> indices;
  std::vector<T> values;
};

template <typename T>
Extracted<T> Extract(const SparseRowSum<T>& sum, bool mean, const ShardFn& shard = nullptr) {
  Extracted<T> out;
  out.indices.resize(sum.num_rows());
  out.values.resize(sum.num_rows() * sum.row_width());
  sum.Extract(mean, out.indices.data(), out.values.data(), shard);
  return out;
}

template <typename T>
void Add(SparseRowSum<T>* sum, const std::vector<int64_t>& indices, const std::vector<T>& values,
         const ShardFn& shard = nullptr) {
  ASSERT_EQ(values.size(), indices.size() * sum->row_width());
  sum->Add(indices.data(), static_cast<int64_t>(indices.size()), values.data(), shard);
}

TEST(SparseRowSumTest, SumAndPerRowMeanOfSortedGradients) {
  SparseRowSum<float> sum(2);
  Add(&sum, {1, 4}, {1.0f, 2.0f, /**/ 3.0f, 4.0f});
  Add(&sum, {4, 6}, {10.0f, 20.0f, /**/ 5.0f, 5.0f});
  ASSERT_EQ(sum.num_rows(), 3);
  const Extracted<float> total = Extract(sum, false);
  EXPECT_EQ(total.indices, (std::vector<int64_t>{1, 4, 6}));
  EXPECT_EQ(total.values, (std::vector<float>{1.0f, 2.0f, 13.0f, 24.0f, 5.0f, 5.0f}));
  // MEAN is per row: row 4 was touched by two gradients, rows 1 and 6 by one.
  const Extracted<float> mean = Extract(sum, true);
  EXPECT_EQ(mean.values, (std::vector<float>{1.0f, 2.0f, 6.5f, 12.0f, 5.0f, 5.0f}));
}

TEST(SparseRowSumTest, DuplicatesWithinAGradientCountOnceAndRowsComeOutSorted) {
  SparseRowSum<float> sum(1);
  Add(&sum, {5, 2, 5}, {2.0f, 7.0f, 4.0f});
  Add(&sum, {5}, {10.0f});
  const Extracted<float> mean = Extract(sum, true);
  EXPECT_EQ(mean.indices, (std::vector<int64_t>{2, 5}));
  // Row 5: (2 + 4) + 10 over 2 gradients.
  EXPECT_EQ(mean.values, (std::vector<float>{7.0f, 8.0f}));
}

TEST(SparseRowSumTest, ARepeatedIndexIsSummedAmongItselfBeforeTheHeldRow) {
  // float32 spacing at 1e8 is 8: 1e8 + 3 + 3 added one by one stays 1e8, but 1e8 + (3 + 3) rounds to 1e8 + 8.
  SparseRowSum<float> sum(1);
  Add(&sum, {0}, {1e8f});
  Add(&sum, {0, 0}, {3.0f, 3.0f});
  EXPECT_EQ(Extract(sum, false).values, (std::vector<float>{100000008.0f}));
}

TEST(SparseRowSumTest, ClearStartsANewRoundReusingMemory) {
  SparseRowSum<float> sum(3);
  std::vector<int64_t> indices(50000);
  for (int64_t i = 0; i < 50000; ++i) indices[i] = 50000 - i;  // descending: the sorted extract path
  Add(&sum, indices, std::vector<float>(3 * 50000, 1.0f));
  EXPECT_EQ(sum.num_rows(), 50000);
  sum.Clear();
  EXPECT_EQ(sum.num_rows(), 0);
  Add(&sum, {9, 3}, {1.0f, 2.0f, 3.0f, /**/ 4.0f, 5.0f, 6.0f});
  const Extracted<float> out = Extract(sum, true);
  EXPECT_EQ(out.indices, (std::vector<int64_t>{3, 9}));
  EXPECT_EQ(out.values, (std::vector<float>{4.0f, 5.0f, 6.0f, 1.0f, 2.0f, 3.0f}));
}

TEST(SparseRowSumTest, ZeroWidthRowsKeepOnlyIndices) {
  SparseRowSum<float> sum(0);
  Add(&sum, {8, 1, 8}, {});
  EXPECT_EQ(Extract(sum, true).indices, (std::vector<int64_t>{1, 8}));
}

TEST(SparseRowSumTest, OtherTypes) {
  SparseRowSum<double> d(1);
  Add(&d, {3, 1}, {0.1, 0.2});
  Add(&d, {3}, {0.3});
  EXPECT_EQ(Extract(d, false).values, (std::vector<double>{0.2, 0.1 + 0.3}));
  SparseRowSum<int32_t> i(2);
  Add(&i, {2}, {7, 8});
  Add(&i, {2}, {1, 1});
  EXPECT_EQ(Extract(i, true).values, (std::vector<int32_t>{4, 4}));  // integer division by the count
}

// Random rounds against a std::map model (canonical: per-gradient duplicates summed first), with every
// sharding giving bitwise the same result.
TEST(SparseRowSumTest, RandomRoundsMatchAModelForAnySharding) {
  const ShardFn reversed_blocks = [](int64_t total, int64_t, const std::function<void(int64_t, int64_t)>& fn) {
    for (int64_t end = total; end > 0; end -= 5) fn(std::max<int64_t>(0, end - 5), end);
  };
  std::mt19937_64 rng(3);
  constexpr int64_t kWidth = 5;
  SparseRowSum<float> serial(kWidth), sharded(kWidth);
  std::map<int64_t, std::pair<std::vector<float>, int>> model;
  for (int round = 0; round < 30; ++round) {
    const int64_t n = static_cast<int64_t>(rng() % 200);
    const bool sorted_unique = round % 3 == 0;
    std::vector<int64_t> indices(n);
    for (int64_t& x : indices) x = static_cast<int64_t>(rng() % 500);
    if (sorted_unique) {
      std::sort(indices.begin(), indices.end());
      indices.erase(std::unique(indices.begin(), indices.end()), indices.end());
    }
    std::vector<float> values(indices.size() * kWidth);
    for (float& v : values) v = static_cast<float>(static_cast<int64_t>(rng() % 2001) - 1000) / 64.0f;
    Add(&serial, indices, values);
    Add(&sharded, indices, values, reversed_blocks);
    std::map<int64_t, std::vector<float>> canonical;
    for (size_t k = 0; k < indices.size(); ++k) {
      auto [it, fresh] =
          canonical.try_emplace(indices[k], values.begin() + k * kWidth, values.begin() + (k + 1) * kWidth);
      if (!fresh) {
        for (int64_t j = 0; j < kWidth; ++j) it->second[j] += values[k * kWidth + j];
      }
    }
    for (const auto& [index, row] : canonical) {
      auto [it, fresh] = model.try_emplace(index, row, 1);
      if (!fresh) {
        for (int64_t j = 0; j < kWidth; ++j) it->second.first[j] += row[j];
        ++it->second.second;
      }
    }
  }
  const Extracted<float> a = Extract(serial, true), b = Extract(sharded, true, reversed_blocks);
  ASSERT_EQ(a.indices.size(), model.size());
  size_t r = 0;
  for (const auto& [index, row_count] : model) {
    EXPECT_EQ(a.indices[r], index);
    for (int64_t j = 0; j < kWidth; ++j) {
      EXPECT_EQ(a.values[r * kWidth + j], row_count.first[j] / static_cast<float>(row_count.second)) << index;
    }
    ++r;
  }
  EXPECT_EQ(a.indices, b.indices);
  EXPECT_EQ(std::memcmp(a.values.data(), b.values.data(), a.values.size() * sizeof(float)), 0);
}

TEST(SparseAccumulatorInternalsTest, SortedOrderIsAStableSortOfSignedKeys) {
  namespace internal = sparse_accumulator_internal;
  const std::vector<int64_t> keys = {
      5, -3, std::numeric_limits<int64_t>::max(), 5, std::numeric_limits<int64_t>::min(), 0, 1 << 20, -3};
  EXPECT_EQ(internal::SortedOrder(keys), (std::vector<int64_t>{4, 1, 7, 5, 0, 3, 6, 2}));
  EXPECT_TRUE(internal::SortedOrder({}).empty());
}

TEST(SparseAccumulatorInternalsTest, IndexSlotTableKeepsEntriesAcrossGrowth) {
  sparse_accumulator_internal::IndexSlotTable table;
  table.Reserve(10);
  for (int64_t k = 0; k < 10; ++k) EXPECT_EQ(table.FindOrInsert(k << 40, k), k);
  table.Reserve(1000);  // rehash
  for (int64_t k = 10; k < 1000; ++k) EXPECT_EQ(table.FindOrInsert(k << 40, k), k);
  EXPECT_EQ(table.size(), 1000);
  for (int64_t k = 0; k < 1000; ++k) {
    EXPECT_EQ(table.Find(k << 40), k);
    EXPECT_EQ(table.FindOrInsert(k << 40, -5), k);  // held: the existing slot
  }
  EXPECT_EQ(table.Find(7), -1);
  table.Clear();
  EXPECT_EQ(table.size(), 0);
  EXPECT_EQ(table.Find(0), -1);
}

// --- validation -------------------------------------------------------------------------------------------

struct Gradient {
  std::vector<int64_t> indices_dims;
  std::vector<int64_t> indices;
  std::vector<int64_t> values_dims;
  bool has_known_shape = false;
  std::vector<int64_t> shape;

  SparseGradientView View() const {
    SparseGradientView v;
    v.indices_dims = indices_dims;
    v.indices = indices.data();
    v.values_dims = values_dims;
    v.has_known_shape = has_known_shape;
    v.gradient_shape = shape.data();
    v.gradient_shape_size = static_cast<int64_t>(shape.size());
    return v;
  }
};

Gradient Grad(std::vector<int64_t> indices, std::vector<int64_t> values_dims) {
  Gradient g;
  g.indices_dims = {static_cast<int64_t>(indices.size())};
  g.indices = std::move(indices);
  g.values_dims = std::move(values_dims);
  return g;
}

AccumulatorShape Shape(std::vector<int64_t> dims) { return AccumulatorShape{true, std::move(dims)}; }

TEST(ValidateSparseGradientTest, AcceptsAValidGradient) {
  EXPECT_EQ(ValidateSparseGradient(Shape({10, 3}), Grad({0, 9}, {2, 3}).View(), nullptr), "");
  EXPECT_EQ(ValidateSparseGradient(AccumulatorShape{}, Grad({123456}, {1, 4, 2}).View(), nullptr), "");  // unknown rank
  EXPECT_EQ(ValidateSparseGradient(Shape({-1, 3}), Grad({1 << 30}, {1, 3}).View(), nullptr), "");  // unknown dim 0
}

TEST(ValidateSparseGradientTest, MessagesInTensorFlowsOrder) {
  Gradient matrix = Grad({0}, {1, 3});
  matrix.indices_dims = {1, 1};
  EXPECT_EQ(ValidateSparseGradient(Shape({10, 3}), matrix.View(), nullptr),
            "Input indices should be vector but received shape: [1,1]");
  EXPECT_EQ(ValidateSparseGradient(Shape({10, 3}), Grad({0}, {}).View(), nullptr), "Values cannot be 0-dimensional.");
  EXPECT_EQ(ValidateSparseGradient(Shape({10, 3}), Grad({0, 1}, {3, 3}).View(), nullptr),
            "Expected 2 non-empty input values, got 3");
  Gradient shaped = Grad({0}, {1, 3});
  shaped.has_known_shape = true;
  shaped.shape = {10};
  EXPECT_EQ(ValidateSparseGradient(Shape({10, 3}), shaped.View(), nullptr),
            "Shape mismatch: expected shape rank at least 2, got 1");
  shaped.shape = {10, 4};
  EXPECT_EQ(ValidateSparseGradient(Shape({10, 3}), shaped.View(), nullptr),
            "Shape mismatch: expected shape dim 1 to be 3, got 4");
  EXPECT_EQ(ValidateSparseGradient(Shape({10, 3}), Grad({4, -2}, {2, 3}).View(), nullptr),
            "gradient_indices[1] = -2 is negative; indices must be in [0, 10)");
  EXPECT_EQ(ValidateSparseGradient(Shape({-1, 3}), Grad({-2}, {1, 3}).View(), nullptr),
            "gradient_indices[0] = -2 is negative; indices must be in [0, inf)");
  EXPECT_EQ(ValidateSparseGradient(Shape({10, 3}), Grad({9, 10}, {2, 3}).View(), nullptr),
            "Shape mismatch: index of slice 1 exceeded limits of shape; index is 10 exceeded 10");
  EXPECT_EQ(ValidateSparseGradient(Shape({10, 3}), Grad({1}, {1}).View(), nullptr),
            "Shape mismatch: expected values rank at least 2, got 1");
  EXPECT_EQ(ValidateSparseGradient(Shape({10, 3}), Grad({1}, {1, 2}).View(), nullptr),
            "Shape mismatch: expected values dim 1 to be 3, got 2");
}

TEST(ValidateSparseGradientTest, AHeldGradientFixesRankAndTrailingDims) {
  const std::vector<int64_t> held = {4, 3};
  EXPECT_EQ(ValidateSparseGradient(AccumulatorShape{}, Grad({1}, {1, 3}).View(), &held), "");
  EXPECT_EQ(ValidateSparseGradient(AccumulatorShape{}, Grad({1}, {1, 3, 1}).View(), &held),
            "Shape mismatch: expected values rank 2, got 3");
  EXPECT_EQ(ValidateSparseGradient(AccumulatorShape{}, Grad({1}, {1, 2}).View(), &held),
            "Shape mismatch: expected values dim 1 to be 3, got 2");
}

TEST(TakeOutputShapeTest, DimZeroFromTheAccumulatorShapeTheRestFromTheHeldValues) {
  EXPECT_EQ(TakeOutputShape(Shape({10, -1}), {4, 3}), (std::vector<int64_t>{10, 3}));
  EXPECT_EQ(TakeOutputShape(Shape({-1, 3}), {4, 3}), (std::vector<int64_t>{-1, 3}));
  EXPECT_EQ(TakeOutputShape(AccumulatorShape{}, {4, 3, 2}), (std::vector<int64_t>{-1, 3, 2}));
}

// --- deadline timer ---------------------------------------------------------------------------------------

TEST(DeadlineTimerTest, RunsDueCallbacksAndNotCancelledOnes) {
  DeadlineTimer& timer = DeadlineTimer::Global();
  std::atomic<int> ran{0};
  std::atomic<bool> cancelled_ran{false};
  const auto now = DeadlineTimer::Clock::now();
  const DeadlineTimer::Id cancelled =
      timer.Schedule(now + std::chrono::seconds(30), [&cancelled_ran] { cancelled_ran = true; });
  const DeadlineTimer::Id soon = timer.Schedule(now + std::chrono::milliseconds(1), [&ran] { ++ran; });
  EXPECT_TRUE(timer.Cancel(cancelled));
  EXPECT_FALSE(timer.Cancel(cancelled));  // already removed
  const auto give_up = DeadlineTimer::Clock::now() + std::chrono::seconds(10);
  while (ran.load() == 0 && DeadlineTimer::Clock::now() < give_up) std::this_thread::yield();
  EXPECT_EQ(ran.load(), 1);
  EXPECT_FALSE(timer.Cancel(soon));  // it ran
  EXPECT_FALSE(cancelled_ran.load());
}

}  // namespace
}  // namespace tf_embed_ops
