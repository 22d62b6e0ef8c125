// Helpers of the tiered row-file, row-cache and update tests (tiered_row_file_test.cc, tiered_row_cache_test.cc,
// tiered_row_cache_read_test.cc, tiered_table_update_test.cc): a layout, a cache over a fresh file whose rows are
// initialised to known values, the rows read back through the cache or from the file, and skewed ids.
#ifndef TF_EMBED_OPS_CC_LIB_TESTS_TIERED_CACHE_TEST_UTIL_H_
#define TF_EMBED_OPS_CC_LIB_TESTS_TIERED_CACHE_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cc/lib/shard.h"
#include "cc/lib/tests/tiered_test_util.h"
#include "cc/lib/tiered_row_cache.h"
#include "cc/lib/tiered_row_file.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace tiered_test {

inline TieredRowLayout Layout(int64_t num_rows, std::vector<StorageType> types, std::vector<int64_t> widths) {
  TieredRowLayout l;
  l.num_rows = num_rows;
  l.types = std::move(types);
  l.widths = std::move(widths);
  return l;
}

// Row r's buffer b, column d: a value that differs per row, buffer and column.
inline float InitialValue(int64_t r, int64_t b, int64_t d) {
  return 0.25f + 0.01f * static_cast<float>((r * 7 + b * 3 + d) % 50) - (b == 0 ? 0.3f : 0.0f);
}

// Writes every row of `cache` with InitialValue (slots >= 0 where the optimizer needs it: they are positive).
inline void InitialiseRows(TieredRowCache* cache) {
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

// Consecutive records of rows 0, 1, ... decoded to float32, buffer by buffer ([b][r * width + d]).
inline std::vector<std::vector<float>> DecodeRows(const TieredRowLayout& l, const std::vector<char>& records) {
  std::vector<std::vector<float>> out(l.num_buffers());
  for (int64_t b = 0; b < l.num_buffers(); ++b) out[b].resize(l.num_rows * l.widths[b]);
  std::vector<float*> pointers(l.num_buffers());
  for (int64_t r = 0; r < l.num_rows; ++r) {
    for (int64_t b = 0; b < l.num_buffers(); ++b) pointers[b] = out[b].data() + r * l.widths[b];
    DecodeRecord(l, records.data() + r * l.record_bytes(), pointers.data());
  }
  return out;
}

// Every row of the table as float32 (through the cache), buffer by buffer.
inline std::vector<std::vector<float>> ReadAll(TieredRowCache* cache) {
  const TieredRowLayout& l = cache->layout();
  std::vector<char> records(l.num_rows * l.record_bytes());
  const absl::Status s = cache->ReadRecords(0, l.num_rows, records.data());
  EXPECT_TRUE(s.ok()) << s;
  return DecodeRows(l, records);
}

// Every row as the row file holds it now (not through the cache), buffer by buffer.
inline std::vector<std::vector<float>> FileRows(const TieredRowCache& cache) {
  const TieredRowLayout& l = cache.layout();
  std::vector<char> records(l.num_rows * l.record_bytes());
  std::vector<char*> pointers(l.num_rows);
  for (int64_t r = 0; r < l.num_rows; ++r) pointers[r] = records.data() + r * l.record_bytes();
  const absl::Status s = cache.file().ReadRecords(0, l.num_rows, pointers.data());
  EXPECT_TRUE(s.ok()) << s;
  return DecodeRows(l, records);
}

inline std::unique_ptr<TieredRowCache> NewCache(const std::string& path, const TieredRowLayout& layout,
                                                int64_t capacity, RowFileIo io = RowFileIo::Posix(),
                                                bool background_writeback = false) {
  absl::StatusOr<std::unique_ptr<TieredRowFile>> file = TieredRowFile::Create(path, "items", layout, io);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return nullptr;
  TieredRowCache::Options options;
  options.background_writeback = background_writeback;
  auto cache = std::make_unique<TieredRowCache>(*std::move(file), capacity, options);
  InitialiseRows(cache.get());
  return cache;
}

inline std::unique_ptr<TieredRowCache> Reopen(const std::string& path, const TieredRowLayout& layout,
                                              int64_t capacity) {
  absl::StatusOr<std::unique_ptr<TieredRowFile>> file = TieredRowFile::Open(path, "items", layout);
  EXPECT_TRUE(file.ok()) << file.status();
  return file.ok() ? std::make_unique<TieredRowCache>(*std::move(file), capacity) : nullptr;
}

inline std::vector<int64_t> Range(int64_t first, int64_t end) {
  std::vector<int64_t> rows;
  for (int64_t r = first; r < end; ++r) rows.push_back(r);
  return rows;
}

inline bool SameStats(const TieredCacheStats& a, const TieredCacheStats& b) { return a.AsArray() == b.AsArray(); }

inline ShardFn Serial() { return Threads(1); }

// Skewed ids (a few rows take most of them), as recommender ids are.
inline std::vector<int64_t> SkewedIds(int64_t count, int64_t num_rows, std::mt19937_64* rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<int64_t> ids(count);
  for (int64_t& id : ids) id = std::min<int64_t>(num_rows - 1, static_cast<int64_t>(num_rows * std::pow(u(*rng), 3)));
  return ids;
}

}  // namespace tiered_test
}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_TESTS_TIERED_CACHE_TEST_UTIL_H_
