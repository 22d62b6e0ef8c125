// SortDistinctRows and FindDistinctRows (cc/lib/distinct_rows.h) against sort + unique (and each id's position by
// binary search), on both of their paths (sort, bitmap).
#include "cc/lib/distinct_rows.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace {

std::vector<int64_t> Reference(std::vector<int64_t> rows) {
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

TEST(SortDistinctRowsTest, MatchesSortAndUniqueOnBothPaths) {
  std::mt19937_64 rng(3);
  // (ids, rows of the table): few ids over many rows (sorted), many ids over few rows (bitmap), and the edges.
  for (const auto& [n, num_rows] : std::vector<std::pair<int64_t, int64_t>>{{0, 10},
                                                                            {1, 1},
                                                                            {5, 1000},
                                                                            {127, 64},
                                                                            {128, 1},
                                                                            {128, 8192},
                                                                            {128, 8193},
                                                                            {1000, 1},
                                                                            {1000, 63},
                                                                            {1000, 64000},
                                                                            {1000, 64001},
                                                                            {1000, 1024000},
                                                                            {1000, 1025024},
                                                                            {16384, 1000000},
                                                                            {5000, 1 << 30}}) {
    std::vector<int64_t> rows(n);
    std::uniform_int_distribution<int64_t> any(0, num_rows - 1);
    for (int64_t& r : rows) r = any(rng) % (rng() % 3 == 0 ? 7 : num_rows);  // repeats, and a hot few
    if (n >= 2) {
      rows[0] = 0;
      rows[n - 1] = num_rows - 1;  // the first and the last row of the table
    }
    const std::vector<int64_t> want = Reference(rows);
    const DistinctBatch batch = FindDistinctRows(rows, num_rows);
    EXPECT_EQ(batch.rows, want) << n << " ids over " << num_rows << " rows";
    ASSERT_EQ(batch.positions.size(), rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      ASSERT_EQ(batch.positions[i], std::lower_bound(want.begin(), want.end(), rows[i]) - want.begin())
          << "id " << i << " of " << n << " ids over " << num_rows << " rows";
    }
    SortDistinctRows(&rows, num_rows);
    EXPECT_EQ(rows, want) << n << " ids over " << num_rows << " rows";
  }
}

TEST(SortDistinctRowsTest, AllRepeatsOfOneRow) {
  std::vector<int64_t> rows(4096, 77);
  const DistinctBatch batch = FindDistinctRows(rows, 100);
  EXPECT_EQ(batch.rows, std::vector<int64_t>{77});
  EXPECT_EQ(batch.positions, std::vector<int64_t>(4096, 0));
  SortDistinctRows(&rows, 100);
  EXPECT_EQ(rows, std::vector<int64_t>{77});
}

}  // namespace
}  // namespace tf_embed_ops
