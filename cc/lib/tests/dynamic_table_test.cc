// The TensorFlow-free core of dynamic-vocabulary tables (docs/dynamic_tables_internals.md): Create's validation,
// FindOrInsert with admission and max_rows, determinism, and memory per row.  Eviction, export/import and the
// optimizer step have their own files (dynamic_table_eviction_test.cc, dynamic_table_export_test.cc,
// dynamic_table_update_test.cc).
#include "cc/lib/dynamic_table.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cc/lib/dynamic_table_init.h"
#include "cc/lib/dynamic_table_key.h"
#include "cc/lib/tests/dynamic_table_test_util.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace dynamic_test {
namespace {

// --- Create: validation ------------------------------------------------------------------------------------

TEST(DynamicTableTest, CreateValidatesEveryOptionAndNamesTheTable) {
  struct Case {
    std::function<void(DynamicTableOptions*)> change;
    std::vector<std::string> message;
  };
  const std::vector<Case> cases = {
      {[](auto* o) { o->dim = 0; }, {"'items'", "dim", "got 0"}},
      {[](auto* o) { o->dim = -4; }, {"dim", "got -4"}},
      {[](auto* o) { o->dim = DynamicTable::kMaxDim + 1; }, {"dim", "1048577"}},
      {[](auto* o) { o->max_rows = 0; }, {"max_rows", "got 0"}},
      {[](auto* o) { o->max_rows = int64_t{1} << 31; }, {"max_rows", "2147483648"}},
      {[](auto* o) { o->initial_capacity = 0; }, {"initial_capacity", "got 0"}},
      {[](auto* o) { o->initial_capacity = -1; }, {"initial_capacity", "got -1"}},
      {[](auto* o) { o->initial_capacity = 1001; }, {"initial_capacity", "max_rows = 1000", "1001"}},
      {[](auto* o) { o->rows_per_chunk = 3; }, {"rows_per_chunk", "got 3"}},
      {[](auto* o) { o->rows_per_chunk = 0; }, {"rows_per_chunk", "got 0"}},
      {[](auto* o) { o->slot_initial_values = {0.1f, std::nanf("")}; }, {"slot 1", "nan"}},
      {[](auto* o) { o->slot_initial_values.assign(17, 0.0f); }, {"slots", "17"}},
      {[](auto* o) { o->initializer.minval = 2.0f; }, {"'items'", "minval"}},
      {[](auto* o) { o->admission.min_count = 0; }, {"min_count", "got 0"}},
      {[](auto* o) { o->admission.min_count = 3; }, {"min_count = 3", "max_pending_keys", "got 0"}},
      {[](auto* o) { o->admission.pending_ttl_steps = -2; }, {"pending_ttl_steps", "-2"}},
      {[](auto* o) { o->eviction = {EvictionPolicy::kLru, 0, 0}; }, {"target_rows", "got 0"}},
      {[](auto* o) { o->eviction = {EvictionPolicy::kLfu, 1001, 0}; }, {"target_rows", "1001"}},
      {[](auto* o) { o->eviction = {EvictionPolicy::kTtl, 0, -1}; }, {"ttl_steps", "got -1"}},
  };
  for (const Case& c : cases) {
    DynamicTableOptions o = Options();
    c.change(&o);
    absl::StatusOr<std::unique_ptr<DynamicTable>> t = DynamicTable::Create(o);
    ExpectInvalid(t.status(), c.message);
  }
}

// --- FindOrInsert and Find ---------------------------------------------------------------------------------

TEST(DynamicTableTest, NewKeysGetRowsInitialisedFromTheKey) {
  DynamicTableOptions o = Options();
  o.slot_initial_values = {0.1f, -2.0f};
  auto t = Make(o);
  const std::vector<int64_t> keys = {42, 0, -7, std::numeric_limits<int64_t>::min(),
                                     std::numeric_limits<int64_t>::max()};
  BatchStats stats;
  const std::vector<int64_t> rows = Insert(t.get(), keys, 3, &stats);
  EXPECT_EQ(stats.inserts, 5);
  EXPECT_EQ(t->size(), 5);
  EXPECT_EQ(t->counters().inserts, 5);
  std::set<int64_t> distinct(rows.begin(), rows.end());
  EXPECT_EQ(distinct.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_GE(rows[i], 0);
    EXPECT_EQ(t->KeyOf(rows[i]), keys[i]);
    EXPECT_EQ(t->CountOf(rows[i]), 1);
    EXPECT_EQ(t->LastStepOf(rows[i]), 3);
    EXPECT_EQ(RowOf(*t, rows[i]), InitialRow(o.initializer, keys[i], 4));
    EXPECT_EQ(std::vector<float>(t->Slot(0, rows[i]), t->Slot(0, rows[i]) + 4), std::vector<float>(4, 0.1f));
    EXPECT_EQ(std::vector<float>(t->Slot(1, rows[i]), t->Slot(1, rows[i]) + 4), std::vector<float>(4, -2.0f));
  }
  EXPECT_EQ(FindRows(*t, keys), rows);
  // A second lookup finds the same rows and creates nothing.
  EXPECT_EQ(Insert(t.get(), keys, 4), rows);
  EXPECT_EQ(t->size(), 5);
  EXPECT_EQ(t->counters().inserts, 5);
  EXPECT_EQ(t->CountOf(rows[0]), 2);
}

TEST(DynamicTableTest, EmptyBatchChangesNothing) {
  auto t = Make(Options());
  Insert(t.get(), {1, 2});
  const DynamicTableContents before = t->Export();
  BatchStats stats{9, 9, 9, 9};
  EXPECT_TRUE(t->FindOrInsert(nullptr, 0, 5, nullptr, &stats).ok());
  EXPECT_EQ(stats.inserts + stats.below_admission + stats.untracked + stats.refused_full, 0);
  t->Find(nullptr, 0, nullptr);
  ExpectSameContents(before, t->Export());
}

TEST(DynamicTableTest, DuplicatesInABatchShareOneRowAndAllCount) {
  auto t = Make(Options());
  const std::vector<int64_t> rows = Insert(t.get(), {5, 9, 5, 5, 9}, 1);
  EXPECT_EQ(rows[0], rows[2]);
  EXPECT_EQ(rows[0], rows[3]);
  EXPECT_EQ(rows[1], rows[4]);
  EXPECT_NE(rows[0], rows[1]);
  EXPECT_EQ(t->size(), 2);
  EXPECT_EQ(t->CountOf(rows[0]), 3);
  EXPECT_EQ(t->CountOf(rows[1]), 2);
}

TEST(DynamicTableTest, FindNeverInsertsNorTouchesMetadata) {
  auto t = Make(Options());
  const int64_t row = Insert(t.get(), {3}, 2)[0];
  EXPECT_EQ(FindRows(*t, {3, 4, 0, -3}), (std::vector<int64_t>{row, kNo, kNo, kNo}));
  EXPECT_EQ(t->size(), 1);
  EXPECT_EQ(t->CountOf(row), 1);
  EXPECT_EQ(t->LastStepOf(row), 2);
}

TEST(DynamicTableTest, LastStepIsTheLatestStepSeen) {
  auto t = Make(Options());
  const int64_t row = Insert(t.get(), {3}, 10)[0];
  Insert(t.get(), {3}, 4);  // an older step (e.g. a replayed batch) does not move it back
  EXPECT_EQ(t->LastStepOf(row), 10);
  Insert(t.get(), {3}, 12);
  EXPECT_EQ(t->LastStepOf(row), 12);
}

TEST(DynamicTableTest, RejectedCallsChangeNothing) {
  auto t = Make(Options());
  Insert(t.get(), {1, 2});
  const DynamicTableContents before = t->Export();
  std::vector<int64_t> keys = {1, 3}, rows(2);
  ExpectInvalid(t->FindOrInsert(keys.data(), 2, -1, rows.data()), {"'items'", "step", "-1"});
  ExpectInvalid(t->FindOrInsert(keys.data(), -2, 0, rows.data()), {"'items'", "-2"});
  ExpectInvalid(t->EndStep(-5).status(), {"'items'", "-5"});
  ExpectInvalid(t->Evict({EvictionPolicy::kLru, -1, 0}, 3).status(), {"target_rows", "-1"});
  ExpectInvalid(t->Evict({EvictionPolicy::kTtl, 0, 0}, 3).status(), {"ttl_steps", "got 0"});
  ExpectSameContents(before, t->Export());
  EXPECT_EQ(t->counters().inserts, 2);
  EXPECT_EQ(t->counters().evictions, 0);
}

TEST(DynamicTableTest, GrowsPastTheInitialCapacityWithoutMovingRows) {
  DynamicTableOptions o = Options(4, 2, 100000);
  auto t = Make(o);
  EXPECT_EQ(t->capacity(), 4);  // rounded up to a whole chunk
  const int64_t row0 = Insert(t.get(), {-1})[0];
  const float* p0 = t->Weights(row0);
  std::vector<int64_t> keys(5000);
  std::iota(keys.begin(), keys.end(), 100);
  const std::vector<int64_t> rows = Insert(t.get(), keys);
  EXPECT_EQ(t->size(), 5001);
  EXPECT_GE(t->capacity(), 5001);
  EXPECT_EQ(t->Weights(row0), p0);  // the row did not move
  EXPECT_EQ(RowOf(*t, row0), InitialRow(o.initializer, -1, 4));
  EXPECT_EQ(FindRows(*t, keys), rows);
  for (size_t i = 0; i < keys.size(); i += 499) EXPECT_EQ(RowOf(*t, rows[i]), InitialRow(o.initializer, keys[i], 4));
}

TEST(DynamicTableTest, LongBatchesWithDuplicatesAndGrowthMatchKeyByKeyLookups) {
  // Batches far longer than the probe pipeline, mostly duplicates, that grow the table (and rehash the index)
  // in the middle of the run: every occurrence gets its key's row, identical to a one-key Find afterwards, and
  // the same batches inserted one key at a time give the same rows and content.
  DynamicTableOptions o = Options(/*dim=*/3, /*initial_capacity=*/8, /*max_rows=*/5000);
  std::unique_ptr<DynamicTable> batched = Make(o);
  std::unique_ptr<DynamicTable> one_by_one = Make(o);
  ASSERT_TRUE(batched && one_by_one);
  std::mt19937_64 rng(3);
  for (int64_t step = 0; step < 6; ++step) {
    std::vector<int64_t> keys(1000 + 97 * step);
    for (int64_t& k : keys) k = static_cast<int64_t>(rng() % 3 == 0 ? rng() % 2000 : rng() % 20) - 10;
    const std::vector<int64_t> rows = Insert(batched.get(), keys, step);
    for (size_t i = 0; i < keys.size(); ++i) {
      ASSERT_NE(rows[i], kNo);
      ASSERT_EQ(FindRows(*batched, {keys[i]})[0], rows[i]) << "key " << keys[i];
      ASSERT_EQ(batched->KeyOf(rows[i]), keys[i]);
    }
    EXPECT_EQ(FindRows(*batched, keys), rows);
    for (const int64_t k : keys) Insert(one_by_one.get(), {k}, step);
  }
  ExpectSameContents(batched->Export(), one_by_one->Export());
}

TEST(DynamicTableTest, AFullTableRefusesNewKeysInFirstOccurrenceOrder) {
  auto t = Make(Options(4, 2, 3));
  Insert(t.get(), {10});
  BatchStats stats;
  // Room for two more: 30 and 20 come first (first occurrences), 40 and 50 are refused.
  const std::vector<int64_t> rows = Insert(t.get(), {30, 10, 20, 40, 30, 50, 40}, 1, &stats);
  EXPECT_EQ(stats.inserts, 2);
  EXPECT_EQ(stats.refused_full, 2);  // distinct keys, not occurrences
  EXPECT_GE(rows[0], 0);
  EXPECT_GE(rows[2], 0);
  EXPECT_EQ(rows[3], kNo);
  EXPECT_EQ(rows[5], kNo);
  EXPECT_EQ(rows[6], kNo);
  EXPECT_EQ(t->size(), 3);
  // Existing keys still work and count; refused keys got nothing.
  EXPECT_EQ(t->CountOf(rows[1]), 2);
  EXPECT_EQ(FindRows(*t, {40, 50}), (std::vector<int64_t>{kNo, kNo}));
  EXPECT_EQ(t->counters().refused_full, 2);
  // Once a row is evicted there is room again.
  EXPECT_EQ(t->EvictKeys(std::vector<int64_t>{10}.data(), 1), 1);
  EXPECT_GE(Insert(t.get(), {40})[0], 0);
}

// --- Admission ---------------------------------------------------------------------------------------------

TEST(DynamicTableTest, FrequencyAdmissionCountsEveryOccurrenceExactly) {
  DynamicTableOptions o = Options();
  o.admission = {3, 100, 0};
  auto t = Make(o);
  BatchStats stats;
  EXPECT_EQ(Insert(t.get(), {8, 9}, 0, &stats), (std::vector<int64_t>{kNo, kNo}));
  EXPECT_EQ(stats.below_admission, 2);
  EXPECT_EQ(t->size(), 0);
  EXPECT_EQ(t->num_pending(), 2);
  // Key 8 reaches 3 in the middle of this batch: every occurrence of it in the batch gets the row.
  const std::vector<int64_t> rows = Insert(t.get(), {8, 9, 8}, 1, &stats);
  EXPECT_GE(rows[0], 0);
  EXPECT_EQ(rows[2], rows[0]);
  EXPECT_EQ(rows[1], kNo);
  EXPECT_EQ(stats.inserts, 1);
  EXPECT_EQ(stats.below_admission, 1);
  EXPECT_EQ(t->CountOf(rows[0]), 3);  // the pending count carries into the row
  EXPECT_EQ(t->num_pending(), 1);     // 8's entry is released
  // Three occurrences in one batch admit a new key at once.
  EXPECT_GE(Insert(t.get(), {5, 5, 5}, 2)[0], 0);
  EXPECT_EQ(t->counters().inserts, 2);
  EXPECT_EQ(t->counters().below_admission, 3);
}

TEST(DynamicTableTest, PendingCountsAreBoundedAndExpire) {
  DynamicTableOptions o = Options();
  o.admission = {2, 2, 3};
  auto t = Make(o);
  BatchStats stats;
  Insert(t.get(), {1, 2, 3}, 0, &stats);
  EXPECT_EQ(stats.below_admission, 2);
  EXPECT_EQ(stats.untracked, 1);  // the third distinct key found no counter
  EXPECT_EQ(t->num_pending(), 2);
  // Key 3 was not counted: one more sighting does not admit it, while key 1's does.
  const std::vector<int64_t> rows = Insert(t.get(), {3, 1}, 1, &stats);
  EXPECT_EQ(rows[0], kNo);
  EXPECT_GE(rows[1], 0);
  EXPECT_EQ(stats.untracked, 1);
  // Key 1's entry was freed after that batch, so key 4 is counted now.
  Insert(t.get(), {4}, 2, &stats);
  EXPECT_EQ(stats.below_admission, 1);
  EXPECT_EQ(t->num_pending(), 2);  // keys 2 (step 0) and 4 (step 2)
  // pending_ttl_steps = 3: at the end of step 4 key 2 (unseen for 4 steps) is dropped, key 4 stays.
  ASSERT_TRUE(t->EndStep(3).ok());
  EXPECT_EQ(t->num_pending(), 2);
  ASSERT_TRUE(t->EndStep(4).ok());
  EXPECT_EQ(t->Export().pending_keys, (std::vector<int64_t>{4}));
}

TEST(DynamicTableTest, RefusedForSpaceKeepsTheCountForLater) {
  DynamicTableOptions o = Options(4, 1, 1);
  o.admission = {2, 10, 0};
  auto t = Make(o);
  Insert(t.get(), {1, 1});
  BatchStats stats;
  EXPECT_EQ(Insert(t.get(), {2, 2}, 0, &stats)[0], kNo);
  EXPECT_EQ(stats.refused_full, 1);
  ASSERT_EQ(t->EvictKeys(std::vector<int64_t>{1}.data(), 1), 1);
  // Key 2 already reached min_count: one more sighting gets it a row, with its full count.
  const int64_t row = Insert(t.get(), {2}, 1)[0];
  ASSERT_GE(row, 0);
  EXPECT_EQ(t->CountOf(row), 3);
}

// --- Determinism -------------------------------------------------------------------------------------------

TEST(DynamicTableTest, ContentDoesNotDependOnInsertionOrderOrBatching) {
  DynamicTableOptions o = Options(8, 4, 10000);
  o.initializer.kind = RowInitializerKind::kTruncatedNormal;
  o.initializer.stddev = 0.1f;
  o.slot_initial_values = {0.1f};
  std::vector<int64_t> keys;
  std::mt19937_64 rng(17);
  for (int i = 0; i < 3000; ++i) keys.push_back(static_cast<int64_t>(rng()));
  keys.push_back(0);
  keys.push_back(-1);
  auto a = Make(o);
  Insert(a.get(), keys);
  auto b = Make(o);
  std::vector<int64_t> shuffled = keys;
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  for (size_t begin = 0; begin < shuffled.size(); begin += 37) {
    const size_t end = std::min(shuffled.size(), begin + 37);
    Insert(b.get(), std::vector<int64_t>(shuffled.begin() + begin, shuffled.begin() + end));
  }
  const DynamicTableContents ca = a->Export(), cb = b->Export();
  ExpectSameContents(ca, cb);
  EXPECT_TRUE(std::is_sorted(ca.keys.begin(), ca.keys.end()));
  EXPECT_EQ(ca.keys.size(), keys.size());
}

// --- Memory ------------------------------------------------------------------------------------------------

TEST(DynamicTableTest, PerRowSlotsHoldOneValuePerRow) {
  DynamicTableOptions o = Options(4, 8, 1000);
  o.slot_initial_values = {0.5f, 0.25f};
  o.slot_widths = {1, 4};
  auto t = Make(o);
  ASSERT_EQ(t->slot_width(0), 1);
  ASSERT_EQ(t->slot_width(1), 4);
  const std::vector<int64_t> rows = Insert(t.get(), {10, -3, 7});
  for (const int64_t r : rows) {
    EXPECT_EQ(t->Slot(0, r)[0], 0.5f);
    for (int c = 0; c < 4; ++c) EXPECT_EQ(t->Slot(1, r)[c], 0.25f);
  }
  t->Slot(0, rows[1])[0] = 9.0f;  // key -3
  DynamicTableContents c = t->Export();
  EXPECT_EQ(c.slot_widths, (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(c.slots[0], (std::vector<float>{9.0f, 0.5f, 0.5f}));  // keys -3, 7, 10
  EXPECT_EQ(c.slots[1].size(), 12u);
  // Round trip into a fresh table of the same layout.
  auto other = Make(o);
  ASSERT_TRUE(other->Import(c).ok());
  EXPECT_EQ(other->Export().slots, c.slots);
  // Another width (a checkpoint of a per-column accumulator) is refused naming the table; nothing changes.
  DynamicTableContents wide = c;
  wide.slot_widths[0] = 4;
  wide.slots[0].assign(12, 1.0f);
  const absl::Status s = t->Import(wide);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'items'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("slot 0 of the checkpoint has 4 values per row, the table's optimizer keeps 1"),
            std::string::npos)
      << s;
  EXPECT_EQ(t->Export().slots, c.slots);
  EXPECT_EQ(t->size(), 3);
  // Bad widths are refused at creation.
  for (const std::vector<int64_t>& widths : {std::vector<int64_t>{1}, std::vector<int64_t>{2, 4}, {0, 4}}) {
    DynamicTableOptions bad = o;
    bad.slot_widths = widths;
    EXPECT_EQ(DynamicTable::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(DynamicTableTest, MemoryPerRowIsWithinTheTarget) {
  // Target: (dim + sum of slot widths) * 4 + 32 bytes per row (a slot is dim wide, or 1 for a per-row slot).
  // The worst case for the index is just past a doubling (load 3/8: 10.7 bytes per row); 786433 rows is that
  // point for 2^21 buckets.  {16, 1, per-row}: row-wise Adagrad's accumulator costs 4 bytes per row.
  struct Case {
    int64_t dim, slots;
    bool per_row;
  };
  for (const Case& k : {Case{4, 1, false}, Case{16, 2, false}, Case{16, 1, true}}) {
    const int64_t dim = k.dim, slots = k.per_row ? 1 : k.slots;
    const int64_t slot_floats = k.per_row ? 1 : k.slots * dim;
    DynamicTableOptions o = Options(dim, 1, 1 << 20);
    o.rows_per_chunk = 1024;
    o.initializer.kind = RowInitializerKind::kZeros;
    o.slot_initial_values.assign(k.slots, 0.0f);
    if (k.per_row) o.slot_widths = {1};
    auto t = Make(o);
    const int64_t n = 786433;
    std::vector<int64_t> keys(n);
    for (int64_t i = 0; i < n; ++i) keys[i] = static_cast<int64_t>(MixKey(static_cast<uint64_t>(i)));
    std::vector<int64_t> rows(n);
    ASSERT_TRUE(t->FindOrInsert(keys.data(), n, 0, rows.data()).ok());
    ASSERT_EQ(t->size(), n);
    const double per_row = static_cast<double>(t->MemoryBytes()) / n;
    const double target = static_cast<double>((dim + slot_floats) * 4 + 32);
    EXPECT_LE(per_row, target) << "dim " << dim << " slots " << slots;
    // And what it is made of: the floats, 20 bytes of metadata, 4 bytes per index bucket.
    EXPECT_GE(per_row, static_cast<double>((dim + slot_floats) * 4 + 20) + 4.0 * (1 << 21) / n);
  }
}

}  // namespace
}  // namespace dynamic_test
}  // namespace tf_embed_ops
