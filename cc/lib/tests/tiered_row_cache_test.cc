// The DRAM row cache of tiered tables (docs/tiered_tables.md): capacity, CLOCK eviction with write-back, which
// rows outlast which, prefetch, refusal of a step larger than the cache, writes that replace cached copies.
#include "cc/lib/tiered_row_cache.h"

#include <fcntl.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/lib/embedding_config.h"
#include "cc/lib/tests/tiered_cache_test_util.h"
#include "cc/lib/tests/tiered_test_util.h"
#include "cc/lib/tiered_row_file.h"
#include "cc/lib/tiered_row_storage.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace tiered_test {
namespace {

TEST(TieredRowCacheTest, CapacityFromTheByteBudget) {
  const TieredRowLayout l = Layout(1000, {StorageType::kFloat32, StorageType::kFloat32}, {8, 8});
  EXPECT_EQ(TieredRowCache::RowBytes(l), 68 + TieredRowCache::kSlotOverheadBytes);
  EXPECT_EQ(TieredRowCache::CapacityFor(10 * TieredRowCache::RowBytes(l), l), 10);
  EXPECT_EQ(TieredRowCache::CapacityFor(10 * TieredRowCache::RowBytes(l) - 1, l), 9);
  EXPECT_EQ(TieredRowCache::CapacityFor(TieredRowCache::RowBytes(l) - 1, l), 0);
  EXPECT_EQ(TieredRowCache::CapacityFor(int64_t{1} << 40, l), 1000);  // never more than the table
}

TEST(TieredRowCacheTest, EvictsWithClockAndWritesDirtyRowsBack) {
  TempDir dir;
  const std::string path = dir.File("t.rows");
  const TieredRowLayout layout = Layout(32, {StorageType::kFloat32}, {2});
  auto cache = NewCache(path, layout, /*capacity=*/4);
  const std::vector<std::vector<float>> before = ReadAll(cache.get());
  TieredPin pin;
  ASSERT_TRUE(cache->Acquire({1, 2, 3, 9}, &pin).ok());
  EXPECT_EQ(cache->stats().misses, 4);
  EXPECT_EQ(cache->stats().pinned_rows, 4);
  for (char* record : pin.records) reinterpret_cast<float*>(record)[1] += 100.0f;
  cache->Release(&pin, /*dirty=*/true);
  EXPECT_EQ(cache->stats().pinned_rows, 0);
  EXPECT_EQ(cache->stats().rows_written, 32);  // the initialisation only: dirty rows stay in the cache
  // The cache (not the file) has the new values; ReadRecords reads through it.
  std::vector<std::vector<float>> now = ReadAll(cache.get());
  EXPECT_EQ(now[0][9 * 2 + 1], before[0][9 * 2 + 1] + 100.0f);
  EXPECT_EQ(FileRows(*cache)[0], before[0]);
  // Four other rows evict the four dirty ones, which are written back first (rows 1-3 in one run).
  ASSERT_TRUE(cache->Acquire({20, 21, 22, 23}, &pin).ok());
  cache->Release(&pin, /*dirty=*/false);
  const TieredCacheStats stats = cache->stats();
  EXPECT_EQ(stats.evictions, 4);
  EXPECT_EQ(stats.rows_written, 36);
  EXPECT_EQ(stats.bytes_written, 36 * layout.record_bytes());
  EXPECT_EQ(stats.resident_rows, 4);
  EXPECT_EQ(FileRows(*cache)[0], now[0]);
  // A hit is counted as one and reads nothing.
  const int64_t read = cache->stats().rows_read;
  ASSERT_TRUE(cache->Acquire({21, 23}, &pin).ok());
  cache->Release(&pin, false);
  EXPECT_EQ(cache->stats().hits, 2);
  EXPECT_EQ(cache->stats().rows_read, read);
}

TEST(TieredRowCacheTest, TheLastCallsRowsOutlastTheNextCallsLoadsEvenWhenRarer) {
  // A step's lookup, then the next batch's prefetch, then the step's update: the prefetch evicts other rows than
  // the ones the lookup just touched, though those have the shorter history, and the update finds them resident.
  TempDir dir;
  const TieredRowLayout layout = Layout(64, {StorageType::kFloat32}, {2});
  auto cache = NewCache(dir.File("t.rows"), layout, 8);
  TieredPin pin;
  for (int k = 0; k < 3; ++k) {  // rows 4-7 (slots 0-3, met first by the hand): history 3
    ASSERT_TRUE(cache->Acquire({4, 5, 6, 7}, &pin).ok());
    cache->Release(&pin, false);
  }
  ASSERT_TRUE(cache->Acquire({0, 1, 2, 3}, &pin).ok());  // the lookup: history 1
  cache->Release(&pin, false);
  ASSERT_TRUE(cache->Prefetch({20, 21, 22, 23}).ok());  // evicts rows 4-7
  EXPECT_EQ(cache->stats().evictions, 4);
  const int64_t misses = cache->stats().misses;
  ASSERT_TRUE(cache->Acquire({0, 1, 2, 3}, &pin).ok());  // the update
  cache->Release(&pin, false);
  ASSERT_TRUE(cache->Acquire({20, 21, 22, 23}, &pin).ok());  // the next lookup
  cache->Release(&pin, false);
  EXPECT_EQ(cache->stats().misses, misses);
  // With every unpinned row touched by the last call, those are evicted rather than nothing.
  ASSERT_TRUE(cache->Acquire({40, 41, 42, 43}, &pin).ok());
  cache->Release(&pin, false);
  EXPECT_EQ(cache->stats().resident_rows, 8);
}

TEST(TieredRowCacheTest, FrequentRowsOutlastAStreamOfRowsSeenOnce) {
  // Plain CLOCK would evict the four hot rows within two sweeps of one-off rows; with the access history the hand
  // evicts the one-off rows (history 1) and passes the hot ones (history 10) over.
  TempDir dir;
  const TieredRowLayout layout = Layout(1000, {StorageType::kFloat32}, {2});
  auto cache = NewCache(dir.File("t.rows"), layout, 8);
  TieredPin pin;
  for (int k = 0; k < 10; ++k) {
    ASSERT_TRUE(cache->Acquire({0, 1, 2, 3}, &pin).ok());
    cache->Release(&pin, /*dirty=*/k == 9);
  }
  for (int64_t row = 100; row < 300; ++row) {
    ASSERT_TRUE(cache->Acquire({row}, &pin).ok());
    cache->Release(&pin, false);
  }
  EXPECT_EQ(cache->stats().evictions, 200 - 4);
  const int64_t misses = cache->stats().misses;
  ASSERT_TRUE(cache->Acquire({0, 1, 2, 3}, &pin).ok());
  cache->Release(&pin, false);
  EXPECT_EQ(cache->stats().misses, misses);  // still resident, still dirty (never written back)
  ASSERT_TRUE(cache->Flush().ok());
}

TEST(TieredRowCacheTest, ThresholdRisesWhenEveryUnpinnedRowIsFrequent) {
  // Rows 0-3 have long histories; one-off rows pass through the two other slots without evicting them.  Then six
  // new rows at once need every slot: the hand raises its threshold to the lowest history it passed over (neither a
  // refusal nor a hang), after the windows' halvings too.
  TempDir dir;
  const TieredRowLayout layout = Layout(1000, {StorageType::kFloat32}, {2});
  auto cache = NewCache(dir.File("t.rows"), layout, 6);
  TieredPin pin;
  for (int k = 0; k < 300; ++k) {  // saturates rows 0-2; row 3 stays lower
    ASSERT_TRUE(
        cache->Acquire(k % 3 == 0 ? std::vector<int64_t>{0, 1, 2, 3} : std::vector<int64_t>{0, 1, 2}, &pin).ok());
    cache->Release(&pin, false);
  }
  for (int64_t row = 10; row < 20; ++row) {
    ASSERT_TRUE(cache->Acquire({row}, &pin).ok());
    cache->Release(&pin, false);
  }
  EXPECT_EQ(cache->stats().evictions, 8);
  const int64_t misses = cache->stats().misses;
  ASSERT_TRUE(cache->Acquire({0, 1, 2, 3}, &pin).ok());
  cache->Release(&pin, false);
  EXPECT_EQ(cache->stats().misses, misses);
  ASSERT_TRUE(cache->Acquire(Range(20, 26), &pin).ok());
  cache->Release(&pin, false);
  EXPECT_EQ(cache->stats().resident_rows, 6);
  EXPECT_EQ(cache->stats().evictions, 14);
}

TEST(TieredRowCacheTest, PrefetchLoadsWithoutPinningAndTheStepHits) {
  TempDir dir;
  const TieredRowLayout layout = Layout(64, {StorageType::kFloat32}, {2});
  auto cache = NewCache(dir.File("t.rows"), layout, 8);
  ASSERT_TRUE(cache->Prefetch({3, 4, 5, 40}).ok());
  TieredCacheStats s = cache->stats();
  EXPECT_EQ(s.rows_read, 4);
  EXPECT_EQ(s.misses, 0);
  EXPECT_EQ(s.pinned_rows, 0);
  EXPECT_EQ(s.resident_rows, 4);
  TieredPin pin;
  ASSERT_TRUE(cache->Acquire({3, 4, 5, 40}, &pin).ok());
  EXPECT_EQ(cache->stats().hits, 4);
  // With 4 of 8 slots pinned, a prefetch of 10 rows loads only what the other 4 slots hold.
  ASSERT_TRUE(cache->Prefetch(Range(50, 60)).ok());
  s = cache->stats();
  EXPECT_EQ(s.resident_rows, 8);
  EXPECT_EQ(s.rows_read, 8);
  cache->Release(&pin, false);
  EXPECT_EQ(cache->Prefetch({70}).code(), absl::StatusCode::kInvalidArgument);  // out of range
}

TEST(TieredRowCacheTest, DistinctRowsRemembersTheLastBatchesExactly) {
  TempDir dir;
  const TieredRowLayout layout = Layout(5000, {StorageType::kFloat32}, {2});
  auto cache = NewCache(dir.File("t.rows"), layout, 8);
  std::mt19937_64 rng(4);
  auto reference = [](std::vector<int64_t> ids) {
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    return ids;
  };
  const std::vector<int64_t> a = SkewedIds(3000, 5000, &rng);
  const std::vector<int64_t> b = SkewedIds(3000, 5000, &rng);
  std::vector<int64_t> changed = a;  // one id different, same length: must not be taken for `a`
  changed[1234] = (changed[1234] + 1) % 5000;
  const std::vector<int64_t>& a_changed = changed;
  // Batches in the order a prefetch, lookup and update of consecutive steps ask for them, and a stranger.
  for (const std::vector<int64_t>* batch : {&a, &a, &b, &a, &b, &b, &a_changed, &a, &b, &a_changed}) {
    const std::shared_ptr<const DistinctBatch> found = cache->DistinctRows(*batch);
    EXPECT_EQ(found->rows, reference(*batch));
    ASSERT_EQ(found->positions.size(), batch->size());
    for (size_t i = 0; i < batch->size(); ++i) ASSERT_EQ(found->rows[found->positions[i]], (*batch)[i]) << i;
  }
  EXPECT_TRUE(cache->DistinctRows({})->rows.empty());
}

TEST(TieredRowCacheTest, AStepLargerThanTheCacheIsRefusedBeforeAnythingChanges) {
  TempDir dir;
  const std::string path = dir.File("t.rows");
  const TieredRowLayout layout = Layout(64, {StorageType::kFloat32, StorageType::kFloat32}, {2, 2});
  auto cache = NewCache(path, layout, 8);
  TieredPin pin;
  ASSERT_TRUE(cache->Acquire({0, 1, 2}, &pin).ok());
  for (char* record : pin.records) reinterpret_cast<float*>(record)[0] = 9.0f;
  cache->Release(&pin, /*dirty=*/true);
  const std::vector<char> file = FileBytes(path);
  const std::vector<std::vector<float>> rows = ReadAll(cache.get());
  const TieredCacheStats stats = cache->stats();
  const absl::Status s = cache->Acquire(Range(10, 19), &pin);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("needs 9 distinct rows"), std::string::npos) << s;
  EXPECT_NE(s.message().find("holds 8 rows"), std::string::npos) << s;
  EXPECT_NE(s.message().find(absl::StrCat("cache_bytes >= ", 9 * TieredRowCache::RowBytes(layout))), std::string::npos)
      << s;
  EXPECT_TRUE(pin.rows.empty());
  // Through the step API as well (the plan's distinct rows).
  std::mt19937_64 rng(1);
  Step step(Range(20, 29), 2, &rng);
  step.Build(64);
  TableOptimization o;
  o.optimizer = Adagrad{};
  const absl::Status u = UpdateTieredTable(o, 0.1f, step.plan, cache.get(), RoundingSpec(), Serial(), "table 'items'");
  EXPECT_EQ(u.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(u.message().find("table 'items': needs 9 distinct rows"), std::string::npos) << u;
  EXPECT_TRUE(SameStats(cache->stats(), stats));
  EXPECT_EQ(FileBytes(path), file);
  EXPECT_EQ(ReadAll(cache.get()), rows);
  // Rows pinned by another call count against the capacity too.
  ASSERT_TRUE(cache->Acquire(Range(30, 35), &pin).ok());
  TieredPin other;
  const absl::Status busy = cache->Acquire(Range(40, 44), &other);
  EXPECT_EQ(busy.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(busy.message().find("pinned by concurrent calls"), std::string::npos) << busy;
  cache->Release(&pin, false);
  EXPECT_TRUE(cache->Acquire(Range(40, 44), &other).ok());
  cache->Release(&other, false);
}

TEST(TieredRowCacheTest, WriteRecordsReplacesCachedCopies) {
  TempDir dir;
  const std::string path = dir.File("t.rows");
  const TieredRowLayout layout = Layout(10, {StorageType::kFloat32}, {2});
  auto cache = NewCache(path, layout, 4);
  TieredPin pin;
  ASSERT_TRUE(cache->Acquire({2, 3}, &pin).ok());
  reinterpret_cast<float*>(pin.records[0])[0] = 77.0f;  // dirty, about to be overwritten
  cache->Release(&pin, true);
  std::vector<char> records(2 * layout.record_bytes());
  const float a[2] = {5, 6}, b[2] = {7, 8};
  const float* pa[1] = {a};
  const float* pb[1] = {b};
  EncodeRecord(layout, pa, records.data());
  EncodeRecord(layout, pb, records.data() + layout.record_bytes());
  ASSERT_TRUE(cache->WriteRecords(2, 2, records.data()).ok());
  EXPECT_EQ(ReadAll(cache.get())[0][4], 5.0f);
  ASSERT_TRUE(cache->Flush().ok());  // row 2 is clean now: the flush must not bring 77 back
  auto reopened = Reopen(path, layout, 4);
  const std::vector<std::vector<float>> rows = ReadAll(reopened.get());
  EXPECT_EQ(std::vector<float>(rows[0].begin() + 4, rows[0].begin() + 8), (std::vector<float>{5, 6, 7, 8}));
}

}  // namespace
}  // namespace tiered_test
}  // namespace tf_embed_ops
