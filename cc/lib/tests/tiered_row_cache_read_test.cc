// The row cache's reads under faults and concurrency (docs/tiered_tables.md): a corrupted or short read fails the
// acquire and changes only residency, a prefetch reads without the lock and a failed one loads nothing.
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/lib/tests/tiered_cache_test_util.h"
#include "cc/lib/tests/tiered_test_util.h"
#include "cc/lib/tiered_row_cache.h"
#include "cc/lib/tiered_row_file.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace tiered_test {
namespace {

TEST(TieredRowCacheTest, ACorruptedRowFailsTheAcquireAndPinsNothing) {
  TempDir dir;
  const std::string path = dir.File("t.rows");
  const TieredRowLayout layout = Layout(16, {StorageType::kFloat32}, {4});
  auto cache = NewCache(path, layout, 6);
  TieredPin pin;
  ASSERT_TRUE(cache->Acquire({0, 1}, &pin).ok());
  cache->Release(&pin, false);
  PatchFile(path, TieredRowFile::kHeaderBytes + 9 * layout.record_bytes() + 3, {'\x11'});
  const absl::Status s = cache->Acquire({0, 1, 8, 9, 10}, &pin);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("row 9 is corrupted"), std::string::npos) << s;
  EXPECT_NE(s.message().find(path), std::string::npos) << s;
  EXPECT_TRUE(pin.rows.empty());
  const TieredCacheStats stats = cache->stats();
  EXPECT_EQ(stats.pinned_rows, 0);
  EXPECT_EQ(stats.resident_rows, 2);  // rows 0 and 1; the failed misses were not made resident
  // The other rows still work; the corrupted one keeps failing (also for an export).
  ASSERT_TRUE(cache->Acquire({0, 8, 10}, &pin).ok());
  cache->Release(&pin, false);
  std::vector<char> out(layout.record_bytes());
  EXPECT_EQ(cache->ReadRecords(9, 1, out.data()).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(cache->Prefetch({9}).code(), absl::StatusCode::kDataLoss);
}

TEST(TieredRowCacheTest, AShortReadInABatchFailsTheAcquireAndChangesOnlyResidency) {
  TempDir dir;
  const std::string path = dir.File("t.rows");
  const TieredRowLayout layout = Layout(40, {StorageType::kFloat32}, {4});
  auto cache = NewCache(path, layout, 8);
  TieredPin pin;
  ASSERT_TRUE(cache->Acquire({0, 1}, &pin).ok());
  cache->Release(&pin, /*dirty=*/false);
  // The file loses its last two records behind the table's back (a truncated store).
  ASSERT_EQ(truncate(path.c_str(), TieredRowFile::kHeaderBytes + 38 * layout.record_bytes()), 0);
  const TieredCacheStats stats = cache->stats();
  const absl::Status s = cache->Acquire({0, 5, 6, 20, 38, 39}, &pin);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("short read of rows [38, 40)"), std::string::npos) << s;
  EXPECT_NE(s.message().find(path), std::string::npos) << s;
  EXPECT_TRUE(pin.rows.empty());
  TieredCacheStats now = cache->stats();
  EXPECT_EQ(now.pinned_rows, 0);
  EXPECT_EQ(now.resident_rows, 2);  // rows 0 and 1: no row of the failed batch became resident
  EXPECT_EQ(now.rows_read, stats.rows_read);
  EXPECT_EQ(now.hits, stats.hits);
  EXPECT_EQ(now.misses, stats.misses);
  // The rows still in the file work.
  ASSERT_TRUE(cache->Acquire({0, 5, 6, 20}, &pin).ok());
  cache->Release(&pin, /*dirty=*/false);
  std::vector<char> out(layout.record_bytes());
  EXPECT_EQ(cache->ReadRecords(39, 1, out.data()).code(), absl::StatusCode::kDataLoss);
}

TEST(TieredRowCacheTest, ACorruptedRowInABatchNamesTheFirstBadRow) {
  TempDir dir;
  const std::string path = dir.File("t.rows");
  const TieredRowLayout layout = Layout(40, {StorageType::kFloat32, StorageType::kFloat32}, {3, 3});
  auto cache = NewCache(path, layout, 10);
  const std::vector<std::vector<float>> rows = ReadAll(cache.get());
  PatchFile(path, TieredRowFile::kHeaderBytes + 30 * layout.record_bytes() + 1, {'\x7f'});
  PatchFile(path, TieredRowFile::kHeaderBytes + 13 * layout.record_bytes() + 20, {'\x01'});
  const TieredCacheStats stats = cache->stats();
  TieredPin pin;
  const absl::Status s = cache->Acquire({3, 12, 13, 22, 30}, &pin);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("row 13 is corrupted"), std::string::npos) << s;
  EXPECT_TRUE(pin.rows.empty());
  EXPECT_TRUE(SameStats(cache->stats(), stats));
  // A batch without the bad rows reads every row right.
  ASSERT_TRUE(cache->Acquire({3, 12, 22, 31, 35}, &pin).ok());
  for (size_t i = 0; i < pin.rows.size(); ++i) {
    std::vector<float> got(6);
    float* buffers[2] = {got.data(), got.data() + 3};
    DecodeRecord(layout, pin.records[i], buffers);
    const int64_t r = pin.rows[i];
    EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + 3),
              std::vector<float>(rows[0].begin() + 3 * r, rows[0].begin() + 3 * r + 3));
    EXPECT_EQ(std::vector<float>(got.begin() + 3, got.end()),
              std::vector<float>(rows[1].begin() + 3 * r, rows[1].begin() + 3 * r + 3));
  }
  cache->Release(&pin, /*dirty=*/false);
}

std::thread::id g_test_thread;

// Injected reads: while g_hold_reads is set, a read from any thread but the test's waits until it is cleared
// (g_held_reads counts the reads waiting), so a test can look at the cache while a prefetch is inside its read.
std::atomic<bool> g_hold_reads{false};
std::atomic<int> g_held_reads{0};
void HoldIfAsked() {
  if (!g_hold_reads || std::this_thread::get_id() == g_test_thread) return;
  ++g_held_reads;
  while (g_hold_reads) std::this_thread::yield();
  --g_held_reads;
}
ssize_t HoldingPreadv(int fd, const struct iovec* iov, int iovcnt, off_t offset) {
  HoldIfAsked();
  return ::preadv(fd, iov, iovcnt, offset);
}
ssize_t HoldingPreadv2(int fd, const struct iovec* iov, int iovcnt, off_t offset, int flags) {
  HoldIfAsked();
  return ::preadv2(fd, iov, iovcnt, offset, flags);
}

TEST(TieredRowCacheTest, APrefetchReadsWithoutTheLockAndARowItLoadsIsWaitedFor) {
  TempDir dir;
  const TieredRowLayout layout = Layout(64, {StorageType::kFloat32}, {2});
  RowFileIo io = RowFileIo::Posix();
  io.preadv = HoldingPreadv;
  io.preadv2 = HoldingPreadv2;
  g_test_thread = std::this_thread::get_id();
  g_hold_reads = false;
  auto cache = NewCache(dir.File("t.rows"), layout, 16, io);
  TieredPin pin;
  ASSERT_TRUE(cache->Acquire({1, 2}, &pin).ok());
  cache->Release(&pin, false);

  g_hold_reads = true;
  ASSERT_TRUE(cache->StartPrefetch({10, 11, 12}).ok());
  while (g_held_reads == 0) std::this_thread::yield();  // the prefetch thread is inside its read
  // The cache's lock is free: resident rows are acquired and released, the counters stay readable from here
  // without waiting (stats() would wait for the prefetch, so this thread uses a step instead).
  ASSERT_TRUE(cache->Acquire({1, 2}, &pin).ok());
  cache->Release(&pin, false);
  // A step that needs a row being loaded waits for the prefetch, then hits it.
  std::atomic<bool> acquired{false};
  std::thread step([&] {
    TieredPin p;
    EXPECT_TRUE(cache->Acquire({2, 11}, &p).ok());
    acquired = true;
    cache->Release(&p, false);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(acquired.load());
  g_hold_reads = false;
  step.join();
  EXPECT_TRUE(acquired.load());
  const TieredCacheStats s = cache->stats();
  EXPECT_EQ(s.rows_read, 5);  // 1 and 2, then 10-12 by the prefetch; the step read nothing
  EXPECT_EQ(s.misses, 2);
  EXPECT_EQ(s.hits, 4);
  EXPECT_EQ(s.pinned_rows, 0);
  EXPECT_EQ(s.resident_rows, 5);
}

TEST(TieredRowCacheTest, AFailedAsynchronousPrefetchLoadsNothingAndIsReportedOnce) {
  TempDir dir;
  const std::string path = dir.File("t.rows");
  const TieredRowLayout layout = Layout(16, {StorageType::kFloat32}, {4});
  auto cache = NewCache(path, layout, 6);
  PatchFile(path, TieredRowFile::kHeaderBytes + 9 * layout.record_bytes() + 3, {'\x11'});
  ASSERT_TRUE(cache->StartPrefetch({8, 9}).ok());  // returns before the read fails
  TieredCacheStats s = cache->stats();             // (waits for the prefetch)
  EXPECT_EQ(s.resident_rows, 0);
  EXPECT_EQ(s.pinned_rows, 0);
  EXPECT_EQ(s.rows_read, 0);
  const absl::Status failed = cache->StartPrefetch({1});
  EXPECT_EQ(failed.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(failed.message().find("an earlier prefetch failed"), std::string::npos) << failed;
  EXPECT_NE(failed.message().find("row 9 is corrupted"), std::string::npos) << failed;
  EXPECT_TRUE(cache->StartPrefetch({8, 1, 8, 1}).ok());  // reported once; the good rows load (a batch's ids)
  EXPECT_TRUE(cache->WaitForPrefetch().ok());
  EXPECT_EQ(cache->stats().resident_rows, 2);
  EXPECT_EQ(cache->StartPrefetch({1, 16}).code(), absl::StatusCode::kInvalidArgument);  // checked at once
  // A cache destroyed with a prefetch queued or running stops its thread cleanly.
  ASSERT_TRUE(cache->StartPrefetch({2, 3, 4, 5}).ok());
  cache.reset();
}

}  // namespace
}  // namespace tiered_test
}  // namespace tf_embed_ops
