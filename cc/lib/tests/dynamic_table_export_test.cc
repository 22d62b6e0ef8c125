// Export and import of a dynamic table (docs/dynamic_tables_internals.md): the export is sorted by key, an import
// restores into any capacity, and a rejected import changes nothing.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cc/lib/dynamic_table.h"
#include "cc/lib/tests/dynamic_table_test_util.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace dynamic_test {
namespace {

// --- Export / Import ---------------------------------------------------------------------------------------

TEST(DynamicTableTest, ExportIsSortedByKeyAndImportRestoresIntoAnyCapacity) {
  DynamicTableOptions o = Options(3, 64, 1000);
  o.slot_initial_values = {0.1f, 0.0f};
  o.admission = {2, 50, 0};
  auto t = Make(o);
  Insert(t.get(), {30, -5, 30, -5, 0, 0, 12, 12, 99}, 4);
  Insert(t.get(), {12, 0}, 6);
  const std::vector<int64_t> r = FindRows(*t, {12});
  std::fill_n(t->Slot(1, r[0]), 3, 2.5f);
  const DynamicTableContents c = t->Export();
  EXPECT_EQ(c.keys, (std::vector<int64_t>{-5, 0, 12, 30}));
  EXPECT_EQ(c.counts, (std::vector<int64_t>{2, 3, 3, 2}));
  EXPECT_EQ(c.last_steps, (std::vector<int64_t>{4, 6, 6, 4}));
  EXPECT_EQ(c.pending_keys, (std::vector<int64_t>{99}));
  EXPECT_EQ(c.pending_counts, (std::vector<int64_t>{1}));
  for (size_t i = 0; i < c.keys.size(); ++i) {
    EXPECT_EQ(std::vector<float>(c.weights.begin() + 3 * i, c.weights.begin() + 3 * i + 3),
              InitialRow(o.initializer, c.keys[i], 3));
  }
  EXPECT_EQ(c.slots[1][6], 2.5f);  // key 12's row
  // Into a table with a smaller initial capacity (it grows), holding other rows (they are replaced).
  DynamicTableOptions small = o;
  small.initial_capacity = 1;
  small.rows_per_chunk = 1;
  auto u = Make(small);
  Insert(u.get(), {77, 77});
  ASSERT_TRUE(u->Import(c).ok());
  ExpectSameContents(c, u->Export());
  EXPECT_EQ(u->size(), 4);
  // Past its capacity, the import took arenas of its own size: every row in one array, as if created with it.
  EXPECT_TRUE(u->DenseFloat32Rows());
  EXPECT_EQ(u->capacity(), 4);
  EXPECT_EQ(FindRows(*u, {77})[0], kNo);
  // The pending count survived: one more sighting of 99 admits it.
  EXPECT_GE(Insert(u.get(), {99}, 7)[0], 0);
}

TEST(DynamicTableTest, ImportRejectsMismatchesAndChangesNothing) {
  DynamicTableOptions o = Options(3, 2, 3);
  o.slot_initial_values = {0.1f};
  auto t = Make(o);
  Insert(t.get(), {1, 2}, 1);
  const DynamicTableContents before = t->Export();
  DynamicTableContents good = before;
  auto expect_rejected = [&](const DynamicTableContents& c, const std::vector<std::string>& message) {
    ExpectInvalid(t->Import(c), message);
    ExpectSameContents(before, t->Export());
    EXPECT_EQ(t->counters().inserts, 2);
  };
  DynamicTableContents c = good;
  c.dim = 4;
  expect_rejected(c, {"'items'", "dim 4", "dim 3"});
  c = good;
  c.slots.clear();
  expect_rejected(c, {"0 slots"});
  c = good;
  c.weights.pop_back();
  expect_rejected(c, {"weights", "5 values", "expected 6"});
  c = good;
  c.slots[0].push_back(1.0f);
  expect_rejected(c, {"slot", "7 values"});
  c = good;
  c.counts.push_back(1);
  expect_rejected(c, {"counts", "3 values"});
  c = good;
  c.keys[1] = c.keys[0];
  expect_rejected(c, {"key 1 appears more than once"});
  c = good;
  c.counts[0] = -1;
  expect_rejected(c, {"count -1"});
  c = good;
  c.last_steps[1] = -3;
  expect_rejected(c, {"last step -3"});
  c = good;
  c.pending_keys = {1};
  c.pending_counts = {1};
  c.pending_last_steps = {0};
  expect_rejected(c, {"key 1 is both a row and a pending key"});
  c = good;
  c.pending_keys = {5};
  c.pending_counts = {};
  expect_rejected(c, {"pending_counts"});
  // More rows than max_rows = 3.
  c = good;
  for (int64_t k : {7, 8}) {
    c.keys.push_back(k);
    c.counts.push_back(1);
    c.last_steps.push_back(0);
    c.weights.insert(c.weights.end(), 3, 0.0f);
    c.slots[0].insert(c.slots[0].end(), 3, 0.0f);
  }
  expect_rejected(c, {"4 rows do not fit max_rows = 3"});
  // An empty checkpoint is fine and empties the table.
  ASSERT_TRUE(t->Import(DynamicTableContents{3, {}, {}, {3}, {{}}, {}, {}, {}, {}, {}}).ok());
  EXPECT_EQ(t->size(), 0);
  EXPECT_EQ(FindRows(*t, {1})[0], kNo);
}

}  // namespace
}  // namespace dynamic_test
}  // namespace tf_embed_ops
