// The row file of tiered tables (docs/tiered_tables.md): CRC32C, the record layout, header checks, never-written
// and corrupted records, and batched reads of runs of records (cached runs at once, cold runs started together).
#include "cc/lib/tiered_row_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/lib/tests/tiered_cache_test_util.h"
#include "cc/lib/tests/tiered_test_util.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace tiered_test {
namespace {

// CRC32C written from its definition, bit by bit (the reference for the library's table and SSE4.2 paths).
uint32_t BitwiseCrc32c(const unsigned char* p, size_t n) {
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

TEST(TieredRowFileTest, Crc32cMatchesTheStandardCheckValueAndABitwiseReference) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xe3069283u);
  EXPECT_EQ(Crc32c("", 0), 0u);
  std::mt19937_64 rng(3);
  // Around the three-lane blocks (3 x 128 bytes), a record of a 64-wide Adagrad table (516), and an odd start.
  for (size_t n : {1, 7, 8, 9, 63, 64, 383, 384, 385, 391, 516, 767, 768, 1000, 1155, 4096}) {
    for (size_t start : {0, 3}) {
      std::vector<unsigned char> bytes(n + start);
      for (auto& b : bytes) b = static_cast<unsigned char>(rng());
      EXPECT_EQ(Crc32c(bytes.data() + start, n), BitwiseCrc32c(bytes.data() + start, n)) << n << " " << start;
    }
  }
}

TEST(TieredRowFileTest, RecordLayoutPadsEachBufferToFourBytes) {
  const TieredRowLayout l =
      Layout(10, {StorageType::kBfloat16, StorageType::kFloat32, StorageType::kFloat16}, {3, 3, 1});
  EXPECT_EQ(l.offset(0), 0);
  EXPECT_EQ(l.offset(1), 8);   // 6 bytes of bfloat16, padded
  EXPECT_EQ(l.offset(2), 20);  // + 12
  EXPECT_EQ(l.payload_bytes(), 24);
  EXPECT_EQ(l.record_bytes(), 28);
  // Encode rounds to nearest; decode widens exactly.
  const float w[3] = {1.0f, 1.00390625f + 1e-6f, -2.5f}, s[3] = {0.1f, 0.2f, 0.3f}, c[1] = {65504.0f};
  const float* in[3] = {w, s, c};
  std::vector<char> record(l.record_bytes());
  EncodeRecord(l, in, record.data());
  float ow[3], os[3], oc[1];
  float* out[3] = {ow, os, oc};
  DecodeRecord(l, record.data(), out);
  for (int d = 0; d < 3; ++d) EXPECT_EQ(ow[d], Bfloat16ToFloat(FloatToBfloat16Nearest(w[d])));
  for (int d = 0; d < 3; ++d) EXPECT_EQ(os[d], s[d]);
  EXPECT_EQ(oc[0], 65504.0f);
  uint32_t crc;
  std::memcpy(&crc, record.data() + 24, 4);
  EXPECT_EQ(crc, BitwiseCrc32c(reinterpret_cast<const unsigned char*>(record.data()), 24));
}

TEST(TieredRowFileTest, CreateRefusesAnExistingFileAndOpenChecksTheHeader) {
  TempDir dir;
  const std::string path = dir.File("t.rows");
  const TieredRowLayout layout = Layout(20, {StorageType::kFloat32, StorageType::kBfloat16}, {4, 4});
  int64_t file_bytes = 0;
  {
    auto file = TieredRowFile::Create(path, "items", layout);
    ASSERT_TRUE(file.ok()) << file.status();
    file_bytes = (*file)->file_bytes();
    // Open wants a file closed cleanly (a Sync after its last write).
    EXPECT_EQ(TieredRowFile::Open(path, "items", layout).status().code(), absl::StatusCode::kFailedPrecondition);
    ASSERT_TRUE((*file)->Sync().ok());
  }
  // The header, 20 rows + spare slots (at least three segments), the map (its header, 4 bytes per row, a CRC).
  const int64_t segment = TieredRowFile::SegmentSlotsFor(20);
  EXPECT_EQ(segment, 2);
  EXPECT_EQ(TieredRowFile::PhysicalSlotsFor(20, segment), 26);
  EXPECT_EQ(file_bytes, TieredRowFile::kHeaderBytes + 26 * layout.record_bytes() + 16 + 4 * 20 + 4);
  EXPECT_EQ(FileBytes(path).size(), static_cast<size_t>(file_bytes));
  const auto again = TieredRowFile::Create(path, "items", layout);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(again.status().message().find("table 'items'"), std::string::npos) << again.status();
  EXPECT_TRUE(TieredRowFile::Open(path, "items", layout).ok());

  const std::vector<std::pair<TieredRowLayout, std::string>> mismatches = {
      {Layout(21, {StorageType::kFloat32, StorageType::kBfloat16}, {4, 4}), "num_rows is 20"},
      {Layout(20, {StorageType::kFloat32}, {4}), "buffer count"},
      {Layout(20, {StorageType::kFloat32, StorageType::kFloat32}, {4, 4}), "buffer 1 storage type is bfloat16"},
      {Layout(20, {StorageType::kFloat32, StorageType::kBfloat16}, {4, 1}), "buffer 1 width is 4"},
  };
  for (const auto& [other, message] : mismatches) {
    const auto opened = TieredRowFile::Open(path, "items", other);
    EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_NE(opened.status().message().find(message), std::string::npos) << opened.status();
    EXPECT_NE(opened.status().message().find(path), std::string::npos) << opened.status();
  }
  // A corrupted header byte, a bad magic, a truncated file, a missing file.
  const std::vector<char> original = FileBytes(path);
  PatchFile(path, 17, {'\x7f'});
  EXPECT_EQ(TieredRowFile::Open(path, "items", layout).status().code(), absl::StatusCode::kDataLoss);
  PatchFile(path, 0, std::vector<char>(original.begin(), original.begin() + 32));
  PatchFile(path, 0, {'X'});
  const auto bad_magic = TieredRowFile::Open(path, "items", layout);
  EXPECT_EQ(bad_magic.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad_magic.status().message().find("bad magic"), std::string::npos) << bad_magic.status();
  PatchFile(path, 0, {'T'});
  ASSERT_TRUE(TieredRowFile::Open(path, "items", layout).ok());
  ASSERT_EQ(truncate(path.c_str(), static_cast<off_t>(original.size() - 1)), 0);
  const auto truncated = TieredRowFile::Open(path, "items", layout);
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(truncated.status().message().find("truncated"), std::string::npos) << truncated.status();
  EXPECT_EQ(TieredRowFile::Open(dir.File("missing.rows"), "items", layout).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(TieredRowFileTest, RejectsBadGeometryBeforeCreatingAFile) {
  TempDir dir;
  const std::string path = dir.File("t.rows");
  EXPECT_EQ(TieredRowFile::Create(path, "items", Layout(0, {StorageType::kFloat32}, {4})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TieredRowFile::Create(path, "items", Layout(5, {StorageType::kFloat32}, {0})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TieredRowFile::Create(path, "items", Layout(5, {}, {})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      TieredRowFile::Create(path, "items", Layout(int64_t{1} << 62, {StorageType::kFloat32}, {4})).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(FileBytes(path).empty());  // nothing was created
}

TEST(TieredRowFileTest, NeverWrittenAndCorruptedRecordsAreErrorsNamingTheRow) {
  TempDir dir;
  const std::string path = dir.File("t.rows");
  const TieredRowLayout layout = Layout(8, {StorageType::kFloat32}, {4});
  auto file = TieredRowFile::Create(path, "items", layout);
  ASSERT_TRUE(file.ok());
  std::vector<char> record(layout.record_bytes());
  char* p = record.data();
  const absl::Status never = (*file)->ReadRecords(5, 1, &p);
  EXPECT_EQ(never.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(never.message().find("row 5 was never written"), std::string::npos) << never;

  const float w[4] = {1, 2, 3, 4};
  const float* in[1] = {w};
  EncodeRecord(layout, in, record.data());
  ASSERT_TRUE((*file)->WriteRecords(5, 1, &p).ok());
  std::vector<char> back(layout.record_bytes());
  char* q = back.data();
  ASSERT_TRUE((*file)->ReadRecords(5, 1, &q).ok());
  EXPECT_EQ(back, record);
  EXPECT_EQ((*file)->RecordOffset(5), TieredRowFile::kHeaderBytes);  // the first record appended: slot 0
  EXPECT_EQ((*file)->RecordOffset(4), -1);
  PatchFile(path, (*file)->RecordOffset(5) + 6, {'\x55'});
  const absl::Status corrupted = (*file)->ReadRecords(5, 1, &q);
  EXPECT_EQ(corrupted.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(corrupted.message().find("row 5 is corrupted"), std::string::npos) << corrupted;
  EXPECT_NE(corrupted.message().find(path), std::string::npos) << corrupted;
  EXPECT_EQ((*file)->ReadRecords(7, 2, &q).code(), absl::StatusCode::kInvalidArgument);  // past the end
}

// Injected reads: preadv2(RWF_NOWAIT) says "not in the page cache" (EAGAIN) for runs starting at an odd row, or
// refuses RWF_NOWAIT altogether (EOPNOTSUPP); every call is counted.
std::atomic<int> g_nowait_calls{0}, g_fadvise_calls{0}, g_preadv_calls{0};
std::atomic<bool> g_nowait_unsupported{false};
int64_t g_record_bytes = 0;
ssize_t ColdOddRunsPreadv2(int fd, const struct iovec* iov, int iovcnt, off_t offset, int flags) {
  ++g_nowait_calls;
  EXPECT_EQ(flags, RWF_NOWAIT);
  if (g_nowait_unsupported) {
    errno = EOPNOTSUPP;
    return -1;
  }
  if ((offset - TieredRowFile::kHeaderBytes) / g_record_bytes % 2 == 1) {
    errno = EAGAIN;
    return -1;
  }
  return ::preadv2(fd, iov, iovcnt, offset, flags);
}
int CountingFadvise(int fd, off_t offset, off_t len, int advice) {
  if (advice != POSIX_FADV_WILLNEED) return ::posix_fadvise(fd, offset, len, advice);  // (RANDOM, at open)
  ++g_fadvise_calls;
  EXPECT_EQ((offset - TieredRowFile::kHeaderBytes) % g_record_bytes, 0);
  return ::posix_fadvise(fd, offset, len, advice);
}
ssize_t CountingPreadv(int fd, const struct iovec* iov, int iovcnt, off_t offset) {
  ++g_preadv_calls;
  return ::preadv(fd, iov, iovcnt, offset);
}

RowFileIo CountingIo() {
  RowFileIo io = RowFileIo::Posix();
  io.preadv2 = ColdOddRunsPreadv2;
  io.fadvise = CountingFadvise;
  io.preadv = CountingPreadv;
  g_nowait_calls = g_fadvise_calls = g_preadv_calls = 0;
  g_nowait_unsupported = false;
  return io;
}

// Runs of `rows` (ascending) over records in `buffer` (one per row, in order).
std::vector<RecordRun> RunsOf(const std::vector<std::vector<int64_t>>& runs, int64_t record_bytes,
                              std::vector<char>* buffer, std::vector<char*>* pointers) {
  int64_t total = 0;
  for (const auto& run : runs) total += static_cast<int64_t>(run.size());
  buffer->assign(total * record_bytes, '\x5a');
  pointers->resize(total);
  // Records land in reverse order in the buffer: a batch must follow each record's own pointer.
  for (int64_t i = 0; i < total; ++i) (*pointers)[i] = buffer->data() + (total - 1 - i) * record_bytes;
  std::vector<RecordRun> out;
  int64_t at = 0;
  for (const auto& run : runs) {
    out.push_back(RecordRun{run[0], static_cast<int64_t>(run.size()), pointers->data() + at});
    at += static_cast<int64_t>(run.size());
  }
  return out;
}

TEST(TieredRowFileTest, ReadRunsReadsCachedRunsAtOnceAndStartsTheColdOnesTogether) {
  TempDir dir;
  const std::string path = dir.File("t.rows");
  const TieredRowLayout layout = Layout(40, {StorageType::kFloat32, StorageType::kBfloat16}, {3, 3});
  {
    auto cache = NewCache(path, layout, 4);  // the file, every row written (row r in slot r), then closed cleanly
    ASSERT_TRUE(cache->Flush().ok());
  }
  const std::vector<char> bytes = FileBytes(path);
  g_record_bytes = layout.record_bytes();
  absl::StatusOr<std::unique_ptr<TieredRowFile>> file = TieredRowFile::Open(path, "items", layout, CountingIo());
  ASSERT_TRUE(file.ok()) << file.status();
  g_nowait_calls = g_fadvise_calls = g_preadv_calls = 0;  // (the header was read by Open)
  const std::vector<std::vector<int64_t>> rows = {{1, 2}, {5}, {8, 9, 10}, {20}, {39}};
  std::vector<char> buffer;
  std::vector<char*> pointers;
  const std::vector<RecordRun> runs = RunsOf(rows, layout.record_bytes(), &buffer, &pointers);
  ASSERT_TRUE((*file)->ReadRuns(runs).ok());
  int64_t i = 0;
  for (const auto& run : rows) {
    for (int64_t row : run) {
      EXPECT_EQ(std::memcmp(pointers[i++], bytes.data() + TieredRowFile::kHeaderBytes + row * layout.record_bytes(),
                            layout.record_bytes()),
                0)
          << "row " << row;
    }
  }
  // Every run is tried without blocking; the three "cold" ones (first rows 1, 5, 39) are all started before the
  // first is read.
  EXPECT_EQ(g_nowait_calls.load(), 5);
  EXPECT_EQ(g_fadvise_calls.load(), 3);
  EXPECT_EQ(g_preadv_calls.load(), 3);
  // One run has nothing to overlap: it is read directly.
  ASSERT_TRUE((*file)->ReadRuns({runs[1]}).ok());
  EXPECT_EQ(g_nowait_calls.load(), 5);
  EXPECT_EQ(g_preadv_calls.load(), 4);
  // Out of range: refused before any read.
  const RecordRun bad{38, 3, pointers.data()};
  const absl::Status s = (*file)->ReadRuns({runs[0], bad});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rows [38, 41) outside [0, 40)"), std::string::npos) << s;
  EXPECT_EQ(g_preadv_calls.load(), 4);
}

TEST(TieredRowFileTest, ReadRunsFallsBackToOneReadPerRunWithoutNowait) {
  TempDir dir;
  const std::string path = dir.File("t.rows");
  const TieredRowLayout layout = Layout(20, {StorageType::kFloat32}, {2});
  ASSERT_TRUE(NewCache(path, layout, 4)->Flush().ok());
  const std::vector<char> bytes = FileBytes(path);
  g_record_bytes = layout.record_bytes();
  absl::StatusOr<std::unique_ptr<TieredRowFile>> file = TieredRowFile::Open(path, "items", layout, CountingIo());
  ASSERT_TRUE(file.ok()) << file.status();
  g_nowait_calls = g_fadvise_calls = g_preadv_calls = 0;  // (the header was read by Open)
  g_nowait_unsupported = true;
  std::vector<char> buffer;
  std::vector<char*> pointers;
  const std::vector<RecordRun> runs = RunsOf({{2}, {4, 5}, {11}}, layout.record_bytes(), &buffer, &pointers);
  for (int repeat = 0; repeat < 2; ++repeat) {
    ASSERT_TRUE((*file)->ReadRuns(runs).ok());
    EXPECT_EQ(std::memcmp(pointers[3], bytes.data() + TieredRowFile::kHeaderBytes + 11 * layout.record_bytes(),
                          layout.record_bytes()),
              0);
  }
  EXPECT_EQ(g_nowait_calls.load(), 1);  // refused once, never tried again
  EXPECT_EQ(g_fadvise_calls.load(), 0);
  EXPECT_EQ(g_preadv_calls.load(), 6);
}

}  // namespace
}  // namespace tiered_test
}  // namespace tf_embed_ops
