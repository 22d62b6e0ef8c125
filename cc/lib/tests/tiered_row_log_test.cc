// The log-structured row file (docs/tiered_tables.md, "The row file"): appends to free segments, greedy cleaning,
// the location map written by Sync and checked by Open (a file not closed cleanly, a corrupted map and an old
// format version are refused), and a failing device while cleaning, which leaves every row readable with its old
// or its new record.  The reference is a plain vector of each row's latest record.
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cc/lib/tests/tiered_test_util.h"
#include "cc/lib/tiered_row_file.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace {

using tiered_test::FileBytes;
using tiered_test::PatchFile;
using tiered_test::TempDir;

TieredRowLayout Layout(int64_t num_rows) {
  TieredRowLayout l;
  l.num_rows = num_rows;
  l.types = {StorageType::kFloat32, StorageType::kBfloat16};
  l.widths = {3, 2};
  return l;
}

// A record whose values come from (row, version).
std::vector<char> Record(const TieredRowLayout& l, int64_t row, int64_t version) {
  std::vector<char> record(l.record_bytes());
  const float w[3] = {static_cast<float>(row), static_cast<float>(version), 0.5f};
  const float s[2] = {static_cast<float>(version % 7), -1.0f};
  const float* buffers[2] = {w, s};
  EncodeRecord(l, buffers, record.data());
  return record;
}

// Every row of the file equals the reference (bytes, CRC included).
void ExpectRows(const TieredRowFile& file, const std::vector<std::vector<char>>& want, const std::string& where) {
  const int64_t n = file.layout().num_rows;
  std::vector<char> got(n * file.record_bytes());
  std::vector<char*> pointers(n);
  for (int64_t r = 0; r < n; ++r) pointers[r] = got.data() + r * file.record_bytes();
  const absl::Status s = file.ReadRecords(0, n, pointers.data());
  ASSERT_TRUE(s.ok()) << s << " " << where;
  std::set<int64_t> offsets;
  for (int64_t r = 0; r < n; ++r) {
    EXPECT_EQ(std::vector<char>(pointers[r], pointers[r] + file.record_bytes()), want[r])
        << "row " << r << " " << where;
    offsets.insert(file.RecordOffset(r));
  }
  EXPECT_EQ(static_cast<int64_t>(offsets.size()), n) << "two rows share a slot " << where;
}

// Writes `batches` random batches of distinct rows (any order) and keeps `want` up to date.
void WriteRandomBatches(TieredRowFile* file, int batches, std::mt19937* rng, int64_t* version,
                        std::vector<std::vector<char>>* want) {
  const int64_t n = file->layout().num_rows;
  std::vector<int64_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  for (int b = 0; b < batches; ++b) {
    std::shuffle(all.begin(), all.end(), *rng);
    const int64_t k = 1 + static_cast<int64_t>((*rng)() % (n / 2));
    std::vector<std::vector<char>> records;
    std::vector<char*> pointers;
    for (int64_t i = 0; i < k; ++i) records.push_back(Record(file->layout(), all[i], ++*version));
    for (auto& r : records) pointers.push_back(r.data());
    const absl::Status s = file->WriteRows(all.data(), k, pointers.data());
    ASSERT_TRUE(s.ok()) << s;
    for (int64_t i = 0; i < k; ++i) (*want)[all[i]] = records[i];
  }
}

TEST(TieredRowLogTest, AppendsAndCleaningKeepEveryRowsLatestRecordAcrossReopens) {
  TempDir dir;
  const std::string path = dir.File("t.rows");
  const TieredRowLayout layout = Layout(64);
  auto file = TieredRowFile::Create(path, "items", layout);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->segment_slots(), 8);
  EXPECT_EQ((*file)->physical_slots(), 88);  // 64 rows + 3 segments of spare
  std::vector<std::vector<char>> want(64);
  std::vector<char*> pointers;
  for (int64_t r = 0; r < 64; ++r) want[r] = Record(layout, r, 0);
  for (auto& r : want) pointers.push_back(r.data());
  ASSERT_TRUE((*file)->WriteRecords(0, 64, pointers.data()).ok());
  for (int64_t r = 0; r < 64; ++r)
    EXPECT_EQ((*file)->RecordOffset(r), TieredRowFile::kHeaderBytes + r * layout.record_bytes());
  std::mt19937 rng(7);
  int64_t version = 0;
  for (int round = 0; round < 6; ++round) {
    WriteRandomBatches(file->get(), 40, &rng, &version, &want);
    ExpectRows(**file, want, "round " + std::to_string(round));
  }
  const TieredLogStats stats = (*file)->log_stats();
  EXPECT_GT(stats.segments_cleaned, 0);
  EXPECT_GT(stats.records_moved, 0);
  EXPECT_GE(stats.free_segments, 1);  // the cleaning reserve

  // Written since the last Sync: not reopenable.  After a Sync: the same rows.
  const auto stale = TieredRowFile::Open(path, "items", layout);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.status().message().find("not closed cleanly"), std::string::npos) << stale.status();
  EXPECT_NE(stale.status().message().find("checkpoint"), std::string::npos) << stale.status();
  ASSERT_TRUE((*file)->Sync().ok());
  file->reset();
  auto reopened = TieredRowFile::Open(path, "items", layout);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  ExpectRows(**reopened, want, "reopened");
  // Training on the reopened file: its first write marks it "being written" before any record moves.
  const std::vector<char> clean_header = FileBytes(path);
  WriteRandomBatches(reopened->get(), 60, &rng, &version, &want);
  ExpectRows(**reopened, want, "after writes on the reopened file");
  EXPECT_EQ(TieredRowFile::Open(path, "items", layout).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*reopened)->Sync().ok());
  ASSERT_TRUE((*reopened)->Sync().ok());  // nothing written since: the same generation
  reopened->reset();
  auto again = TieredRowFile::Open(path, "items", layout);
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectRows(**again, want, "reopened twice");
}

TEST(TieredRowLogTest, ACorruptedMapAnOldVersionAndAnUnwrittenRowAreRefusedClearly) {
  TempDir dir;
  const std::string path = dir.File("t.rows");
  const TieredRowLayout layout = Layout(16);
  {
    auto file = TieredRowFile::Create(path, "items", layout);
    ASSERT_TRUE(file.ok()) << file.status();
    std::vector<std::vector<char>> records;
    std::vector<char*> pointers;
    for (int64_t r = 0; r < 15; ++r) records.push_back(Record(layout, r, 1));  // row 15 never written
    for (auto& r : records) pointers.push_back(r.data());
    ASSERT_TRUE((*file)->WriteRecords(0, 15, pointers.data()).ok());
    ASSERT_TRUE((*file)->Sync().ok());
  }
  const std::vector<char> original = FileBytes(path);
  {
    auto file = TieredRowFile::Open(path, "items", layout);
    ASSERT_TRUE(file.ok()) << file.status();
    std::vector<char> out(layout.record_bytes());
    char* p = out.data();
    const absl::Status never = (*file)->ReadRecords(15, 1, &p);
    EXPECT_EQ(never.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(never.message().find("row 15 was never written"), std::string::npos) << never;
    EXPECT_TRUE((*file)->ReadRecords(14, 1, &p).ok());
  }
  // A flipped byte of the map (row 3's slot).
  PatchFile(path, static_cast<int64_t>(original.size()) - 4 - 4 * 16 + 4 * 3, {'\x09'});
  const auto corrupted = TieredRowFile::Open(path, "items", layout);
  EXPECT_EQ(corrupted.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(corrupted.status().message().find("location map is corrupted"), std::string::npos) << corrupted.status();
  EXPECT_NE(corrupted.status().message().find(path), std::string::npos) << corrupted.status();
  PatchFile(path, 0, original);
  // A row file of format version 1 (one record per row in place).
  PatchFile(path, 8, {'\x01'});
  const auto old = TieredRowFile::Open(path, "items", layout);
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(old.status().message().find("format version 1; this build reads version 2"), std::string::npos)
      << old.status();
  EXPECT_NE(old.status().message().find("mode='overwrite'"), std::string::npos) << old.status();
  PatchFile(path, 0, original);
  EXPECT_TRUE(TieredRowFile::Open(path, "items", layout).ok());
}

// Injected reads: fail with EIO while `g_fail_reads` is set (a failing device).
std::atomic<bool> g_fail_reads{false};
std::atomic<int> g_failed_reads{0};
ssize_t FailingPreadv(int fd, const struct iovec* iov, int iovcnt, off_t offset) {
  if (g_fail_reads) {
    ++g_failed_reads;
    errno = EIO;
    return -1;
  }
  return ::preadv(fd, iov, iovcnt, offset);
}

TEST(TieredRowLogTest, AFailingDeviceWhileCleaningLeavesEveryRowOldOrNew) {
  TempDir dir;
  const std::string path = dir.File("t.rows");
  const TieredRowLayout layout = Layout(64);
  RowFileIo io = RowFileIo::Posix();
  io.preadv = FailingPreadv;
  auto file = TieredRowFile::Create(path, "items", layout, io);
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<std::vector<char>> want(64);
  std::vector<char*> pointers;
  for (int64_t r = 0; r < 64; ++r) want[r] = Record(layout, r, 0);
  for (auto& r : want) pointers.push_back(r.data());
  ASSERT_TRUE((*file)->WriteRecords(0, 64, pointers.data()).ok());
  // Writes read nothing but what cleaning reads: fail those until a write fails.
  g_fail_reads = true;
  std::vector<int64_t> rows(64);
  std::iota(rows.begin(), rows.end(), 0);
  std::mt19937 rng(11);
  int64_t version = 0;
  absl::Status failed;
  std::vector<int64_t> batch;
  std::vector<std::vector<char>> records;
  for (int attempt = 0; attempt < 100 && failed.ok(); ++attempt) {
    std::shuffle(rows.begin(), rows.end(), rng);
    batch.assign(rows.begin(), rows.begin() + 20);
    records.clear();
    for (int64_t r : batch) records.push_back(Record(layout, r, ++version));
    pointers.clear();
    for (auto& r : records) pointers.push_back(r.data());
    failed = (*file)->WriteRows(batch.data(), 20, pointers.data());
    if (failed.ok()) {
      for (size_t i = 0; i < batch.size(); ++i) want[batch[i]] = records[i];
    }
  }
  g_fail_reads = false;
  ASSERT_FALSE(failed.ok());
  EXPECT_GT(g_failed_reads.load(), 0);
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal) << failed;
  EXPECT_NE(failed.message().find("to clean"), std::string::npos) << failed;
  EXPECT_NE(failed.message().find(path), std::string::npos) << failed;
  // Each row of the failed batch holds its old or its new record; every other row its old one.
  for (size_t i = 0; i < batch.size(); ++i) {
    std::vector<char> got(layout.record_bytes());
    char* p = got.data();
    ASSERT_TRUE((*file)->ReadRecords(batch[i], 1, &p).ok());
    EXPECT_TRUE(got == want[batch[i]] || got == records[i]) << "row " << batch[i];
    want[batch[i]] = got;
  }
  ExpectRows(**file, want, "after the failed write");
  // The device back: writing (and cleaning) goes on.
  WriteRandomBatches(file->get(), 60, &rng, &version, &want);
  ExpectRows(**file, want, "after the device came back");
  EXPECT_GT((*file)->log_stats().segments_cleaned, 0);
}

}  // namespace
}  // namespace tf_embed_ops
