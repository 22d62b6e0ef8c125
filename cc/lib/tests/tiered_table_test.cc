// Tiered tables (docs/tiered_tables.md): the row file (CRC32C, header checks, never-written and corrupted
// records), the DRAM cache (eviction with write-back, prefetch, refusal of a step larger than the cache, faults
// that leave it consistent) and the optimizer step through the one row walk, bitwise equal to the in-memory table
// for every optimizer with float32 and bfloat16 storage and a cache much smaller than the table.
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/lib/distinct_rows.h"
#include "cc/lib/embedding_config.h"
#include "cc/lib/feature_layout.h"
#include "cc/lib/gradient_accumulation.h"
#include "cc/lib/optimizers/registry.h"
#include "cc/lib/table_update.h"
#include "cc/lib/tests/tiered_test_util.h"
#include "cc/lib/tiered_row_cache.h"
#include "cc/lib/tiered_row_file.h"
#include "cc/lib/tiered_row_storage.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace {

using tiered_test::EveryOptimizer;
using tiered_test::FileBytes;
using tiered_test::PatchFile;
using tiered_test::TempDir;
using tiered_test::Threads;

// ---------------------------------------------------------------------------------------------- helpers

TieredRowLayout Layout(int64_t num_rows, std::vector<StorageType> types, std::vector<int64_t> widths) {
  TieredRowLayout l;
  l.num_rows = num_rows;
  l.types = std::move(types);
  l.widths = std::move(widths);
  return l;
}

// Row r's buffer b, column d: a value that differs per row, buffer and column.
float InitialValue(int64_t r, int64_t b, int64_t d) {
  return 0.25f + 0.01f * static_cast<float>((r * 7 + b * 3 + d) % 50) - (b == 0 ? 0.3f : 0.0f);
}

// Writes every row of `cache` with InitialValue (slots >= 0 where the optimizer needs it: they are positive).
void InitialiseRows(TieredRowCache* cache) {
  const TieredRowLayout& l = cache->layout();
  std::vector<char> records(l.num_rows * l.record_bytes());
  std::vector<std::vector<float>> values(l.num_buffers());
  std::vector<const float*> pointers(l.num_buffers());
  for (int64_t r = 0; r < l.num_rows; ++r) {
    for (int64_t b = 0; b < l.num_buffers(); ++b) {
      values[b].resize(l.widths[b]);
      for (int64_t d = 0; d < l.widths[b]; ++d) values[b][d] = std::fabs(InitialValue(r, b, d)) + (b ? 0.1f : 0.0f);
      if (b == 0) {
        for (int64_t d = 0; d < l.widths[b]; ++d) values[b][d] = InitialValue(r, b, d);
      }
      pointers[b] = values[b].data();
    }
    EncodeRecord(l, pointers.data(), records.data() + r * l.record_bytes());
  }
  ASSERT_TRUE(cache->WriteRecords(0, l.num_rows, records.data()).ok());
}

// Every row of the table as float32, buffer by buffer ([b][r * width + d]).
std::vector<std::vector<float>> ReadAll(TieredRowCache* cache) {
  const TieredRowLayout& l = cache->layout();
  std::vector<char> records(l.num_rows * l.record_bytes());
  const absl::Status s = cache->ReadRecords(0, l.num_rows, records.data());
  EXPECT_TRUE(s.ok()) << s;
  std::vector<std::vector<float>> out(l.num_buffers());
  for (int64_t b = 0; b < l.num_buffers(); ++b) out[b].resize(l.num_rows * l.widths[b]);
  std::vector<float*> pointers(l.num_buffers());
  for (int64_t r = 0; r < l.num_rows; ++r) {
    for (int64_t b = 0; b < l.num_buffers(); ++b) pointers[b] = out[b].data() + r * l.widths[b];
    DecodeRecord(l, records.data() + r * l.record_bytes(), pointers.data());
  }
  return out;
}

// Every row as the row file holds it now (not through the cache), buffer by buffer.
std::vector<std::vector<float>> FileRows(const TieredRowCache& cache) {
  const TieredRowLayout& l = cache.layout();
  std::vector<char> records(l.num_rows * l.record_bytes());
  std::vector<char*> pointers(l.num_rows);
  for (int64_t r = 0; r < l.num_rows; ++r) pointers[r] = records.data() + r * l.record_bytes();
  const absl::Status s = cache.file().ReadRecords(0, l.num_rows, pointers.data());
  EXPECT_TRUE(s.ok()) << s;
  std::vector<std::vector<float>> out(l.num_buffers());
  for (int64_t b = 0; b < l.num_buffers(); ++b) out[b].resize(l.num_rows * l.widths[b]);
  std::vector<float*> buffers(l.num_buffers());
  for (int64_t r = 0; r < l.num_rows; ++r) {
    for (int64_t b = 0; b < l.num_buffers(); ++b) buffers[b] = out[b].data() + r * l.widths[b];
    DecodeRecord(l, pointers[r], buffers.data());
  }
  return out;
}

std::unique_ptr<TieredRowCache> NewCache(const std::string& path, const TieredRowLayout& layout, int64_t capacity,
                                         RowFileIo io = RowFileIo::Posix(), bool background_writeback = false) {
  absl::StatusOr<std::unique_ptr<TieredRowFile>> file = TieredRowFile::Create(path, "items", layout, io);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return nullptr;
  TieredRowCache::Options options;
  options.background_writeback = background_writeback;
  auto cache = std::make_unique<TieredRowCache>(*std::move(file), capacity, options);
  InitialiseRows(cache.get());
  return cache;
}

std::unique_ptr<TieredRowCache> Reopen(const std::string& path, const TieredRowLayout& layout, int64_t capacity) {
  absl::StatusOr<std::unique_ptr<TieredRowFile>> file = TieredRowFile::Open(path, "items", layout);
  EXPECT_TRUE(file.ok()) << file.status();
  return file.ok() ? std::make_unique<TieredRowCache>(*std::move(file), capacity) : nullptr;
}

std::vector<int64_t> Range(int64_t first, int64_t end) {
  std::vector<int64_t> rows;
  for (int64_t r = first; r < end; ++r) rows.push_back(r);
  return rows;
}

bool SameStats(const TieredCacheStats& a, const TieredCacheStats& b) { return a.AsArray() == b.AsArray(); }

ShardFn Serial() { return Threads(1); }

// One feature with one id per sample: its ids, layout and gradient ([ids, dim]).
struct Step {
  std::vector<int64_t> ids;
  FeatureLayout layout;
  std::vector<float> gradient;
  std::vector<GradientSource> sources;
  RowGradientPlan plan;

  Step(std::vector<int64_t> ids_in, int64_t dim, std::mt19937_64* rng) : ids(std::move(ids_in)) {
    layout.num_samples = static_cast<int64_t>(ids.size());
    layout.one_id_per_sample = true;
    layout.scale.assign(ids.size(), 1.0f);
    std::normal_distribution<float> g(0.0f, 1.0f);
    gradient.resize(ids.size() * dim);
    for (float& x : gradient) x = g(*rng);
    sources = {GradientSource{ids.data(), static_cast<int64_t>(ids.size()), &layout, gradient.data()}};
  }
  void Build(int64_t vocabulary_size) { plan.Build(&sources, vocabulary_size); }
};

// Skewed ids (a few rows take most of them), as recommender ids are.
std::vector<int64_t> SkewedIds(int64_t count, int64_t num_rows, std::mt19937_64* rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<int64_t> ids(count);
  for (int64_t& id : ids) id = std::min<int64_t>(num_rows - 1, static_cast<int64_t>(num_rows * std::pow(u(*rng), 3)));
  return ids;
}

// ---------------------------------------------------------------------------------------------- row file

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

// ---------------------------------------------------------------------------------------------- cache

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

// Injected I/O: writes fail with ENOSPC while `g_disk_full` is set (a full disk without a tiny filesystem).
std::atomic<bool> g_disk_full{false};
std::atomic<int> g_failed_writes{0};
ssize_t FullDiskPwritev(int fd, const struct iovec* iov, int iovcnt, off_t offset) {
  if (g_disk_full) {
    ++g_failed_writes;
    errno = ENOSPC;
    return -1;
  }
  return ::pwritev(fd, iov, iovcnt, offset);
}

TEST(TieredRowCacheTest, AFullDiskKeepsVictimsDirtyAndTheStepUnapplied) {
  TempDir dir;
  const std::string path = dir.File("t.rows");
  const TieredRowLayout layout = Layout(40, {StorageType::kFloat32, StorageType::kFloat32}, {3, 3});
  RowFileIo io = RowFileIo::Posix();
  io.pwritev = FullDiskPwritev;
  g_disk_full = false;
  auto cache = NewCache(path, layout, 6, io);
  TableOptimization o;
  o.optimizer = Adagrad{};
  std::mt19937_64 rng(2);
  Step first({0, 1, 2, 3, 4, 5, 5}, 3, &rng);
  first.Build(40);
  ASSERT_TRUE(UpdateTieredTable(o, 0.1f, first.plan, cache.get(), RoundingSpec(), Serial(), "t").ok());
  const std::vector<std::vector<float>> updated = ReadAll(cache.get());
  const TieredCacheStats stats = cache->stats();
  const std::vector<char> file = FileBytes(path);

  g_disk_full = true;
  Step second({10, 11, 12, 12}, 3, &rng);
  second.Build(40);
  const absl::Status s = UpdateTieredTable(o, 0.1f, second.plan, cache.get(), RoundingSpec(), Serial(), "t");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("cannot write row"), std::string::npos) << s;
  EXPECT_NE(s.message().find(path), std::string::npos) << s;
  EXPECT_GT(g_failed_writes.load(), 0);
  // Nothing evicted, nothing pinned, the dirty rows still in the cache, the file and every row unchanged.
  EXPECT_TRUE(SameStats(cache->stats(), stats));
  EXPECT_EQ(FileBytes(path), file);
  EXPECT_EQ(ReadAll(cache.get()), updated);
  EXPECT_EQ(cache->Flush().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(FileBytes(path), file);

  // Space again: the same step goes through, and a flush makes the file the table.
  g_disk_full = false;
  ASSERT_TRUE(UpdateTieredTable(o, 0.1f, second.plan, cache.get(), RoundingSpec(), Serial(), "t").ok());
  ASSERT_TRUE(cache->Flush().ok());
  const std::vector<std::vector<float>> expected = ReadAll(cache.get());
  auto reopened = Reopen(path, layout, 6);
  EXPECT_EQ(ReadAll(reopened.get()), expected);
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

// ---------------------------------------------------------------------------------------------- batched reads

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

// ---------------------------------------------------------------------------------------------- the step

// A dense in-memory table (the reference) and a tiered table with a cache of 1/8 of its rows start from the same
// rows; each step the same plan goes through UpdateTable and UpdateTieredTable.  Every row and slot must stay
// bitwise equal, in the cache, and in the file after a flush.
void ExpectTieredTrainsLikeInMemory(const TableOptimization& o, StorageType storage, const ShardFn& shard,
                                    bool background_writeback = false) {
  // A step has at most 16 distinct rows; the last window of a non-lazy walk is a partial one (131 = 8 * 16 + 3).
  constexpr int64_t kRows = 131, kDim = 5, kCapacity = 16;
  const std::vector<SlotInfo> slots = OptimizerSlots(o.optimizer);
  std::vector<StorageType> types(1 + slots.size(), storage);
  std::vector<int64_t> widths{kDim};
  for (const SlotInfo& s : slots) widths.push_back(SlotWidth(s, kDim));
  const TieredRowLayout layout = Layout(kRows, types, widths);
  TempDir dir;
  const std::string path = dir.File("t.rows");
  auto cache = NewCache(path, layout, kCapacity, RowFileIo::Posix(), background_writeback);
  ASSERT_NE(cache, nullptr);
  // A lazy step as the kernel runs it: the plan over the ids' positions among the batch's distinct rows, the walk
  // by position (UpdatePinnedPositions).
  const bool lazy = !OptimizerUpdatesAllRows(o.optimizer);
  auto by_position = NewCache(dir.File("p.rows"), layout, kCapacity, RowFileIo::Posix(), background_writeback);
  ASSERT_NE(by_position, nullptr);

  // The in-memory table holds exactly what the file was initialised with (decoded, re-encoded bitwise).
  const std::vector<std::vector<float>> initial = ReadAll(cache.get());
  std::vector<std::vector<float>> f32(layout.num_buffers());
  std::vector<std::vector<uint16_t>> b16(layout.num_buffers());
  StoredTableBuffers dense;
  dense.vocabulary_size = kRows;
  dense.dim = kDim;
  for (int64_t b = 0; b < layout.num_buffers(); ++b) {
    StoredBuffer buffer{nullptr, storage};
    if (storage == StorageType::kFloat32) {
      f32[b] = initial[b];
      buffer.data = f32[b].data();
    } else {
      for (float x : initial[b]) b16[b].push_back(FloatToBfloat16Nearest(x));
      buffer.data = b16[b].data();
    }
    if (b == 0) {
      dense.weights = buffer;
    } else {
      dense.slots.push_back(buffer);
    }
  }
  std::mt19937_64 rng(17);
  for (int64_t s = 0; s < 6; ++s) {
    Step step(SkewedIds(16, kRows, &rng), kDim, &rng);
    step.Build(kRows);
    const float lr = 0.05f * static_cast<float>(s + 1);
    const RoundingSpec rounding{Rounding::kStochastic, 11, s, 2};
    dense.rounding = rounding;
    UpdateTable(o, lr, step.plan, dense, shard);
    const absl::Status status = UpdateTieredTable(o, lr, step.plan, cache.get(), rounding, shard, "t");
    ASSERT_TRUE(status.ok()) << status;
    if (s % 2 == 1) ASSERT_TRUE(cache->Prefetch(SkewedIds(1, kRows, &rng)).ok());
    if (lazy) {
      const DistinctBatch batch = FindDistinctRows(step.ids, kRows);
      std::vector<GradientSource> sources = step.sources;
      sources[0].ids = batch.positions.data();
      RowGradientPlan plan;
      plan.Build(&sources, static_cast<int64_t>(batch.rows.size()));
      TieredPin pin;
      ASSERT_TRUE(by_position->Acquire(batch.rows, &pin).ok());
      UpdatePinnedPositions(o, lr, plan, layout, pin, rounding, shard);
      by_position->Release(&pin, /*dirty=*/true);
    }
  }
  auto expect_equal = [&](const std::vector<std::vector<float>>& tiered, const char* where) {
    for (int64_t b = 0; b < layout.num_buffers(); ++b) {
      std::vector<float> want(kRows * widths[b]);
      for (size_t i = 0; i < want.size(); ++i) {
        want[i] = storage == StorageType::kFloat32 ? f32[b][i] : Bfloat16ToFloat(b16[b][i]);
      }
      EXPECT_EQ(std::memcmp(tiered[b].data(), want.data(), want.size() * sizeof(float)), 0)
          << OptimizerName(o.optimizer) << " " << StorageTypeName(storage) << " buffer " << b << " " << where;
    }
  };
  expect_equal(ReadAll(cache.get()), "through the cache");
  EXPECT_GT(cache->stats().evictions, 0);  // the cache was too small to hold the rows the steps touched
  if (lazy) {
    expect_equal(ReadAll(by_position.get()), "by position");
    EXPECT_GT(by_position->stats().evictions, 0);
  }
  ASSERT_TRUE(cache->Flush().ok());
  auto reopened = Reopen(path, layout, kCapacity);
  expect_equal(ReadAll(reopened.get()), "in the file");
}

TEST(TieredTableUpdateTest, TrainsBitwiseLikeTheInMemoryTableForEveryOptimizer) {
  for (const OptimizerParams& p : EveryOptimizer()) {
    TableOptimization o;
    o.optimizer = p;
    o.gradient_clipping = {-1.5f, 1.5f};
    o.weight_decay_factor = 0.01f;
    o.weight_clipping = {-2.0f, 2.0f};
    for (StorageType storage : {StorageType::kFloat32, StorageType::kBfloat16}) {
      ExpectTieredTrainsLikeInMemory(o, storage, Serial());
    }
    ExpectTieredTrainsLikeInMemory(o, StorageType::kBfloat16, Threads(3));
    ExpectTieredTrainsLikeInMemory(o, StorageType::kFloat32, Threads(2), /*background_writeback=*/true);
  }
}

// Injected writes: counted per thread (the background write-back writes from the cache's own thread), failing with
// ENOSPC while g_disk_full is set.
std::atomic<int> g_writes_elsewhere{0};
std::thread::id g_test_thread;
ssize_t ThreadCountingPwritev(int fd, const struct iovec* iov, int iovcnt, off_t offset) {
  if (std::this_thread::get_id() != g_test_thread) ++g_writes_elsewhere;
  if (g_disk_full) {
    errno = ENOSPC;
    return -1;
  }
  return ::pwritev(fd, iov, iovcnt, offset);
}

TEST(TieredTableUpdateTest, BackgroundWritebackCleansVictimsAheadAndKeepsFailedRowsDirty) {
  // Adagrad steps on a cache of 24 of 300 rows with the write-back thread on, the disk full for a stretch of steps
  // in the middle: the steps that must write a dirty victim then fail without changing any row (their rows are
  // retried after), and at the end every row equals the in-memory table's, in the cache and in the file.
  constexpr int64_t kRows = 300, kDim = 4, kCapacity = 24;
  TableOptimization o;
  o.optimizer = Adagrad{};
  const TieredRowLayout layout = Layout(kRows, {StorageType::kFloat32, StorageType::kFloat32}, {kDim, kDim});
  TempDir dir;
  const std::string path = dir.File("t.rows");
  RowFileIo io = RowFileIo::Posix();
  io.pwritev = ThreadCountingPwritev;
  g_disk_full = false;
  g_writes_elsewhere = 0;
  g_test_thread = std::this_thread::get_id();
  auto cache = NewCache(path, layout, kCapacity, io, /*background_writeback=*/true);
  std::vector<std::vector<float>> dense_rows = ReadAll(cache.get());
  const TableBuffers dense{dense_rows[0].data(), {dense_rows[1].data()}, kRows, kDim};
  std::mt19937_64 rng(23);
  int failed = 0;
  for (int s = 0; s < 60; ++s) {
    g_disk_full = s >= 20 && s < 30;
    Step step(SkewedIds(12, kRows, &rng), kDim, &rng);
    step.Build(kRows);
    cache->WaitForWriteback();  // the thread has cleaned what the previous step asked for
    const std::vector<std::vector<float>> before = ReadAll(cache.get());
    const absl::Status status = UpdateTieredTable(o, 0.1f, step.plan, cache.get(), RoundingSpec(), Serial(), "t");
    if (!status.ok()) {
      EXPECT_TRUE(g_disk_full) << status;
      EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
      EXPECT_EQ(ReadAll(cache.get()), before) << "step " << s;
      ++failed;
      continue;
    }
    UpdateTable(o, 0.1f, step.plan, dense, Serial());
  }
  EXPECT_GT(failed, 0);
  EXPECT_GT(g_writes_elsewhere.load(), 0);  // the thread did write rows back
  EXPECT_EQ(ReadAll(cache.get()), dense_rows);
  ASSERT_TRUE(cache->Flush().ok());
  EXPECT_EQ(ReadAll(Reopen(path, layout, 4).get()), dense_rows);
}

TEST(TieredTableUpdateTest, PrefetchesBesideTheWalkChangeNoResult) {
  // While a step's pinned rows are updated (no lock held), another thread prefetches other rows, evicting and
  // writing back dirty unpinned rows of earlier steps: the rows must end bitwise as the in-memory table's.
  constexpr int64_t kRows = 200, kDim = 8, kCapacity = 24;
  TableOptimization o;
  o.optimizer = Adagrad{};
  const TieredRowLayout layout = Layout(kRows, {StorageType::kFloat32, StorageType::kFloat32}, {kDim, kDim});
  TempDir dir;
  const std::string path = dir.File("t.rows");
  auto cache = NewCache(path, layout, kCapacity);
  std::vector<std::vector<float>> dense_rows = ReadAll(cache.get());
  const TableBuffers dense{dense_rows[0].data(), {dense_rows[1].data()}, kRows, kDim};
  std::mt19937_64 rng(9);
  for (int s = 0; s < 20; ++s) {
    Step step(SkewedIds(16, kRows, &rng), kDim, &rng);
    step.Build(kRows);
    UpdateTable(o, 0.1f, step.plan, dense, Serial());
    TieredPin pin;
    ASSERT_TRUE(AcquirePlanRows(step.plan, cache.get(), "t", &pin).ok());
    std::vector<std::vector<int64_t>> next(10);
    for (auto& rows : next) {
      rows = SkewedIds(6, kRows, &rng);
      std::sort(rows.begin(), rows.end());
      rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    }
    std::thread prefetcher([&] {
      for (const auto& rows : next) EXPECT_TRUE(cache->Prefetch(rows).ok());
    });
    UpdatePinnedRows(o, 0.1f, step.plan, layout, pin, RoundingSpec(), Threads(2));
    prefetcher.join();
    cache->Release(&pin, /*dirty=*/true);
  }
  EXPECT_GT(cache->stats().evictions, 0);
  EXPECT_EQ(ReadAll(cache.get()), dense_rows);
  ASSERT_TRUE(cache->Flush().ok());
  EXPECT_EQ(ReadAll(Reopen(path, layout, 4).get()), dense_rows);
}

TEST(TieredTableUpdateTest, AsynchronousPrefetchOfTheNextStepChangesNoResultAndItsRowsHit) {
  // Each step pins its rows, asks the cache's thread to prefetch the next step's rows (StartPrefetch returns at
  // once), updates its own rows meanwhile and releases them; a cache of 40 of 300 rows with the write-back thread
  // on.  Every row ends bitwise as the in-memory table's, and each next step reads nothing itself: what it needs
  // was prefetched (its rows fit beside the pinned ones), so its Acquire waited for the prefetch and hit.
  constexpr int64_t kRows = 300, kDim = 8, kCapacity = 40;
  TableOptimization o;
  o.optimizer = Adagrad{};
  const TieredRowLayout layout = Layout(kRows, {StorageType::kFloat32, StorageType::kFloat32}, {kDim, kDim});
  TempDir dir;
  const std::string path = dir.File("t.rows");
  auto cache = NewCache(path, layout, kCapacity, RowFileIo::Posix(), /*background_writeback=*/true);
  std::vector<std::vector<float>> dense_rows = ReadAll(cache.get());
  const TableBuffers dense{dense_rows[0].data(), {dense_rows[1].data()}, kRows, kDim};
  std::mt19937_64 rng(31);
  std::vector<std::unique_ptr<Step>> steps;  // (a Step points into itself: never moved)
  for (int s = 0; s < 30; ++s) {
    steps.push_back(std::make_unique<Step>(SkewedIds(16, kRows, &rng), kDim, &rng));
    steps.back()->Build(kRows);
  }
  int64_t prefetched_steps_missing = 0;
  for (size_t s = 0; s < steps.size(); ++s) {
    UpdateTable(o, 0.1f, steps[s]->plan, dense, Serial());
    const int64_t misses_before = cache->stats().misses;
    TieredPin pin;
    ASSERT_TRUE(AcquirePlanRows(steps[s]->plan, cache.get(), "t", &pin).ok());
    if (s > 0) prefetched_steps_missing += cache->stats().misses - misses_before;
    if (s + 1 < steps.size()) {
      ASSERT_TRUE(cache->StartPrefetch(PlanRows(steps[s + 1]->plan, kRows)).ok());
    }
    UpdatePinnedRows(o, 0.1f, steps[s]->plan, layout, pin, RoundingSpec(), Threads(2));
    cache->Release(&pin, /*dirty=*/true);
  }
  EXPECT_EQ(prefetched_steps_missing, 0);
  EXPECT_GT(cache->stats().evictions, 0);
  EXPECT_TRUE(cache->WaitForPrefetch().ok());
  EXPECT_EQ(ReadAll(cache.get()), dense_rows);
  ASSERT_TRUE(cache->Flush().ok());
  EXPECT_EQ(ReadAll(Reopen(path, layout, 4).get()), dense_rows);
}

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

TEST(TieredTableUpdateTest, NumericsCheckFindsTheSameRowAndWritesNothing) {
  TempDir dir;
  const std::string path = dir.File("t.rows");
  const TieredRowLayout layout = Layout(50, {StorageType::kFloat32}, {3});
  auto cache = NewCache(path, layout, 5);
  std::mt19937_64 rng(4);
  Step step({30, 7, 41}, 3, &rng);
  step.gradient[1 * 3 + 2] = 3e38f;  // row 7: w - lr * g overflows with lr = -4
  step.gradient[0 * 3 + 0] = 3e38f;  // row 30 too
  step.Build(50);
  TableOptimization o;
  o.optimizer = Sgd{};
  const std::vector<char> file = FileBytes(path);
  const std::vector<std::vector<float>> rows = ReadAll(cache.get());
  const auto bad = FindNonFiniteTieredUpdate(o, -4.0f, step.plan, cache.get(), RoundingSpec(), Serial(), "t");
  ASSERT_TRUE(bad.ok()) << bad.status();
  EXPECT_TRUE(bad->found);
  EXPECT_EQ(bad->row, 7);
  // By position (as the kernel checks a lazy step): the same row, as the table's row.
  const DistinctBatch batch = FindDistinctRows(step.ids, 50);
  std::vector<GradientSource> sources = step.sources;
  sources[0].ids = batch.positions.data();
  RowGradientPlan plan;
  plan.Build(&sources, static_cast<int64_t>(batch.rows.size()));
  TieredPin pin;
  ASSERT_TRUE(cache->Acquire(batch.rows, &pin).ok());
  const NonFiniteUpdate by_position =
      FindNonFinitePinnedPositions(o, -4.0f, plan, layout, pin, RoundingSpec(), Serial());
  cache->Release(&pin, /*dirty=*/false);
  EXPECT_TRUE(by_position.found);
  EXPECT_EQ(by_position.row, 7);
  EXPECT_EQ(FileBytes(path), file);
  EXPECT_EQ(ReadAll(cache.get()), rows);
  // Non-lazy: the walk covers every row in windows; the first window with a bad row reports it.
  Adam non_lazy;
  non_lazy.use_non_lazy_adam = true;
  TableOptimization a;
  a.optimizer = non_lazy;
  const TieredRowLayout adam_layout =
      Layout(50, {StorageType::kFloat32, StorageType::kFloat32, StorageType::kFloat32}, {3, 3, 3});
  auto adam = NewCache(dir.File("adam.rows"), adam_layout, 5);
  Step nan_step({42}, 3, &rng);
  nan_step.gradient[1] = std::nanf("");
  nan_step.Build(50);
  const auto nan = FindNonFiniteTieredUpdate(a, 0.1f, nan_step.plan, adam.get(), RoundingSpec(), Serial(), "t");
  ASSERT_TRUE(nan.ok());
  EXPECT_TRUE(nan->found);
  EXPECT_EQ(nan->row, 42);
  EXPECT_TRUE(nan->in_gradient);
}

}  // namespace
}  // namespace tf_embed_ops
