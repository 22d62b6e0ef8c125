// The feature lifecycle of dynamic tables (docs/dynamic_lifecycle.md): the eviction log and its cursors,
// counting Bloom filter admission, and the scored eviction policies (L2 norm, count and age, decayed LFU, a user
// score), each against a brute-force reference written from the documented rule.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cc/lib/bloom_admission.h"
#include "cc/lib/dynamic_table.h"
#include "cc/lib/eviction_log.h"
#include "cc/lib/tests/dynamic_table_test_util.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace {

using dynamic_test::ExpectInvalid;
using dynamic_test::Insert;
using dynamic_test::Make;

// These tables have dim 3.
DynamicTableOptions Options(int64_t max_rows = 1000) {
  return dynamic_test::Options(/*dim=*/3, /*initial_capacity=*/8, max_rows);
}

std::set<int64_t> Keys(const DynamicTable& t) {
  const DynamicTableContents c = t.Export();
  return std::set<int64_t>(c.keys.begin(), c.keys.end());
}

TEST(EvictionLog, CursorsAreIndependentAndBounded) {
  EvictionLog log(3);
  for (int64_t k = 0; k < 2; ++k) log.Append(10 + k, k, LogKind::kEvicted);
  std::vector<int64_t> keys, steps;
  EvictionLog::ReadResult a = log.Read(0, -1, &keys, &steps, nullptr);
  EXPECT_EQ(keys, (std::vector<int64_t>{10, 11}));
  EXPECT_EQ(a.next_cursor, 2);
  EXPECT_FALSE(a.resync);
  // A second reader still sees everything from 0; the first sees only new entries.
  for (int64_t k = 2; k < 5; ++k) log.Append(10 + k, k, LogKind::kErased);
  keys.clear();
  EvictionLog::ReadResult b = log.Read(a.next_cursor, -1, &keys, nullptr, nullptr);
  EXPECT_EQ(keys, (std::vector<int64_t>{12, 13, 14}));
  EXPECT_FALSE(b.resync);
  keys.clear();
  EvictionLog::ReadResult c = log.Read(0, -1, &keys, nullptr, nullptr);  // fell behind: 0 and 1 are gone
  EXPECT_TRUE(c.resync);
  EXPECT_EQ(c.dropped, 2);
  EXPECT_EQ(keys, (std::vector<int64_t>{12, 13, 14}));
  EXPECT_EQ(log.first_seq(), 2);
  EXPECT_EQ(log.next_seq(), 5);
  // max_entries pages through.
  keys.clear();
  EvictionLog::ReadResult d = log.Read(2, 2, &keys, nullptr, nullptr);
  EXPECT_EQ(keys, (std::vector<int64_t>{12, 13}));
  EXPECT_EQ(d.next_cursor, 4);
  // Restart makes even an up-to-date cursor stale.
  log.Restart();
  EvictionLog::ReadResult e = log.Read(5, -1, &keys, nullptr, nullptr);
  EXPECT_TRUE(e.resync);
  EXPECT_EQ(e.next_cursor, 6);
}

TEST(DynamicTableLog, EvictionsAndErasedKeysAreLoggedWithSteps) {
  DynamicTableOptions o = Options();
  o.eviction.policy = EvictionPolicy::kTtl;
  o.eviction.ttl_steps = 1;
  auto t = Make(o);
  Insert(t.get(), {5, 6, 7}, 0);
  Insert(t.get(), {6}, 1);
  ASSERT_EQ(*t->EndStep(2), 2);  // 5 and 7 are 2 steps old
  const int64_t evk[] = {6, 99};
  EXPECT_EQ(t->EvictKeys(evk, 2), 1);
  std::vector<int64_t> keys, steps;
  std::vector<LogKind> kinds;
  t->eviction_log().Read(0, -1, &keys, &steps, &kinds);
  std::map<int64_t, std::pair<int64_t, LogKind>> got;
  for (size_t i = 0; i < keys.size(); ++i) got[keys[i]] = {steps[i], kinds[i]};
  EXPECT_EQ(got.size(), 3u);
  EXPECT_EQ(got[5], std::make_pair(int64_t{2}, LogKind::kEvicted));
  EXPECT_EQ(got[7], std::make_pair(int64_t{2}, LogKind::kEvicted));
  EXPECT_EQ(got[6], std::make_pair(int64_t{2}, LogKind::kErased));
}

TEST(DynamicTableLog, RefusedAdmissionsOnlyWhenAsked) {
  for (const bool log_refused : {false, true}) {
    DynamicTableOptions o = Options();
    o.admission.min_count = 2;
    o.admission.max_pending_keys = 10;
    o.admission.log_refused = log_refused;
    auto t = Make(o);
    Insert(t.get(), {1, 2, 2, 3}, 4);  // 2 admitted, 1 and 3 refused
    std::vector<int64_t> keys, steps;
    std::vector<LogKind> kinds;
    t->eviction_log().Read(0, -1, &keys, &steps, &kinds);
    if (!log_refused) {
      EXPECT_TRUE(keys.empty());
    } else {
      EXPECT_EQ(keys, (std::vector<int64_t>{1, 3}));
      EXPECT_EQ(steps, (std::vector<int64_t>{4, 4}));
      EXPECT_EQ(kinds, (std::vector<LogKind>{LogKind::kRefused, LogKind::kRefused}));
    }
  }
}

TEST(DynamicTableLog, ImportRestartsTheLog) {
  auto t = Make(Options());
  Insert(t.get(), {1, 2}, 0);
  const int64_t k[] = {1};
  t->EvictKeys(k, 1);
  const int64_t cursor = t->eviction_log().next_seq();
  ASSERT_TRUE(t->Import(t->Export()).ok());
  const EvictionLog::ReadResult r = t->eviction_log().Read(cursor, -1, nullptr, nullptr, nullptr);
  EXPECT_TRUE(r.resync);
  EXPECT_EQ(r.dropped, 0);  // nothing was lost to overflow: the content was replaced
}

// ---------------------------------------------------------------------------------------------- Bloom admission

TEST(CountingBloomFilter, PackedCountersSaturate) {
  for (const int64_t bits : {4, 8, 16}) {
    CountingBloomFilter f;
    ASSERT_TRUE(f.Init(101, 3, bits));
    EXPECT_EQ(static_cast<int64_t>(f.bytes().size()), (101 * bits + 7) / 8);
    const int64_t max = (int64_t{1} << bits) - 1;
    for (int64_t p = 0; p < 101; ++p) f.Set(p, (p * 37) % (max + 1));
    for (int64_t p = 0; p < 101; ++p) EXPECT_EQ(f.Get(p), (p * 37) % (max + 1)) << bits << " " << p;
    f.Stage(42, max + 5);
    f.Commit();
    EXPECT_EQ(f.Estimate(42), max);
  }
}

// The brute-force reference: counters as plain int64 array, the same positions.
TEST(BloomAdmission, AdmitsExactlyWhenTheMinimumCounterReachesMinCount) {
  DynamicTableOptions o = Options();
  o.admission.min_count = 3;
  o.admission.bloom_num_counters = 64;  // small: collisions happen
  o.admission.bloom_num_hashes = 2;
  o.admission.bloom_counter_bits = 4;
  auto t = Make(o);
  CountingBloomFilter geometry;
  ASSERT_TRUE(geometry.Init(64, 2, 4));
  std::vector<int64_t> counters(64, 0);
  std::set<int64_t> admitted;
  std::mt19937_64 rng(3);
  for (int64_t step = 0; step < 40; ++step) {
    std::vector<int64_t> batch;
    for (int i = 0; i < 6; ++i) batch.push_back(static_cast<int64_t>(rng() % 40));
    // Reference: the whole batch's additions to the counters of keys without a row, then the decisions.
    std::map<int64_t, int64_t> misses;
    for (int64_t k : batch) {
      if (!admitted.count(k)) ++misses[k];
    }
    for (const auto& [k, n] : misses) geometry.ForEachPosition(k, [&](int64_t p) { counters[p] += n; });
    for (int64_t& c : counters) c = std::min<int64_t>(c, 15);
    for (const auto& [k, n] : misses) {
      int64_t est = 15;
      geometry.ForEachPosition(k, [&](int64_t p) { est = std::min(est, counters[p]); });
      if (est >= 3) admitted.insert(k);
    }
    Insert(t.get(), batch, step);
    ASSERT_EQ(Keys(*t), admitted) << "step " << step;
  }
  EXPECT_EQ(t->num_pending(), 0);  // no exact counters
}

TEST(BloomAdmission, MemoryDoesNotGrowWithDistinctKeys) {
  DynamicTableOptions o = Options(1 << 20);
  // 20000 one-off keys, 3 hashes over 2^18 counters: lambda = 3 * 20000 / 2^18 = 0.23 other sightings per counter;
  // a one-off key is admitted by mistake with probability P(Poisson(0.23) >= 2)^3 = 1e-5 (docs: the formula).
  o.admission.min_count = 3;
  o.admission.bloom_num_counters = 1 << 18;
  o.admission.bloom_num_hashes = 3;
  auto t = Make(o);
  Insert(t.get(), {1}, 0);
  const int64_t before = t->MemoryBytes();
  std::vector<int64_t> once(20000);
  for (size_t i = 0; i < once.size(); ++i) once[i] = 1000 + static_cast<int64_t>(i);
  std::vector<int64_t> rows(once.size());
  ASSERT_TRUE(t->FindOrInsert(once.data(), static_cast<int64_t>(once.size()), 1, rows.data()).ok());
  EXPECT_LT(t->size(), 5);
  // The filter is the same 256 KiB; what grew is the rows of the (few) admitted keys only.
  EXPECT_EQ(t->ExportPolicyState().bloom_counters.size(), size_t{1} << 18);
  EXPECT_EQ(t->num_pending(), 0);
  EXPECT_LT(t->MemoryBytes() - before, 200 * 64);
}

TEST(FrequencyAdmission, MemoryBytesCountsThePendingCounts) {
  DynamicTableOptions o = Options(1 << 20);
  o.admission.min_count = 2;
  o.admission.max_pending_keys = 1 << 20;
  auto t = Make(o);
  const int64_t before = t->MemoryBytes(), pending_before = t->PendingBytes();
  std::vector<int64_t> once(100000);
  for (size_t i = 0; i < once.size(); ++i) once[i] = 1000 + static_cast<int64_t>(i);
  std::vector<int64_t> rows(once.size());
  ASSERT_TRUE(t->FindOrInsert(once.data(), static_cast<int64_t>(once.size()), 1, rows.data()).ok());
  ASSERT_EQ(t->size(), 0);
  ASSERT_EQ(t->num_pending(), 100000);
  // One node per pending key (next pointer, key, count, last step) and at least one bucket pointer per key (the
  // map's load factor is at most 1): nothing else grew.
  const int64_t pointer = static_cast<int64_t>(sizeof(void*));
  EXPECT_GE(t->PendingBytes(), 100000 * (pointer + 24) + 100000 * pointer);
  EXPECT_EQ(t->MemoryBytes() - before, t->PendingBytes() - pending_before);
}

TEST(BloomAdmission, BadOptionsNameTheTable) {
  DynamicTableOptions o = Options();
  o.admission.min_count = 2;
  o.admission.bloom_num_counters = 16;
  o.admission.bloom_num_hashes = 0;
  ExpectInvalid(DynamicTable::Create(o).status(), {"'items'", "num_hashes", "0"});
  o.admission.bloom_num_hashes = 2;
  o.admission.bloom_counter_bits = 5;
  ExpectInvalid(DynamicTable::Create(o).status(), {"'items'", "counter_bits", "5"});
  o.admission.bloom_counter_bits = 4;
  o.admission.min_count = 16;
  ExpectInvalid(DynamicTable::Create(o).status(), {"'items'", "min_count = 16", "4 bits"});
}

TEST(BloomAdmission, PolicyStateRoundTripAndMerge) {
  DynamicTableOptions o = Options();
  o.admission.min_count = 5;
  o.admission.bloom_num_counters = 32;
  o.admission.bloom_num_hashes = 2;
  auto t = Make(o);
  Insert(t.get(), {1, 1, 2}, 0);
  const DynamicTablePolicyState s = t->ExportPolicyState();
  auto u = Make(o);
  ASSERT_TRUE(u->ImportPolicyState(s.bloom_counters, 1, {}, {}).ok());
  EXPECT_EQ(u->ExportPolicyState().bloom_counters, s.bloom_counters);
  // Two parts add up: key 1 now has an estimate of at least 4.
  std::vector<uint8_t> two = s.bloom_counters;
  two.insert(two.end(), s.bloom_counters.begin(), s.bloom_counters.end());
  ASSERT_TRUE(u->ImportPolicyState(two, 2, {}, {}).ok());
  Insert(u.get(), {1}, 1);  // 4 + 1 = 5: admitted
  EXPECT_EQ(Keys(*u), std::set<int64_t>{1});
  // A wrong size is refused and changes nothing.
  const std::vector<uint8_t> before = u->ExportPolicyState().bloom_counters;
  ExpectInvalid(u->ImportPolicyState(std::vector<uint8_t>(3), 1, {}, {}), {"'items'", "Bloom"});
  EXPECT_EQ(u->ExportPolicyState().bloom_counters, before);
}

// --------------------------------------------------------------------------------------------- scored eviction

struct RefRow {
  int64_t count;
  int64_t last;
  double norm;
};

// A threshold rule's reference: the keys of the rows for which `evicted(row, step)` is false.
template <typename Evicted>
std::set<int64_t> KeysKept(const std::map<int64_t, RefRow>& rows, int64_t step, Evicted evicted) {
  std::set<int64_t> keep;
  for (const auto& [k, r] : rows) {
    if (!evicted(r, step)) keep.insert(k);
  }
  return keep;
}

// Runs the same seeded stream through a table and the brute-force reference of `rule`, checking the kept keys
// after every eviction round.
template <typename Rule>
void CheckAgainstReference(const DynamicTableOptions& o, const Rule& rule) {
  auto t = Make(o);
  std::mt19937_64 rng(11);
  for (int64_t step = 0; step < 30; ++step) {
    std::vector<int64_t> batch;
    for (int i = 0; i < 12; ++i) batch.push_back(static_cast<int64_t>(rng() % 60));
    Insert(t.get(), batch, step);
    const DynamicTableContents c = t->Export();
    std::map<int64_t, RefRow> rows;
    for (size_t i = 0; i < c.keys.size(); ++i) {
      double sq = 0;
      for (int64_t j = 0; j < o.dim; ++j) sq += double{c.weights[i * o.dim + j]} * c.weights[i * o.dim + j];
      rows[c.keys[i]] = RefRow{c.counts[i], c.last_steps[i], std::sqrt(sq)};
    }
    const std::set<int64_t> expected = rule(rows, step);
    ASSERT_TRUE(t->EndStep(step).ok());
    ASSERT_EQ(Keys(*t), expected) << "step " << step;
  }
}

TEST(ScoredEviction, L2NormMatchesReference) {
  DynamicTableOptions o = Options();
  o.eviction.policy = EvictionPolicy::kL2Norm;
  o.eviction.min_norm = 0.9;
  CheckAgainstReference(o, [](const std::map<int64_t, RefRow>& rows, int64_t step) {
    return KeysKept(rows, step, [](const RefRow& r, int64_t) { return r.norm < 0.9; });
  });
}

TEST(ScoredEviction, CountAndAgeMatchesReference) {
  DynamicTableOptions o = Options();
  o.eviction.policy = EvictionPolicy::kCountAndAge;
  o.eviction.min_count = 3;
  o.eviction.ttl_steps = 2;
  CheckAgainstReference(o, [](const std::map<int64_t, RefRow>& rows, int64_t step) {
    return KeysKept(rows, step, [](const RefRow& r, int64_t now) { return r.count < 3 && now - r.last > 2; });
  });
}

TEST(ScoredEviction, DecayedLfuMatchesReference) {
  DynamicTableOptions o = Options();
  o.eviction.policy = EvictionPolicy::kDecayedLfu;
  o.eviction.target_rows = 15;
  o.eviction.decay = 0.5;
  std::map<int64_t, std::pair<float, int64_t>> state;  // key -> (decayed, count at the previous round)
  CheckAgainstReference(o, [&](const std::map<int64_t, RefRow>& rows, int64_t) {
    std::vector<std::tuple<float, int64_t, int64_t>> order;
    std::map<int64_t, std::pair<float, int64_t>> next;
    for (const auto& [k, r] : rows) {
      auto it = state.find(k);
      std::pair<float, int64_t> s = it == state.end() ? std::make_pair(0.0f, int64_t{0}) : it->second;
      s.first = static_cast<float>(double{s.first} * 0.5 + static_cast<double>(r.count - s.second));
      s.second = r.count;
      next[k] = s;
      order.emplace_back(s.first, r.last, k);
    }
    std::sort(order.begin(), order.end());
    std::set<int64_t> keep;
    const size_t excess = rows.size() > 15 ? rows.size() - 15 : 0;
    for (size_t i = excess; i < order.size(); ++i) keep.insert(std::get<2>(order[i]));
    state.clear();
    for (const int64_t k : keep) state[k] = next[k];
    return keep;
  });
}

// Both selections (a bounded heap when few rows go, nth_element when many do) against a sort of every row.
TEST(ScoredEviction, LruSelectionMatchesASortForFewAndManyVictims) {
  for (const int64_t target : {990, 500}) {
    auto t = Make(Options(2000));
    std::mt19937_64 rng(5);
    for (int64_t step = 0; step < 20; ++step) {
      std::vector<int64_t> batch;
      for (int i = 0; i < 60; ++i) batch.push_back(static_cast<int64_t>(rng() % 5000));
      Insert(t.get(), batch, step % 7);  // repeated steps: many ties, broken by key
    }
    const DynamicTableContents c = t->Export();
    std::vector<std::pair<int64_t, int64_t>> order;  // (last step, key)
    for (size_t i = 0; i < c.keys.size(); ++i) order.emplace_back(c.last_steps[i], c.keys[i]);
    std::sort(order.begin(), order.end());
    ASSERT_GT(static_cast<int64_t>(order.size()), target);
    std::set<int64_t> keep;
    for (size_t i = order.size() - target; i < order.size(); ++i) keep.insert(order[i].second);
    EvictionOptions p;
    p.policy = EvictionPolicy::kLru;
    p.target_rows = target;
    ASSERT_TRUE(t->Evict(p, 20).ok());
    EXPECT_EQ(Keys(*t), keep) << "target " << target;
  }
}

TEST(ScoredEviction, EvictByScoreKeepsTheHighestScoresTiesByKey) {
  auto t = Make(Options());
  Insert(t.get(), {1, 2, 3, 4, 5}, 0);
  const int64_t keys[] = {5, 4, 3, 2, 1, 77};
  const float scores[] = {1.0f, 0.5f, 0.5f, 0.5f, 9.0f, -1.0f};  // 77 has no row: ignored
  absl::StatusOr<int64_t> n = t->EvictByScore(keys, scores, 6, 3, 1);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 2);
  EXPECT_EQ(Keys(*t), (std::set<int64_t>{1, 4, 5}));  // 2 and 3 go: ties at 0.5 broken by the smaller key
}

TEST(ScoredEviction, BadArgumentsChangeNothing) {
  auto t = Make(Options());
  Insert(t.get(), {1, 2, 3}, 0);
  const DynamicTableContents before = t->Export();
  const int64_t keys[] = {1, 2, 1};
  const float nan_scores[] = {1.0f, NAN, 2.0f};
  ExpectInvalid(t->EvictByScore(keys, nan_scores, 3, 0, 1).status(), {"'items'", "key 2", "not finite"});
  const float scores[] = {1.0f, 2.0f, 3.0f};
  ExpectInvalid(t->EvictByScore(keys, scores, 3, 0, 1).status(), {"'items'", "key 1", "more than one"});
  ExpectInvalid(t->EvictByScore(keys, scores, 2, -1, 1).status(), {"'items'", "max_rows", "-1"});
  EvictionOptions p;
  p.policy = EvictionPolicy::kL2Norm;
  p.min_norm = -1;
  ExpectInvalid(t->Evict(p, 1).status(), {"'items'", "min_norm", "-1"});
  p.policy = EvictionPolicy::kDecayedLfu;
  p.target_rows = 2;
  p.decay = 1.5;
  ExpectInvalid(t->Evict(p, 1).status(), {"'items'", "decay", "1.5"});
  p.decay = 0.5;  // valid, but this table keeps no decayed counts
  ExpectInvalid(t->Evict(p, 1).status(), {"'items'", "DecayedLFU"});
  p.policy = EvictionPolicy::kCountAndAge;
  p.min_count = 0;
  ExpectInvalid(t->Evict(p, 1).status(), {"'items'", "CountAndAge", "0"});
  EXPECT_EQ(t->Export().keys, before.keys);
  EXPECT_EQ(t->Export().weights, before.weights);
  EXPECT_EQ(t->eviction_log().size(), 0);
}

TEST(ScoredEviction, DecayedCountsRoundTrip) {
  DynamicTableOptions o = Options();
  o.eviction.policy = EvictionPolicy::kDecayedLfu;
  o.eviction.target_rows = 100;
  o.eviction.decay = 0.5;
  auto t = Make(o);
  Insert(t.get(), {1, 1, 1, 2}, 0);
  ASSERT_TRUE(t->EndStep(0).ok());
  Insert(t.get(), {2}, 1);
  ASSERT_TRUE(t->EndStep(1).ok());
  const DynamicTablePolicyState s = t->ExportPolicyState();
  EXPECT_EQ(s.decayed_keys, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(s.decayed_counts, (std::vector<float>{1.5f, 1.5f}));
  auto u = Make(o);
  ASSERT_TRUE(u->Import(t->Export()).ok());
  ASSERT_TRUE(u->ImportPolicyState({}, 1, s.decayed_keys, s.decayed_counts).ok());
  EXPECT_EQ(u->ExportPolicyState().decayed_counts, s.decayed_counts);
}

}  // namespace
}  // namespace tf_embed_ops
