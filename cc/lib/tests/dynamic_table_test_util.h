// Helpers of the dynamic-table tests (dynamic_table_*_test.cc): a small table's options, a table made from them,
// a training lookup, the rows of keys, and the checks "the call was refused, naming ..." and "nothing changed".
#ifndef TF_EMBED_OPS_CC_LIB_TESTS_DYNAMIC_TABLE_TEST_UTIL_H_
#define TF_EMBED_OPS_CC_LIB_TESTS_DYNAMIC_TABLE_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cc/lib/dynamic_table.h"
#include "cc/lib/dynamic_table_init.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace dynamic_test {

inline constexpr int64_t kNo = DynamicTable::kNotAdmitted;

inline DynamicTableOptions Options(int64_t dim = 4, int64_t initial_capacity = 8, int64_t max_rows = 1000) {
  DynamicTableOptions o;
  o.name = "items";
  o.dim = dim;
  o.initial_capacity = initial_capacity;
  o.max_rows = max_rows;
  o.rows_per_chunk = 4;
  o.initializer.kind = RowInitializerKind::kUniform;
  o.initializer.minval = -1.0f;
  o.initializer.maxval = 1.0f;
  o.initializer.seed = 7;
  return o;
}

inline std::unique_ptr<DynamicTable> Make(const DynamicTableOptions& o) {
  absl::StatusOr<std::unique_ptr<DynamicTable>> t = DynamicTable::Create(o);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

inline std::vector<int64_t> Insert(DynamicTable* t, const std::vector<int64_t>& keys, int64_t step = 0,
                                   BatchStats* stats = nullptr) {
  std::vector<int64_t> rows(keys.size(), -2);
  const absl::Status s = t->FindOrInsert(keys.data(), static_cast<int64_t>(keys.size()), step, rows.data(), stats);
  EXPECT_TRUE(s.ok()) << s;
  return rows;
}

inline std::vector<int64_t> FindRows(const DynamicTable& t, const std::vector<int64_t>& keys) {
  std::vector<int64_t> rows(keys.size(), -2);
  t.Find(keys.data(), static_cast<int64_t>(keys.size()), rows.data());
  return rows;
}

inline std::vector<float> RowOf(const DynamicTable& t, int64_t row) {
  return std::vector<float>(t.Weights(row), t.Weights(row) + t.dim());
}

inline std::vector<float> InitialRow(const RowInitializer& init, int64_t key, int64_t dim) {
  std::vector<float> row(dim);
  init.FillRow(key, row.data(), dim);
  return row;
}

// Everything observable about a table's content, for "nothing changed" checks.
inline void ExpectSameContents(const DynamicTableContents& a, const DynamicTableContents& b) {
  EXPECT_EQ(a.dim, b.dim);
  EXPECT_EQ(a.keys, b.keys);
  EXPECT_EQ(a.weights, b.weights);
  EXPECT_EQ(a.slots, b.slots);
  EXPECT_EQ(a.counts, b.counts);
  EXPECT_EQ(a.last_steps, b.last_steps);
  EXPECT_EQ(a.pending_keys, b.pending_keys);
  EXPECT_EQ(a.pending_counts, b.pending_counts);
  EXPECT_EQ(a.pending_last_steps, b.pending_last_steps);
}

inline void ExpectInvalid(const absl::Status& s, const std::vector<std::string>& parts) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  for (const std::string& p : parts) EXPECT_NE(s.message().find(p), std::string::npos) << s << " lacks " << p;
}

}  // namespace dynamic_test
}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_TESTS_DYNAMIC_TABLE_TEST_UTIL_H_
