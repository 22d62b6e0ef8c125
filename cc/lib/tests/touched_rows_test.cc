#include "cc/lib/touched_rows.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "cc/lib/dynamic_table.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace {

using Rows = std::vector<int64_t>;

TEST(TouchedRows, ReportsRowsMarkedAfterEachConsumersVersion) {
  TouchedRows t(100);
  EXPECT_TRUE(t.Since(0, 100).full);  // a version from before tracking
  const int64_t start = t.version();
  EXPECT_FALSE(t.Since(start, 100).full);
  EXPECT_TRUE(t.Since(start, 100).rows.empty());
  t.BeginUpdate();
  t.Mark(7);
  t.Mark(3);
  t.Mark(7);
  const int64_t after_first = t.CurrentVersion();  // another consumer reads here
  t.BeginUpdate();
  t.Mark(99);
  EXPECT_EQ(t.Since(start, 100).rows, (Rows{3, 7, 99}));
  EXPECT_EQ(t.Since(after_first, 100).rows, (Rows{99}));  // another consumer, its own version
  EXPECT_TRUE(t.Since(t.version(), 100).rows.empty());
  EXPECT_TRUE(t.Since(t.version() + 1, 100).full);  // never given out
}

TEST(TouchedRows, MarksPendingAcrossUpdatesAreExactForEveryConsumer) {
  // Marks wait in a bitmap until a read stamps them with the version of that moment: consumers that read at
  // different versions, with several updates between reads, each get exactly the rows changed after theirs, in
  // both chunks of the stamps.
  const int64_t rows = (int64_t{1} << TouchedRows::kLog2RowsPerChunk) + 10;
  TouchedRows t(rows);
  t.BeginUpdate();
  t.Mark(3);
  const int64_t a = t.Since(0, rows).version;  // consumer A (full: its first read)
  t.BeginUpdate();
  t.Mark(5);
  t.BeginUpdate();
  t.Mark(rows - 1);
  const int64_t b = t.CurrentVersion();  // consumer B takes the whole table here
  EXPECT_EQ(b, t.version());
  t.BeginUpdate();
  t.Mark(63);
  t.Mark(64);
  t.BeginUpdate();
  t.Mark(5);
  EXPECT_EQ(t.Since(a, rows).rows, (Rows{5, 63, 64, rows - 1}));
  EXPECT_EQ(t.Since(b, rows).rows, (Rows{5, 63, 64}));
  const int64_t c = t.version();
  EXPECT_TRUE(t.Since(c, rows).rows.empty());
  t.BeginUpdate();
  t.Mark(3);
  EXPECT_EQ(t.Since(c, rows).rows, (Rows{3}));
  EXPECT_EQ(t.Since(a, rows).rows, (Rows{3, 5, 63, 64, rows - 1}));
}

TEST(TouchedRows, MarkAllIsFullForOlderVersionsOnly) {
  TouchedRows t(10);
  const int64_t v = t.version();
  t.BeginUpdate();
  t.MarkAll();
  EXPECT_TRUE(t.Since(v, 10).full);
  const int64_t w = t.version();
  EXPECT_FALSE(t.Since(w, 10).full);
  t.BeginUpdate();
  t.Mark(4);
  EXPECT_EQ(t.Since(w, 10).rows, (Rows{4}));
}

TEST(TouchedRows, GrowsAndReadsEvictionsFromTheEvictionLogWithItsBound) {
  EvictionLog log(4);  // the one record of evictions, and its bound
  TouchedRows t(1);
  t.AttachEvictionLog(&log);
  ASSERT_TRUE(t.Reserve(200000));
  EXPECT_GE(t.capacity(), 200000);
  const int64_t v = t.version();
  t.BeginUpdate();
  t.Mark(199999);
  t.MarkEvictions(log.next_seq());
  log.Append(11, 0, LogKind::kEvicted);
  log.Append(12, 0, LogKind::kErased);
  log.Append(99, 0, LogKind::kRefused);  // a refusal is in the log but is no removal
  EXPECT_EQ(t.Since(v, t.capacity()).rows, (Rows{199999}));
  EXPECT_EQ(t.Since(v, t.capacity()).evicted, (Rows{11, 12}));
  const int64_t w = t.version();
  EXPECT_TRUE(t.Since(w, t.capacity()).evicted.empty());
  t.BeginUpdate();
  t.MarkEvictions(log.next_seq());
  log.Append(13, 1, LogKind::kEvicted);  // the log is full now (11, 12, 99, 13)
  EXPECT_EQ(t.Since(w, t.capacity()).evicted, (Rows{13}));
  t.BeginUpdate();
  t.MarkEvictions(log.next_seq());
  log.Append(14, 2, LogKind::kEvicted);        // over the bound: 11 is dropped
  EXPECT_TRUE(t.Since(v, t.capacity()).full);  // its consumer would miss 11: the whole table instead
  EXPECT_FALSE(t.Since(w, t.capacity()).full);
  EXPECT_EQ(t.Since(w, t.capacity()).evicted, (Rows{13, 14}));
  const int64_t x = t.version();
  t.BeginUpdate();
  t.MarkEvictions(log.next_seq());  // forgets the first mark (its entries are gone)
  log.Append(15, 3, LogKind::kEvicted);
  EXPECT_TRUE(t.Since(v, t.capacity()).full);
  EXPECT_EQ(t.Since(x, t.capacity()).evicted, (Rows{15}));
  EXPECT_EQ(t.Since(w, t.capacity()).evicted, (Rows{13, 14, 15}));
}

TEST(TouchedRows, WithoutAnEvictionLogReportsNoEvictedKeys) {
  TouchedRows t(4);
  const int64_t v = t.version();
  t.BeginUpdate();
  t.MarkEvictions(0);
  t.Mark(2);
  const TouchedRows::Changes c = t.Since(v, 4);
  EXPECT_FALSE(c.full);
  EXPECT_EQ(c.rows, (Rows{2}));
  EXPECT_TRUE(c.evicted.empty());
}

// A small dynamic table of dim 2 (chunks of 2 rows: growth is exercised) keeping `log_capacity` eviction entries.
std::unique_ptr<DynamicTable> SmallTable(int64_t log_capacity = EvictionLog::kDefaultCapacity) {
  DynamicTableOptions o;
  o.name = "items";
  o.dim = 2;
  o.initial_capacity = 2;
  o.max_rows = 1000;
  o.rows_per_chunk = 2;
  o.eviction_log_capacity = log_capacity;
  absl::StatusOr<std::unique_ptr<DynamicTable>> made = DynamicTable::Create(o);
  EXPECT_TRUE(made.ok()) << made.status();
  return made.ok() ? std::move(*made) : nullptr;
}

// The dynamic table's hooks: training lookups mark found and inserted rows, evictions log keys (and only when
// tracking is on), an import marks everything, and growth keeps every row markable.
TEST(TouchedRows, DynamicTableHooks) {
  std::unique_ptr<DynamicTable> made = SmallTable();
  ASSERT_NE(made, nullptr);
  DynamicTable& t = *made;
  std::vector<int64_t> rows(3);
  const std::vector<int64_t> first = {10, 20, 10};
  ASSERT_TRUE(t.FindOrInsert(first.data(), 3, 0, rows.data()).ok());  // before tracking: not recorded
  ASSERT_TRUE(t.EnableTracking());
  TouchedRows* touched = t.tracker();
  const int64_t v0 = touched->version();
  EXPECT_TRUE(touched->Since(v0, touched->capacity()).rows.empty());
  const std::vector<int64_t> second = {20, 30, 40};  // one found, two inserted (the table grows)
  ASSERT_TRUE(t.FindOrInsert(second.data(), 3, 1, rows.data()).ok());
  Rows changed = touched->Since(v0, touched->capacity()).rows;
  Rows keys;
  for (int64_t r : changed) keys.push_back(t.KeyOf(r));
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (Rows{20, 30, 40}));
  const int64_t v1 = touched->version();
  const std::vector<int64_t> evict = {10, 30};
  EXPECT_EQ(t.EvictKeys(evict.data(), 2), 2);
  TouchedRows::Changes after = touched->Since(v1, touched->capacity());
  EXPECT_TRUE(after.rows.empty());
  EXPECT_EQ(after.evicted, (Rows{10, 30}));
  const int64_t v2 = touched->version();
  ASSERT_TRUE(t.Import(t.Export()).ok());
  EXPECT_TRUE(touched->Since(v2, touched->capacity()).full);
}

// One eviction record (eviction_log.h): evicted_keys()'s cursor and the tracker read the same entries under the
// same bound (eviction_log_capacity), and both are told when a reader fell behind it.
TEST(TouchedRows, TheTrackerAndTheLogReadersShareOneRecordAndOneBound) {
  std::unique_ptr<DynamicTable> made = SmallTable(/*log_capacity=*/3);
  ASSERT_NE(made, nullptr);
  DynamicTable& t = *made;
  ASSERT_TRUE(t.EnableTracking());
  std::vector<int64_t> rows(5);
  const std::vector<int64_t> keys = {1, 2, 3, 4, 5};
  ASSERT_TRUE(t.FindOrInsert(keys.data(), 5, 0, rows.data()).ok());
  TouchedRows& touched = *t.tracker();
  const int64_t v = touched.version();
  const std::vector<int64_t> first = {1, 2};
  ASSERT_EQ(t.EvictKeys(first.data(), 2), 2);
  std::vector<int64_t> read;
  EvictionLog::ReadResult r = t.eviction_log().Read(0, -1, &read, nullptr, nullptr);
  EXPECT_FALSE(r.resync);
  EXPECT_EQ(read, (Rows{1, 2}));
  EXPECT_EQ(touched.Since(v, touched.capacity()).evicted, (Rows{1, 2}));
  const int64_t w = touched.version();
  const std::vector<int64_t> second = {3, 4};
  ASSERT_EQ(t.EvictKeys(second.data(), 2), 2);  // 4 entries in a record of 3: key 1's is dropped
  read.clear();
  r = t.eviction_log().Read(0, -1, &read, nullptr, nullptr);
  EXPECT_TRUE(r.resync);
  EXPECT_EQ(r.dropped, 1);
  EXPECT_TRUE(touched.Since(v, touched.capacity()).full);  // the same overflow, seen by the tracker's consumer
  EXPECT_EQ(touched.Since(w, touched.capacity()).evicted, (Rows{3, 4}));
}

}  // namespace
}  // namespace tf_embed_ops
