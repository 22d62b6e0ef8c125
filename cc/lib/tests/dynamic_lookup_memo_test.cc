// The memo that lets a dynamic table's fused update take the rows its step's training lookup found
// (dynamic_lookup_memo.h), and the table's mapping version that guards it: the memo must give exactly Find's
// rows whenever it answers, and must refuse after anything that changes which key has which row.
#include "cc/lib/dynamic_lookup_memo.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "cc/lib/dynamic_table.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace {

std::unique_ptr<DynamicTable> MakeTable() {
  DynamicTableOptions o;
  o.name = "items";
  o.dim = 4;
  o.initial_capacity = 8;
  o.max_rows = 1000;
  o.rows_per_chunk = 4;
  o.initializer.kind = RowInitializerKind::kUniform;
  o.initializer.minval = -1.0f;
  o.initializer.maxval = 1.0f;
  o.initializer.seed = 7;
  absl::StatusOr<std::unique_ptr<DynamicTable>> t = DynamicTable::Create(o);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

// Looks `keys` up for training at `step` and remembers the result, as the training lookup kernel does.
std::vector<int64_t> TrainingLookup(DynamicTable* t, LookupMemo* memo, const std::vector<int64_t>& keys, int64_t step) {
  std::vector<int64_t> rows(keys.size());
  const absl::Status s = t->FindOrInsert(keys.data(), static_cast<int64_t>(keys.size()), step, rows.data());
  EXPECT_TRUE(s.ok()) << s;
  memo->Remember(keys.data(), rows.data(), static_cast<int64_t>(keys.size()), t->mapping_version());
  return rows;
}

// Recalls `keys` split into two segments at `split`; empty when the memo refuses.
std::vector<int64_t> Recall(const LookupMemo& memo, const DynamicTable& t, const std::vector<int64_t>& keys,
                            size_t split) {
  std::vector<int64_t> rows(keys.size(), -7);
  std::vector<LookupMemo::Segment> segments = {
      {keys.data(), static_cast<int64_t>(split), rows.data()},
      {keys.data() + split, static_cast<int64_t>(keys.size() - split), rows.data() + split}};
  if (!memo.Recall(segments, t.mapping_version())) {
    for (int64_t r : rows) EXPECT_EQ(r, -7) << "a refused recall must write nothing";
    return {};
  }
  return rows;
}

std::vector<int64_t> FindRows(const DynamicTable& t, const std::vector<int64_t>& keys) {
  std::vector<int64_t> rows(keys.size());
  t.Find(keys.data(), static_cast<int64_t>(keys.size()), rows.data());
  return rows;
}

TEST(LookupMemoTest, GivesTheLookupsRowsForTheSameKeysInAnySegmentation) {
  std::unique_ptr<DynamicTable> t = MakeTable();
  LookupMemo memo;
  const std::vector<int64_t> keys = {5, 9, 5, 11, 42, 9};
  const std::vector<int64_t> rows = TrainingLookup(t.get(), &memo, keys, 0);
  for (size_t split = 0; split <= keys.size(); ++split) {
    EXPECT_EQ(Recall(memo, *t, keys, split), rows) << "split " << split;
    EXPECT_EQ(Recall(memo, *t, keys, split), FindRows(*t, keys));
  }
}

TEST(LookupMemoTest, RefusesOtherKeysOrderOrLength) {
  std::unique_ptr<DynamicTable> t = MakeTable();
  LookupMemo memo;
  TrainingLookup(t.get(), &memo, {5, 9, 11}, 0);
  EXPECT_TRUE(Recall(memo, *t, {5, 11, 9}, 1).empty());
  EXPECT_TRUE(Recall(memo, *t, {5, 9}, 1).empty());
  EXPECT_TRUE(Recall(memo, *t, {5, 9, 11, 11}, 2).empty());
  EXPECT_TRUE(Recall(memo, *t, {5, 9, 12}, 3).empty());
  EXPECT_FALSE(Recall(memo, *t, {5, 9, 11}, 3).empty());
}

TEST(LookupMemoTest, RefusesAfterAnyChangeOfTheKeyToRowMapping) {
  LookupMemo memo;
  const std::vector<int64_t> keys = {5, 9, 11};
  {  // another training lookup that inserts a key
    std::unique_ptr<DynamicTable> t = MakeTable();
    TrainingLookup(t.get(), &memo, keys, 0);
    std::vector<int64_t> other = {77}, rows(1);
    ASSERT_TRUE(t->FindOrInsert(other.data(), 1, 0, rows.data()).ok());
    EXPECT_TRUE(Recall(memo, *t, keys, 1).empty());
  }
  {  // an eviction, then a re-insert that could reuse the freed row for another key
    std::unique_ptr<DynamicTable> t = MakeTable();
    TrainingLookup(t.get(), &memo, keys, 0);
    const int64_t evict = 9;
    EXPECT_EQ(t->EvictKeys(&evict, 1), 1);
    EXPECT_TRUE(Recall(memo, *t, keys, 1).empty());
  }
  {  // an import (a restore), even of the same content, and an import of nothing
    std::unique_ptr<DynamicTable> t = MakeTable();
    TrainingLookup(t.get(), &memo, keys, 0);
    ASSERT_TRUE(t->Import(t->Export()).ok());
    EXPECT_TRUE(Recall(memo, *t, keys, 1).empty());
    TrainingLookup(t.get(), &memo, keys, 1);
    DynamicTableContents nothing;
    nothing.dim = t->dim();
    ASSERT_TRUE(t->Import(nothing).ok());
    EXPECT_TRUE(Recall(memo, *t, keys, 1).empty());
  }
  {  // a lookup that finds only known keys changes counts, not the mapping: the memo still answers
    std::unique_ptr<DynamicTable> t = MakeTable();
    const std::vector<int64_t> rows = TrainingLookup(t.get(), &memo, keys, 0);
    std::vector<int64_t> again = {11, 5}, found(2);
    ASSERT_TRUE(t->FindOrInsert(again.data(), 2, 1, found.data()).ok());
    EXPECT_EQ(Recall(memo, *t, keys, 2), rows);
  }
}

TEST(LookupMemoTest, ForgetAndEmptyBatches) {
  std::unique_ptr<DynamicTable> t = MakeTable();
  LookupMemo memo;
  const std::vector<LookupMemo::Segment> none;
  EXPECT_FALSE(memo.Recall(none, t->mapping_version()));  // nothing remembered yet: refuses even an empty batch
  TrainingLookup(t.get(), &memo, {}, 0);
  EXPECT_TRUE(memo.Recall(none, t->mapping_version()));
  TrainingLookup(t.get(), &memo, {3}, 0);
  memo.Forget();
  EXPECT_FALSE(memo.valid());
  EXPECT_TRUE(Recall(memo, *t, {3}, 1).empty());
}

}  // namespace
}  // namespace tf_embed_ops
