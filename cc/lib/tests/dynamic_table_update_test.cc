// The optimizer step of dynamic tables (docs/dynamic_tables_internals.md) through the static tables' row
// pipeline: bitwise equal to a static table, empty tables and plans, non-lazy updates, keys without a row.
#include "cc/lib/dynamic_table_update.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "cc/lib/dynamic_table.h"
#include "cc/lib/dynamic_table_init.h"
#include "cc/lib/feature_layout.h"
#include "cc/lib/gradient_accumulation.h"
#include "cc/lib/storage_types.h"
#include "cc/lib/table_update.h"
#include "cc/lib/tests/dynamic_table_test_util.h"
#include "cc/lib/tests/feature_test_util.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace dynamic_test {
namespace {

// --- The optimizer step: the static tables' row pipeline ---------------------------------------------------

ShardFn Serial() {
  return [](int64_t total, int64_t, const std::function<void(int64_t, int64_t)>& fn) { fn(0, total); };
}

ShardFn TwoThreads() {
  return [](int64_t total, int64_t, const std::function<void(int64_t, int64_t)>& fn) {
    std::thread other([&] { fn(0, total / 2); });
    fn(total / 2, total);
    other.join();
  };
}

// A static table of V rows and a dynamic table fed keys 0..V-1 (in shuffled order, so rows != keys) start from
// the same rows; each step the same ids and gradients go through UpdateTable and UpdateDynamicTable.  Every
// row and slot must stay bitwise equal, per key.  With 1,024 rows a chunk the table is one dense array (a lazy
// step walks it as a static table's); with 4, it grows chunk by chunk from separate allocations (most likely
// not adjacent: the chunked walk, or rows reached partly directly and partly through the directory).
void ExpectStaticAndDynamicTrainAlike(const TableOptimization& o, const ShardFn& shard, int64_t rows_per_chunk) {
  constexpr int64_t kV = 40, kDim = 5;
  const std::vector<SlotInfo> slot_info = OptimizerSlots(o.optimizer);
  DynamicTableOptions options = Options(kDim, 8, kV);
  options.rows_per_chunk = rows_per_chunk;
  options.initializer.kind = RowInitializerKind::kNormal;
  options.initializer.stddev = 0.3f;
  for (const SlotInfo& s : slot_info) {
    options.slot_initial_values.push_back(s.default_initial_value);
    options.slot_widths.push_back(SlotWidth(s, kDim));
  }
  auto dyn = Make(options);
  std::vector<int64_t> keys(kV);
  std::iota(keys.begin(), keys.end(), 0);
  std::mt19937_64 rng(23);
  std::shuffle(keys.begin(), keys.end(), rng);
  for (int64_t k = 0; k < kV; k += 12)
    Insert(dyn.get(), std::vector<int64_t>(keys.begin() + k, keys.begin() + std::min(k + 12, kV)));
  ASSERT_EQ(dyn->size(), kV);
  if (rows_per_chunk >= kV) EXPECT_TRUE(dyn->DenseFloat32Rows());

  std::vector<float> weights(kV * kDim);
  std::vector<std::vector<float>> slots;
  for (const SlotInfo& s : slot_info) slots.emplace_back(kV * SlotWidth(s, kDim), s.default_initial_value);
  for (int64_t k = 0; k < kV; ++k) std::copy_n(dyn->Weights(FindRows(*dyn, {k})[0]), kDim, weights.data() + k * kDim);
  TableBuffers buffers{weights.data(), {}, kV, kDim};
  for (auto& s : slots) buffers.slots.push_back(s.data());

  std::uniform_int_distribution<int64_t> id(0, kV - 1);
  std::normal_distribution<float> grad(0.0f, 1.0f);
  for (int step = 0; step < 4; ++step) {
    // Zipf-like repeats: a third of the ids are 3.
    std::vector<int64_t> ids(30);
    for (int64_t& i : ids) i = rng() % 3 == 0 ? 3 : id(rng);
    std::vector<float> g(ids.size() * kDim);
    for (float& x : g) x = grad(rng);
    const float lr = 0.05f * (step + 1);

    std::vector<testing_util::Feature> st = {testing_util::DenseFeature(ids, g)};
    std::vector<GradientSource> st_sources = {{st[0].ids.data(), 30, &st[0].layout, st[0].gradient.data()}};
    RowGradientPlan st_plan;
    st_plan.Build(&st_sources);
    UpdateTable(o, lr, st_plan, buffers, shard);

    std::vector<testing_util::Feature> dy = {testing_util::DenseFeature(Insert(dyn.get(), ids, step), g)};
    std::vector<GradientSource> dy_sources = {{dy[0].ids.data(), 30, &dy[0].layout, dy[0].gradient.data()}};
    RowGradientPlan dy_plan;
    dy_plan.Build(&dy_sources);
    UpdateDynamicTable(o, lr, dy_plan, dyn.get(), shard);
  }
  for (int64_t k = 0; k < kV; ++k) {
    const int64_t row = FindRows(*dyn, {k})[0];
    EXPECT_EQ(std::memcmp(dyn->Weights(row), weights.data() + k * kDim, kDim * sizeof(float)), 0)
        << OptimizerName(o.optimizer) << " key " << k;
    for (size_t s = 0; s < slots.size(); ++s) {
      const int64_t w = SlotWidth(slot_info[s], kDim);
      ASSERT_EQ(dyn->slot_width(static_cast<int64_t>(s)), w);
      EXPECT_EQ(std::memcmp(dyn->Slot(static_cast<int64_t>(s), row), slots[s].data() + k * w, w * sizeof(float)), 0)
          << OptimizerName(o.optimizer) << " slot " << s << " key " << k;
    }
  }
}

TEST(DynamicTableUpdateTest, TrainsBitwiseLikeAStaticTable) {
  Adam non_lazy;
  non_lazy.use_non_lazy_adam = true;
  Ftrl ftrl;
  ftrl.l1 = 0.01f;
  ftrl.l2 = 0.1f;
  Momentum momentum;
  // RowWiseAdagrad: one accumulator per row (a width-1 slot), addressed like the static [vocabulary_size, 1] slot.
  const std::vector<OptimizerParams> optimizers = {Sgd{}, Adagrad{}, Adam{},          non_lazy,
                                                   ftrl,  momentum,  RowWiseAdagrad{}};
  for (const OptimizerParams& p : optimizers) {
    TableOptimization o;
    o.optimizer = p;
    o.gradient_clipping = {-1.5f, 1.5f};
    o.weight_decay_factor = 0.01f;
    o.weight_clipping = {-2.0f, 2.0f};
    for (const ShardFn& shard : {Serial(), TwoThreads()}) {
      for (const int64_t rows_per_chunk : {1024, 4}) ExpectStaticAndDynamicTrainAlike(o, shard, rows_per_chunk);
    }
  }
}

TEST(DynamicTableUpdateTest, DenseFloat32RowsOnlyForAFloat32TableInOneArray) {
  EXPECT_FALSE(Make(Options(4, 8))->DenseFloat32Rows());  // no row yet
  auto one_array = Make(Options(4, 8));
  Insert(one_array.get(), {5, 6, 7});
  EXPECT_TRUE(one_array->DenseFloat32Rows());
  DynamicTableOptions half = Options(4, 8);
  half.slot_initial_values = {0.1f};
  half.slot_storage = StorageType::kBfloat16;
  auto sixteen_bit_slot = Make(half);
  Insert(sixteen_bit_slot.get(), {5});
  EXPECT_FALSE(sixteen_bit_slot->DenseFloat32Rows());
  DynamicTableOptions external = Options(4, 8);
  external.external_rows = true;
  auto elsewhere = Make(external);
  Insert(elsewhere.get(), {5});
  EXPECT_FALSE(elsewhere->DenseFloat32Rows());
}

TEST(DynamicTableUpdateTest, DenseWeightsAreEveryRowsAddressFromRowZeroOrNull) {
  EXPECT_EQ(Make(Options(4, 8))->DenseWeights(), nullptr);  // no row yet
  // 16-bit weights too: the address counts elements of the table's storage type.
  for (const StorageType storage : {StorageType::kFloat32, StorageType::kBfloat16}) {
    DynamicTableOptions options = Options(4, 8);
    options.storage = storage;
    auto t = Make(options);
    Insert(t.get(), {15, 16, 17, 18, 19});
    const char* dense = static_cast<const char*>(t->DenseWeights());
    ASSERT_NE(dense, nullptr);
    for (int64_t row = 0; row < t->row_bound(); ++row)
      EXPECT_EQ(t->BufferRow(0, row), dense + row * 4 * StorageBytes(storage)) << row;
  }
  // Rows past the first chunk, from separate allocations: the table is not one array (or, should the allocator
  // have put the chunks end to end, every row's address is still the array's).
  DynamicTableOptions chunked = Options(4, 2, 100);
  chunked.rows_per_chunk = 2;
  auto grown = Make(chunked);
  for (int64_t k = 0; k < 12; k += 3) Insert(grown.get(), {k, k + 1, k + 2});
  if (const char* dense = static_cast<const char*>(grown->DenseWeights()); dense != nullptr) {
    for (int64_t row = 0; row < grown->row_bound(); ++row)
      EXPECT_EQ(grown->BufferRow(0, row), dense + row * 4 * sizeof(float)) << row;
  }
  DynamicTableOptions external = Options(4, 8);
  external.external_rows = true;
  auto elsewhere = Make(external);
  Insert(elsewhere.get(), {5});
  EXPECT_EQ(elsewhere->DenseWeights(), nullptr);
}

TEST(DynamicTableUpdateTest, EmptyTableAndEmptyPlan) {
  // A non-lazy optimizer walks the live rows: none here, and an empty plan; nothing to do and nothing read.
  Adam non_lazy;
  non_lazy.use_non_lazy_adam = true;
  for (const OptimizerParams& p : {OptimizerParams{non_lazy}, OptimizerParams{Adagrad{}}}) {
    TableOptimization o;
    o.optimizer = p;
    DynamicTableOptions options = Options(3, 1, 10);
    options.slot_initial_values.assign(OptimizerSlots(p).size(), 0.1f);
    auto t = Make(options);
    const std::vector<GradientSource> sources;
    RowGradientPlan plan;
    plan.Build(&sources);
    for (const ShardFn& shard : {Serial(), TwoThreads()}) UpdateDynamicTable(o, 0.1f, plan, t.get(), shard);
    EXPECT_EQ(t->size(), 0);
  }
}

TEST(DynamicTableUpdateTest, NonLazyUpdateReachesUntouchedLiveRowsOnly) {
  // Non-lazy Adam moves an untouched row through its momentum; evicted rows are not live and are not visited.
  Adam non_lazy;
  non_lazy.use_non_lazy_adam = true;
  TableOptimization o;
  o.optimizer = non_lazy;
  DynamicTableOptions options = Options(1, 4, 10);
  options.initializer.kind = RowInitializerKind::kZeros;
  options.slot_initial_values = {1.0f, 1.0f};  // momentum 1: an untouched row still moves
  auto t = Make(options);
  const std::vector<int64_t> rows = Insert(t.get(), {1, 2, 3});
  ASSERT_EQ(t->EvictKeys(std::vector<int64_t>{3}.data(), 1), 1);
  const std::vector<GradientSource> sources;
  RowGradientPlan plan;
  plan.Build(&sources);
  UpdateDynamicTable(o, 0.5f, plan, t.get(), Serial());
  // m = 0.9, v = 0.999, w = -0.5 * 0.9 / sqrt(0.999 + 1e-14): the pipeline's own numbers, computed here.
  const float m = 0.9f * 1.0f + 0.1f * 0.0f;
  const float v = 0.999f * 1.0f + (1.0f - 0.999f) * 0.0f;
  const float w = 0.0f - 0.5f * m / std::sqrt(v + 1e-7f * 1e-7f);
  EXPECT_EQ(*t->Weights(rows[0]), w);
  EXPECT_EQ(*t->Weights(rows[1]), w);
  EXPECT_EQ(*t->Slot(0, rows[0]), m);
  EXPECT_EQ(*t->Slot(1, rows[1]), v);
  EXPECT_EQ(*t->Slot(0, rows[2]), 1.0f);  // the evicted row's memory was not touched
}

TEST(DynamicTableUpdateTest, ATrackedTableHasTheRowsItsWalkWroteMarked) {
  // docs/tracking.md: the step is one update of the table's tracker, its rows marked by the walk itself.
  TableOptimization o;
  o.optimizer = Adagrad{};
  DynamicTableOptions options = Options(3, 4, 100);
  options.slot_initial_values = {0.1f};
  for (const ShardFn& shard : {Serial(), TwoThreads()}) {
    auto t = Make(options);
    const std::vector<int64_t> rows = Insert(t.get(), {11, 12, 13, 14, 15, 16, 17, 18, 19, 20});
    ASSERT_TRUE(t->EnableTracking());
    TouchedRows* touched = t->tracker();
    const int64_t before = touched->version();
    std::vector<testing_util::Feature> f = {
        testing_util::DenseFeature({rows[7], rows[2], rows[7], rows[5]}, {1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4})};
    std::vector<GradientSource> sources = {{f[0].ids.data(), 4, &f[0].layout, f[0].gradient.data()}};
    RowGradientPlan plan;
    plan.Build(&sources);
    UpdateDynamicTable(o, 0.5f, plan, t.get(), shard);
    EXPECT_EQ(touched->version(), before + 1);
    std::vector<int64_t> expected = {rows[2], rows[5], rows[7]};
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(touched->Since(before, touched->capacity()).rows, expected);
  }
}

TEST(DynamicTableUpdateTest, KeysWithoutARowContributeNothing) {
  // The ops map keys without a row to kNotAdmitted (-1) and build the plan over that: those ids must neither
  // reach a row nor shift the other ids' contributions.  Same update with and without them, bitwise.
  TableOptimization o;
  o.optimizer = Adagrad{};
  DynamicTableOptions options = Options(2, 4, 10);
  options.initializer.kind = RowInitializerKind::kUniform;
  options.initializer.minval = -1.0f;
  options.initializer.maxval = 1.0f;
  options.slot_initial_values = {0.1f};
  auto with_missing = Make(options);
  auto without = Make(options);
  const std::vector<int64_t> rows_a = Insert(with_missing.get(), {5, 6});
  const std::vector<int64_t> rows_b = Insert(without.get(), {5, 6});
  const int64_t r5 = rows_a[0], r6 = rows_a[1];
  ASSERT_EQ(rows_b, rows_a);
  // Ids 5, -1, 6, -1, 5 with gradients 1..5 (per id, dim 2) vs ids 5, 6, 5 with gradients 1, 3, 5.
  std::vector<testing_util::Feature> a = {testing_util::DenseFeature(
      {r5, DynamicTable::kNotAdmitted, r6, DynamicTable::kNotAdmitted, r5}, {1, 1, 2, 2, 3, 3, 4, 4, 5, 5})};
  std::vector<testing_util::Feature> b = {testing_util::DenseFeature({r5, r6, r5}, {1, 1, 3, 3, 5, 5})};
  std::vector<GradientSource> a_sources = {{a[0].ids.data(), 5, &a[0].layout, a[0].gradient.data()}};
  std::vector<GradientSource> b_sources = {{b[0].ids.data(), 3, &b[0].layout, b[0].gradient.data()}};
  RowGradientPlan a_plan, b_plan;
  // As the ops build it: bounded by the table's row bound (the dense index); the plan without them hashes.
  ASSERT_TRUE(RowGradientPlan::UsesDenseIndex(with_missing->row_bound(), 5));
  a_plan.Build(&a_sources, with_missing->row_bound());
  b_plan.Build(&b_sources);
  ASSERT_EQ(a_plan.num_rows(), 2);
  UpdateDynamicTable(o, 0.5f, a_plan, with_missing.get(), Serial());
  UpdateDynamicTable(o, 0.5f, b_plan, without.get(), Serial());
  const DynamicTableContents x = with_missing->Export(), y = without->Export();
  EXPECT_EQ(x.weights, y.weights);
  EXPECT_EQ(x.slots, y.slots);
  EXPECT_NE(x.weights, Make(options)->Export().weights);  // (the rows did move)
}

}  // namespace
}  // namespace dynamic_test
}  // namespace tf_embed_ops
