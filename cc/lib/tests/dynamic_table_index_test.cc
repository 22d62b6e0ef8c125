// The key side of dynamic tables (docs/dynamic_tables_internals.md): the key fingerprint mix, the chunked arena
// whose rows never move, and the key index against a map.
#include "cc/lib/dynamic_table_index.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "cc/lib/dynamic_table.h"
#include "cc/lib/dynamic_table_arena.h"
#include "cc/lib/dynamic_table_key.h"
#include "cc/lib/tests/dynamic_table_test_util.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace dynamic_test {
namespace {

// --- dynamic_table_key.h -----------------------------------------------------------------------------------

TEST(DynamicTableKeyTest, MixKeyIsMurmurHash3Fmix64) {
  EXPECT_EQ(MixKey(1), 0xb456bcfc34c2cb2cULL);
  EXPECT_EQ(MixKey(0), 0u);  // fmix64 fixes 0; the index is still correct for key 0 (tested below)
}

// --- dynamic_table_arena.h and dynamic_table_index.h -------------------------------------------------------

TEST(ChunkedArenaTest, GrowthNeverMovesARow) {
  ChunkedArena<float> arena(3, 2);  // 4 rows per chunk
  ASSERT_TRUE(arena.Reserve(1));
  EXPECT_EQ(arena.capacity(), 4);
  float* first = arena.At(0);
  std::fill_n(first, 3, 1.5f);
  ASSERT_TRUE(arena.Reserve(1000));
  EXPECT_EQ(arena.capacity(), 1000);
  EXPECT_EQ(arena.At(0), first);
  EXPECT_EQ(first[2], 1.5f);
  // Rows inside one chunk are contiguous; rows of different chunks need not be.
  EXPECT_EQ(arena.At(3), first + 9);
  EXPECT_TRUE(arena.Reserve(10));  // never shrinks
  EXPECT_EQ(arena.capacity(), 1000);
}

TEST(ChunkedArenaTest, PastTheSlabThresholdChunksComeFromHugePageSlabs) {
  // 1 KiB rows, 16 rows (16 KiB) a chunk: growing one chunk at a time, the arena allocates exactly what it needs
  // up to kSlabsFrom bytes, then a slab of at least 2 MiB (128 chunks) whose spare chunks later growth uses.
  constexpr int64_t kWidth = 256, kRows = 16, kChunkBytes = kWidth * kRows * 4;
  ChunkedArena<float> arena(kWidth, 4);
  const auto slab_bytes = [&] { return arena.MemoryBytes() - static_cast<int64_t>(arena.capacity() / kRows * 8); };
  std::vector<float*> rows;
  int64_t grown = 0;
  while (slab_bytes() < ChunkedArena<float>::kSlabsFrom) {
    ASSERT_TRUE(arena.Reserve(arena.capacity() + 1));
    ASSERT_LE(slab_bytes(), arena.capacity() / kRows * kChunkBytes + 64);  // (directory rounding only)
    rows.push_back(arena.At(arena.capacity() - 1));
    *rows.back() = static_cast<float>(grown++);
  }
  const int64_t before = arena.MemoryBytes();
  ASSERT_TRUE(arena.Reserve(arena.capacity() + 1));
  const int64_t slab = arena.MemoryBytes() - before;
  EXPECT_GE(slab, static_cast<int64_t>(kHugePageBytes));
  const int64_t spare = slab / kChunkBytes - 1;
  if (ProcessHugePagePolicy() != HugePagePolicy::kOff) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(arena.At(arena.capacity() - kRows)) % kHugePageBytes, 0u);
  }
  const int64_t after_slab = arena.MemoryBytes();
  for (int64_t c = 0; c < spare; ++c) {
    ASSERT_TRUE(arena.Reserve(arena.capacity() + 1));
    // Consecutive chunks of one slab are adjacent, and the directory's own growth is all that is allocated.
    EXPECT_EQ(arena.At(arena.capacity() - 1), arena.At(arena.capacity() - 1 - kRows) + kRows * kWidth);
    EXPECT_LE(arena.MemoryBytes() - after_slab, static_cast<int64_t>(arena.capacity() / kRows * 8));
  }
  ASSERT_TRUE(arena.Reserve(arena.capacity() + 10 * kRows));  // past the slab: another one
  EXPECT_GT(arena.MemoryBytes() - after_slab, static_cast<int64_t>(kHugePageBytes));
  // No row moved, and no two chunks overlap (each row's first float kept its own value).
  for (int64_t i = 0; i < static_cast<int64_t>(rows.size()); ++i) {
    EXPECT_EQ(arena.At((i + 1) * kRows - 1), rows[i]);
    EXPECT_EQ(*rows[i], static_cast<float>(i));
  }
}

TEST(ChunkedArenaTest, DirectRowsAreTheFirstSlabsAndEveryRowKeepsItsOwnAddress) {
  // Rows below direct_rows() are addressed from row 0, the others through the directory: both must give every
  // row its one address, whatever the slabs' placement.
  constexpr int64_t kWidth = 5, kRowsPerChunk = 8;
  ChunkedArena<float> arena(kWidth, 3);
  EXPECT_EQ(arena.direct_rows(), 0);
  ASSERT_TRUE(arena.Reserve(6 * kRowsPerChunk));  // one allocation: all of it direct
  EXPECT_EQ(arena.direct_rows(), arena.capacity());
  for (int64_t r = 0; r < arena.capacity(); ++r) ASSERT_EQ(arena.At(r), arena.At(0) + r * kWidth);
  std::vector<char> in_between(1 << 16);  // (makes the next allocation unlikely to follow the first)
  ASSERT_TRUE(arena.Reserve(20 * kRowsPerChunk));
  ASSERT_TRUE(arena.Reserve(33 * kRowsPerChunk + 1));
  EXPECT_GE(arena.direct_rows(), 6 * kRowsPerChunk);
  EXPECT_LE(arena.direct_rows(), arena.capacity());
  EXPECT_EQ(arena.direct_rows() % kRowsPerChunk, 0);
  for (int64_t r = 0; r < arena.capacity(); ++r) {
    // Within a chunk rows are adjacent, whichever way the row is reached.
    ASSERT_EQ(arena.At(r), arena.At(r - r % kRowsPerChunk) + (r % kRowsPerChunk) * kWidth) << "row " << r;
    std::fill_n(arena.At(r), kWidth, static_cast<float>(r));
  }
  for (int64_t r = 0; r < arena.capacity(); ++r) {
    ASSERT_EQ(arena.At(r)[0], static_cast<float>(r)) << "row " << r;  // no two rows share memory
    ASSERT_EQ(arena.At(r)[kWidth - 1], static_cast<float>(r)) << "row " << r;
  }
  const ChunkedArena<float>& read_only = arena;
  EXPECT_EQ(read_only.At(arena.capacity() - 1), arena.At(arena.capacity() - 1));
}

TEST(KeyIndexTest, MatchesAMapUnderRandomInsertsAndErases) {
  // Backward-shift deletion must keep every remaining key reachable; a std::map is the reference.
  std::vector<int64_t> key_of_row;
  std::map<int64_t, int64_t> reference;
  std::vector<int64_t> free_rows;
  KeyIndex index;
  auto key_of = [&](int64_t row) { return key_of_row[row]; };
  ASSERT_TRUE(index.Rehash(1, key_of));
  std::mt19937_64 rng(5);
  for (int op = 0; op < 20000; ++op) {
    // Small key range (collisions, re-inserts) including negative keys, 0 and the extremes.
    int64_t key = static_cast<int64_t>(rng() % 300) - 150;
    if (op % 97 == 0) key = std::numeric_limits<int64_t>::min();
    if (op % 89 == 0) key = std::numeric_limits<int64_t>::max();
    const bool erase = rng() % 3 == 0;
    auto it = reference.find(key);
    ASSERT_EQ(index.Find(key, key_of), it == reference.end() ? KeyIndex::kNotFound : it->second);
    if (erase && it != reference.end()) {
      index.Erase(key, key_of);
      free_rows.push_back(it->second);
      reference.erase(it);
    } else if (!erase && it == reference.end()) {
      if (!index.Fits(static_cast<int64_t>(reference.size()) + 1)) {
        ASSERT_TRUE(index.Rehash(static_cast<int64_t>(reference.size()) + 1, key_of));
      }
      int64_t row;
      if (!free_rows.empty()) {
        row = free_rows.back();
        free_rows.pop_back();
        key_of_row[row] = key;
      } else {
        row = static_cast<int64_t>(key_of_row.size());
        key_of_row.push_back(key);
      }
      index.Insert(key, row);
      reference[key] = row;
    }
  }
  for (int64_t k = -160; k < 160; ++k) {
    auto it = reference.find(k);
    EXPECT_EQ(index.Find(k, key_of), it == reference.end() ? KeyIndex::kNotFound : it->second) << k;
  }
  int64_t indexed = 0;
  index.ForEachRow([&](int64_t) { ++indexed; });
  EXPECT_EQ(indexed, static_cast<int64_t>(reference.size()));
}

TEST(KeyIndexTest, FindBatchMatchesFindForEveryBatchLengthAndPattern) {
  // FindBatch pipelines the probes (home buckets a distance ahead, a ring of homes): every batch length around
  // that distance and the ring size, duplicates, absent keys and long probe runs (a small key range after churn)
  // must give exactly Find's rows.
  std::vector<int64_t> key_of_row;
  KeyIndex index;
  auto key_of = [&](int64_t row) { return key_of_row[row]; };
  std::vector<int64_t> rows(8, -2);
  const std::vector<int64_t> some = {1, 2, 3};
  index.FindBatch(some.data(), 3, key_of, rows.data());  // no buckets yet
  EXPECT_EQ(std::vector<int64_t>(rows.begin(), rows.begin() + 3), std::vector<int64_t>(3, KeyIndex::kNotFound));
  EXPECT_EQ(rows[3], -2);
  ASSERT_TRUE(index.Rehash(200, key_of));
  std::mt19937_64 rng(11);
  for (int64_t k = 0; k < 150; ++k) {
    key_of_row.push_back(static_cast<int64_t>(rng()));
    index.Insert(key_of_row.back(), k);
  }
  for (int64_t r = 0; r < 150; r += 3) index.Erase(key_of_row[r], key_of);  // churn: backward shifts
  for (int64_t n = 0; n <= 70; ++n) {
    std::vector<int64_t> keys(n);
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t pick = rng() % 4;
      keys[i] = pick == 0   ? static_cast<int64_t>(rng())             // absent
                : pick == 1 ? key_of_row[7]                           // a hot duplicate
                            : key_of_row[rng() % key_of_row.size()];  // present or erased
    }
    std::vector<int64_t> got(n + 1, -2);
    index.FindBatch(keys.data(), n, key_of, got.data());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], index.Find(keys[i], key_of)) << "n " << n << " i " << i;
    EXPECT_EQ(got[n], -2) << "wrote past the batch, n " << n;
  }
}

TEST(KeyIndexTest, LoadFactorStaysAtMostThreeQuarters) {
  EXPECT_EQ(KeyIndex::BucketsFor(0), 16);
  EXPECT_EQ(KeyIndex::BucketsFor(12), 16);
  EXPECT_EQ(KeyIndex::BucketsFor(13), 32);
  EXPECT_EQ(KeyIndex::BucketsFor(786432), 1 << 20);
  EXPECT_EQ(KeyIndex::BucketsFor(786433), 1 << 21);
}

}  // namespace
}  // namespace dynamic_test
}  // namespace tf_embed_ops
