// The eviction policies of dynamic tables (docs/dynamic_tables_internals.md): LRU, LFU and TTL with their tie
// rules, explicit eviction, rows reused after eviction, saturating counts, and a reference model under churn.
#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "cc/lib/dynamic_table.h"
#include "cc/lib/tests/dynamic_table_test_util.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace dynamic_test {
namespace {

// --- Eviction ----------------------------------------------------------------------------------------------

TEST(DynamicTableTest, LruEvictsTheLeastRecentlySeenWithTiesBySmallerKey) {
  DynamicTableOptions o = Options();
  o.eviction = {EvictionPolicy::kLru, 3, 0};
  auto t = Make(o);
  Insert(t.get(), {50, 40}, 1);
  Insert(t.get(), {30, 20}, 2);
  Insert(t.get(), {10, 40}, 3);
  // last steps: 50:1  40:3  30:2  20:2  10:3.  Keep 3: evict 50 (step 1), then 20 (step 2, smaller than 30).
  absl::StatusOr<int64_t> evicted = t->EndStep(3);
  ASSERT_TRUE(evicted.ok());
  EXPECT_EQ(*evicted, 2);
  EXPECT_EQ(t->Export().keys, (std::vector<int64_t>{10, 30, 40}));
  EXPECT_EQ(t->counters().evictions, 2);
  EXPECT_EQ(*t->EndStep(4), 0);  // already at the target
}

TEST(DynamicTableTest, LfuEvictsTheLeastFrequentWithTiesByOlderStepThenKey) {
  DynamicTableOptions o = Options();
  o.eviction = {EvictionPolicy::kLfu, 2, 0};
  auto t = Make(o);
  Insert(t.get(), {1, 1, 1, 2, 3, 4}, 5);  // counts 1:3 2:1 3:1 4:1, all at step 5
  Insert(t.get(), {2}, 6);                 // 2:2 at step 6
  Insert(t.get(), {4}, 4);                 // 4:2, last step stays 5
  // Keep 2: 3 (count 1) goes, then between 2 (count 2, step 6) and 4 (count 2, step 5) the older 4 goes.
  EXPECT_EQ(*t->EndStep(6), 2);
  EXPECT_EQ(t->Export().keys, (std::vector<int64_t>{1, 2}));
  // Full ties: same count and step, smaller key first.
  auto u = Make(o);
  Insert(u.get(), {9, -9, 0, 7}, 1);
  EXPECT_EQ(*u->EndStep(1), 2);
  EXPECT_EQ(u->Export().keys, (std::vector<int64_t>{7, 9}));
}

TEST(DynamicTableTest, TtlEvictsRowsUnseenForMoreThanTtlSteps) {
  DynamicTableOptions o = Options();
  o.eviction = {EvictionPolicy::kTtl, 0, 2};
  auto t = Make(o);
  Insert(t.get(), {1}, 0);
  Insert(t.get(), {2}, 1);
  Insert(t.get(), {3}, 2);
  EXPECT_EQ(*t->EndStep(2), 0);  // ages 2, 1, 0
  EXPECT_EQ(*t->EndStep(3), 1);  // key 1 is 3 steps old
  EXPECT_EQ(t->Export().keys, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(*t->EndStep(5), 2);
  EXPECT_EQ(t->size(), 0);
}

TEST(DynamicTableTest, ExplicitEvictionAndNoPolicy) {
  auto t = Make(Options());
  Insert(t.get(), {1, 2, 3, 4}, 0);
  EXPECT_EQ(*t->EndStep(100), 0);  // no policy: nothing goes
  EXPECT_EQ(*t->Evict({EvictionPolicy::kLru, 3, 0}, 100), 1);
  EXPECT_EQ(t->Export().keys, (std::vector<int64_t>{2, 3, 4}));
  const std::vector<int64_t> evict = {3, 3, 99, 2};  // duplicates once, absent keys ignored
  EXPECT_EQ(t->EvictKeys(evict.data(), 4), 2);
  EXPECT_EQ(t->Export().keys, (std::vector<int64_t>{4}));
  EXPECT_EQ(t->counters().evictions, 3);
  EXPECT_EQ(t->EvictKeys(nullptr, 0), 0);
}

TEST(DynamicTableTest, AnEvictedKeyComesBackAsANewRowAndRowsAreReused) {
  DynamicTableOptions o = Options();
  o.slot_initial_values = {0.5f};
  auto t = Make(o);
  const std::vector<int64_t> rows = Insert(t.get(), {1, 2, 3, 4, 5, 6, 7, 8});
  const int64_t capacity = t->capacity();
  std::fill_n(t->Weights(rows[1]), 4, 9.0f);  // "trained"
  std::fill_n(t->Slot(0, rows[1]), 4, 9.0f);
  ASSERT_EQ(t->EvictKeys(std::vector<int64_t>{2}.data(), 1), 1);
  EXPECT_EQ(FindRows(*t, {2})[0], kNo);
  const int64_t row = Insert(t.get(), {2}, 7)[0];
  EXPECT_EQ(row, rows[1]);  // the freed row is reused
  EXPECT_EQ(t->capacity(), capacity);
  EXPECT_EQ(RowOf(*t, row), InitialRow(o.initializer, 2, 4));
  EXPECT_EQ(std::vector<float>(t->Slot(0, row), t->Slot(0, row) + 4), std::vector<float>(4, 0.5f));
  EXPECT_EQ(t->CountOf(row), 1);
  EXPECT_EQ(t->LastStepOf(row), 7);
}

TEST(DynamicTableTest, CountsSaturateInsteadOfWrapping) {
  auto t = Make(Options(1, 1, 10));
  DynamicTableContents c{1, {6}, {0.5f}, {}, {}, {DynamicTable::kMaxCount - 1}, {2}, {}, {}, {}};
  ASSERT_TRUE(t->Import(c).ok());
  const std::vector<int64_t> rows = Insert(t.get(), {6, 6, 6}, 3);
  EXPECT_EQ(t->CountOf(rows[0]), DynamicTable::kMaxCount);
  c.counts[0] = DynamicTable::kMaxCount + 1;
  ExpectInvalid(t->Import(c), {"count 4294967296"});
}

TEST(DynamicTableTest, MatchesAReferenceModelUnderChurn) {
  // Random batches, explicit evictions and LRU at step boundaries against a std::map of key -> (count, step):
  // every live key is found with its initial row (no training here), its count and its last step.
  DynamicTableOptions o = Options(2, 2, 64);
  o.eviction = {EvictionPolicy::kLru, 48, 0};
  auto t = Make(o);
  struct Meta {
    int64_t count, step;
  };
  std::map<int64_t, Meta> model;
  std::mt19937_64 rng(99);
  for (int64_t step = 0; step < 300; ++step) {
    std::vector<int64_t> batch(rng() % 20);
    for (int64_t& k : batch) k = static_cast<int64_t>(rng() % 200) - 100;
    BatchStats stats;
    const std::vector<int64_t> rows = Insert(t.get(), batch, step, &stats);
    // New keys in first-occurrence order take the free rows; the rest are refused.
    int64_t refused = 0;
    std::set<int64_t> seen_new, admitted;
    for (const int64_t k : batch) {
      if (model.count(k) != 0 || !seen_new.insert(k).second) continue;
      if (static_cast<int64_t>(model.size() + admitted.size()) < 64) {
        admitted.insert(k);
      } else {
        ++refused;
      }
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      const bool has_row = model.count(batch[i]) != 0 || admitted.count(batch[i]) != 0;
      ASSERT_EQ(rows[i] != kNo, has_row) << "step " << step << " key " << batch[i];
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      if (rows[i] == kNo) continue;
      Meta& m = model.try_emplace(batch[i], Meta{0, 0}).first->second;
      m.count += 1;
      m.step = step;
    }
    EXPECT_EQ(stats.refused_full, refused);
    if (step % 7 == 3) {
      const int64_t k = static_cast<int64_t>(rng() % 200) - 100;
      EXPECT_EQ(t->EvictKeys(&k, 1), static_cast<int64_t>(model.erase(k)));
    }
    ASSERT_TRUE(t->EndStep(step).ok());
    while (model.size() > 48) {
      auto victim = std::min_element(model.begin(), model.end(), [](const auto& x, const auto& y) {
        return std::make_pair(x.second.step, x.first) < std::make_pair(y.second.step, y.first);
      });
      model.erase(victim);
    }
    ASSERT_EQ(t->size(), static_cast<int64_t>(model.size())) << "step " << step;
  }
  const DynamicTableContents c = t->Export();
  ASSERT_EQ(c.keys.size(), model.size());
  size_t i = 0;
  for (const auto& [key, m] : model) {
    EXPECT_EQ(c.keys[i], key);
    EXPECT_EQ(c.counts[i], m.count);
    EXPECT_EQ(c.last_steps[i], m.step);
    EXPECT_EQ(std::vector<float>(c.weights.begin() + 2 * i, c.weights.begin() + 2 * i + 2),
              InitialRow(o.initializer, key, 2));
    ++i;
  }
  EXPECT_LE(t->capacity(), 64);  // freed rows were reused; the table never grew past max_rows
  // The run went through every path: refusals for space, explicit and LRU evictions.
  EXPECT_GT(t->counters().refused_full, 0);
  EXPECT_GT(t->counters().evictions, 100);
}

}  // namespace
}  // namespace dynamic_test
}  // namespace tf_embed_ops
