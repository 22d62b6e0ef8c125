// The log-structured row file (docs/tiered_storage.md, "The row file"): appends to free segments, greedy cleaning,
// the location map written by Sync and checked by Open (a file not closed cleanly, a corrupted map and an old
// format version are refused), and a failing device while cleaning, which leaves every row readable with its old
// or its new record; a full disk (injected ENOSPC) at every point of an append, in the middle of one spanning
// several segments and in cleaning, after which writing goes on once there is room (the cleaning reserve is never
// lost).  The reference is a plain vector of each row's latest record.
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

// Injected writes (a full disk): while `g_writes_left` is 0 every pwritev fails with ENOSPC; while it is positive
// it counts the writes that still succeed; -1: no limit.  With `g_fail_after_read`, a write fails once a read has
// been made since it was set (the only reads of a write are cleaning's: the write that fails is cleaning's).
// `g_reads` counts the reads.
std::atomic<int> g_writes_left{-1};
std::atomic<bool> g_fail_after_read{false};
std::atomic<bool> g_read_seen{false};
std::atomic<int> g_reads{0};
ssize_t CountingPreadv(int fd, const struct iovec* iov, int iovcnt, off_t offset) {
  ++g_reads;
  g_read_seen = true;
  return ::preadv(fd, iov, iovcnt, offset);
}
ssize_t FullDiskPwritev(int fd, const struct iovec* iov, int iovcnt, off_t offset) {
  if (g_writes_left == 0 || (g_fail_after_read && g_read_seen)) {
    errno = ENOSPC;
    return -1;
  }
  if (g_writes_left > 0) --g_writes_left;
  return ::pwritev(fd, iov, iovcnt, offset);
}
void ResetFullDisk() {
  g_writes_left = -1;
  g_fail_after_read = false;
  g_read_seen = false;
  g_reads = 0;
}

// A batch of `k` distinct random rows with new records.
struct Batch {
  std::vector<int64_t> rows;
  std::vector<std::vector<char>> records;
  std::vector<char*> pointers;
  Batch(const TieredRowLayout& layout, int64_t k, std::mt19937* rng, int64_t* version) {
    std::vector<int64_t> all(layout.num_rows);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), *rng);
    rows.assign(all.begin(), all.begin() + k);
    for (int64_t r : rows) records.push_back(Record(layout, r, ++*version));
    for (auto& r : records) pointers.push_back(r.data());
  }
  absl::Status Write(TieredRowFile* file) { return file->WriteRows(rows.data(), rows.size(), pointers.data()); }
  void Apply(std::vector<std::vector<char>>* want) const {
    for (size_t i = 0; i < rows.size(); ++i) (*want)[rows[i]] = records[i];
  }
};

// A file of 64 rows (8-slot segments, 11 segments) with every row written, its I/O through the injectors above.
std::unique_ptr<TieredRowFile> FullFile(const std::string& path, std::vector<std::vector<char>>* want) {
  ResetFullDisk();
  RowFileIo io = RowFileIo::Posix();
  io.preadv = CountingPreadv;
  io.preadv2 = nullptr;  // every read through preadv
  io.pwritev = FullDiskPwritev;
  const TieredRowLayout layout = Layout(64);
  auto file = TieredRowFile::Create(path, "items", layout, io);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return nullptr;
  want->assign(64, {});
  std::vector<char*> pointers;
  for (int64_t r = 0; r < 64; ++r) (*want)[r] = Record(layout, r, 0);
  for (auto& r : *want) pointers.push_back(r.data());
  EXPECT_TRUE((*file)->WriteRecords(0, 64, pointers.data()).ok());
  return std::move(*file);
}

// A write refused by a full disk: ResourceExhausted naming the table, the rows and the path.
void ExpectFullDiskError(const absl::Status& s, const std::string& path) {
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("table 'items'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("cannot write row"), std::string::npos) << s;
  EXPECT_NE(s.message().find(path), std::string::npos) << s;
  EXPECT_NE(s.message().find("No space left"), std::string::npos) << s;
}

// After a refused write of `batch`: each of its rows holds its old or its new record (`want` takes what it holds),
// every other row its old one.  Returns how many hold the new one.
int64_t TakeOldOrNew(const TieredRowFile& file, const Batch& batch, std::vector<std::vector<char>>* want,
                     const std::string& where) {
  int64_t new_rows = 0;
  for (size_t i = 0; i < batch.rows.size(); ++i) {
    std::vector<char> got(file.record_bytes());
    char* p = got.data();
    const absl::Status s = file.ReadRecords(batch.rows[i], 1, &p);
    EXPECT_TRUE(s.ok()) << s << " " << where;
    EXPECT_TRUE(got == (*want)[batch.rows[i]] || got == batch.records[i]) << "row " << batch.rows[i] << " " << where;
    if (got == batch.records[i]) ++new_rows;
    (*want)[batch.rows[i]] = got;
  }
  ExpectRows(file, *want, where);
  return new_rows;
}

// Flushed and reopened (without the injectors): the same rows.
void ExpectReopens(std::unique_ptr<TieredRowFile> file, const std::vector<std::vector<char>>& want) {
  const std::string path = file->path();
  ASSERT_TRUE(file->Sync().ok());
  file.reset();
  auto reopened = TieredRowFile::Open(path, "items", Layout(64));
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  ExpectRows(**reopened, want, "reopened");
}

// A full file (FullFile) in a fresh directory, the rows it holds, and the state of the batches written to it.
struct FullFileRun {
  explicit FullFileRun(uint32_t seed) : path(dir.File("t.rows")), file(FullFile(path, &want)), rng(seed) {}

  TempDir dir;
  std::string path;
  std::vector<std::vector<char>> want;
  std::unique_ptr<TieredRowFile> file;
  std::mt19937 rng;
  int64_t version = 0;
};

TEST(TieredRowLogTest, WritesRefusedByAFullDiskChangeNothingAndWritingGoesOnOnceThereIsRoom) {
  // Each batch is first written on a full disk (refused: every row, the segments and the cleaning counters as
  // they were; the free segments never fewer), then with room (written).  Batches of 1 to 6 rows fill segments
  // at every offset, so some refused writes needed a cleaning first: its write failed too.
  FullFileRun run(5);
  ASSERT_NE(run.file, nullptr);
  int cleanings_refused = 0;
  for (int b = 0; b < 300; ++b) {
    Batch batch(run.file->layout(), 1 + static_cast<int64_t>(run.rng() % 6), &run.rng, &run.version);
    const TieredLogStats before = run.file->log_stats();
    std::vector<int64_t> offsets;
    for (int64_t r = 0; r < 64; ++r) offsets.push_back(run.file->RecordOffset(r));
    const int reads = g_reads;
    g_writes_left = 0;
    const absl::Status refused = batch.Write(run.file.get());
    g_writes_left = -1;
    ExpectFullDiskError(refused, run.path);
    if (g_reads > reads) ++cleanings_refused;
    const TieredLogStats after = run.file->log_stats();
    EXPECT_EQ(after.segments_cleaned, before.segments_cleaned) << "batch " << b;
    EXPECT_EQ(after.records_moved, before.records_moved) << "batch " << b;
    // (A cleaning of a segment with no live record writes nothing: it may free one.)
    EXPECT_GE(after.free_segments, before.free_segments) << "batch " << b;
    for (int64_t r = 0; r < 64; ++r) EXPECT_EQ(run.file->RecordOffset(r), offsets[r]) << "row " << r << " batch " << b;
    const absl::Status written = batch.Write(run.file.get());
    ASSERT_TRUE(written.ok()) << written << " (batch " << b << ")";
    batch.Apply(&run.want);
    ASSERT_GE(run.file->log_stats().free_segments, 1) << "the cleaning reserve, batch " << b;
  }
  ExpectRows(*run.file, run.want, "after 300 refused and 300 written batches");
  EXPECT_GT(cleanings_refused, 10);
  EXPECT_GT(run.file->log_stats().segments_cleaned, 10);
  ExpectReopens(std::move(run.file), run.want);
}

TEST(TieredRowLogTest, AFullDiskInTheMiddleOfAnAppendLeavesEachRowOldOrNew) {
  // Batches of 20 rows span three or four segments (one pwritev each, and cleaning's): the disk fills after 0 to
  // 3 more writes.  The rows of the pieces written before are new, the others old; the next writes succeed.
  FullFileRun run(13);
  ASSERT_NE(run.file, nullptr);
  int partly_written = 0;
  for (int b = 0; b < 120; ++b) {
    Batch batch(run.file->layout(), 20, &run.rng, &run.version);
    g_writes_left = b % 4;
    const absl::Status refused = batch.Write(run.file.get());
    g_writes_left = -1;
    if (refused.ok()) {  // (cleaning needed no write, and the batch fit in the writes left)
      batch.Apply(&run.want);
      continue;
    }
    ExpectFullDiskError(refused, run.path);
    const int64_t new_rows =
        TakeOldOrNew(*run.file, batch, &run.want, "after batch " + std::to_string(b) + " was refused");
    if (new_rows > 0) ++partly_written;
    EXPECT_LT(new_rows, 20);
    ASSERT_GE(run.file->log_stats().free_segments, 1) << "the cleaning reserve, batch " << b;
    Batch again(run.file->layout(), 20, &run.rng, &run.version);
    const absl::Status written = again.Write(run.file.get());
    ASSERT_TRUE(written.ok()) << written << " (batch " << b << ")";
    again.Apply(&run.want);
  }
  EXPECT_GT(partly_written, 10);
  ExpectRows(*run.file, run.want, "at the end");
  ExpectReopens(std::move(run.file), run.want);
}

TEST(TieredRowLogTest, AFullDiskWhileCleaningKeepsTheReserveAndCleaningGoesOn) {
  // Only cleaning's writes fail (a write after cleaning's read): the refused write leaves the free segments as
  // they were (the reserve cleaning took for the failed write is free again), and cleaning works once there is room.
  FullFileRun run(17);
  ASSERT_NE(run.file, nullptr);
  int refusals = 0;
  for (int b = 0; b < 200 && refusals < 20; ++b) {
    Batch batch(run.file->layout(), 1 + static_cast<int64_t>(run.rng() % 6), &run.rng, &run.version);
    const TieredLogStats before = run.file->log_stats();
    g_read_seen = false;
    g_fail_after_read = true;
    const absl::Status s = batch.Write(run.file.get());
    g_fail_after_read = false;
    if (s.ok()) {
      batch.Apply(&run.want);
      continue;
    }
    ++refusals;
    ExpectFullDiskError(s, run.path);
    EXPECT_NE(s.message().find("rows"), std::string::npos) << s;
    // (The rows of a piece appended before the cleaning was needed are new.)
    const int64_t new_rows =
        TakeOldOrNew(*run.file, batch, &run.want, "after batch " + std::to_string(b) + " was refused");
    const TieredLogStats after = run.file->log_stats();
    EXPECT_EQ(after.segments_cleaned, before.segments_cleaned);
    EXPECT_GE(after.free_segments, 1) << "the cleaning reserve, batch " << b;
    if (new_rows == 0) {
      EXPECT_EQ(after.free_segments, before.free_segments) << "batch " << b;
    }
    // With room: this batch (it needs a cleaning again), then more.
    const absl::Status written = batch.Write(run.file.get());
    ASSERT_TRUE(written.ok()) << written << " (batch " << b << ")";
    batch.Apply(&run.want);
    EXPECT_GT(run.file->log_stats().segments_cleaned, before.segments_cleaned);
  }
  EXPECT_EQ(refusals, 20);
  WriteRandomBatches(run.file.get(), 40, &run.rng, &run.version, &run.want);
  ExpectRows(*run.file, run.want, "at the end");
  ExpectReopens(std::move(run.file), run.want);
}

}  // namespace
}  // namespace tf_embed_ops
