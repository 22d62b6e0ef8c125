// Tiered dynamic tables (docs/tiered_dynamic_tables.md): a DynamicTable whose rows live in a growing row
// file behind the DRAM cache trains bitwise like the same in-memory DynamicTable (the reference) for every
// optimizer, float32 and bfloat16 storage, admission and eviction, with a cache much smaller than the key set; its
// refusals change nothing; imports, exports and row statistics match the in-memory table's; a corrupted record is
// an error naming the key and the path; a full disk refuses the growth before any state changes.
#include "cc/lib/tiered_dynamic_table.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/lib/dynamic_table.h"
#include "cc/lib/dynamic_table_update.h"
#include "cc/lib/embedding_config.h"
#include "cc/lib/feature_layout.h"
#include "cc/lib/gradient_accumulation.h"
#include "cc/lib/optimizers/registry.h"
#include "cc/lib/tests/tiered_test_util.h"
#include "cc/lib/tiered_row_file.h"
#include "cc/lib/tiered_row_storage.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace {

using tiered_test::EveryOptimizer;
using tiered_test::PatchFile;
using tiered_test::Step;
using tiered_test::TempDir;
using tiered_test::Threads;

DynamicTableOptions Options(const TableOptimization& o, StorageType storage, int64_t dim, int64_t max_rows) {
  DynamicTableOptions d;
  d.name = "items";
  d.dim = dim;
  d.initial_capacity = 4;
  d.max_rows = max_rows;
  d.rows_per_chunk = 4;
  d.initializer.kind = RowInitializerKind::kNormal;
  d.initializer.stddev = 0.3f;
  d.initializer.seed = 5;
  for (const SlotInfo& s : OptimizerSlots(o.optimizer)) {
    d.slot_initial_values.push_back(s.default_initial_value + 0.05f);
    d.slot_widths.push_back(SlotWidth(s, dim));
  }
  d.storage = storage;
  d.slot_storage = storage;
  return d;
}

std::unique_ptr<DynamicTable> InMemory(const DynamicTableOptions& o) {
  absl::StatusOr<std::unique_ptr<DynamicTable>> t = DynamicTable::Create(o);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

// A tiered table of the same options whose cache holds `capacity_rows` rows; its file grows by 8 rows at a time.
std::unique_ptr<TieredDynamicTable> Tiered(const DynamicTableOptions& o, const std::string& path,
                                           int64_t capacity_rows) {
  TieredDynamicOptions t;
  t.path = path;
  t.cache_bytes = capacity_rows * TieredRowCache::RowBytes(TieredDynamicTable::LayoutFor(o, 1));
  t.min_growth_rows = 8;
  absl::StatusOr<std::unique_ptr<TieredDynamicTable>> table = TieredDynamicTable::Create(o, t);
  EXPECT_TRUE(table.ok()) << table.status();
  if (!table.ok()) return nullptr;
  EXPECT_EQ((*table)->cache().capacity(), capacity_rows);
  return *std::move(table);
}

// Skewed keys over a key space of `num_keys` (a few keys take most of them), spread out as hashed ids are.
std::vector<int64_t> SkewedKeys(int64_t count, int64_t num_keys, std::mt19937_64* rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<int64_t> keys(count);
  for (int64_t& k : keys) {
    k = 1000003 * std::min<int64_t>(num_keys - 1, static_cast<int64_t>(num_keys * std::pow(u(*rng), 2))) - 77;
  }
  return keys;
}

// An in-memory table's Export, and the same of a tiered table, must agree bitwise.
void ExpectSameContents(const DynamicTableContents& want, const DynamicTableContents& got, const std::string& what) {
  EXPECT_EQ(want.keys, got.keys) << what;
  EXPECT_EQ(want.counts, got.counts) << what;
  EXPECT_EQ(want.last_steps, got.last_steps) << what;
  EXPECT_EQ(want.pending_keys, got.pending_keys) << what;
  EXPECT_EQ(want.pending_counts, got.pending_counts) << what;
  ASSERT_EQ(want.weights.size(), got.weights.size()) << what;
  EXPECT_EQ(std::memcmp(want.weights.data(), got.weights.data(), want.weights.size() * sizeof(float)), 0) << what;
  ASSERT_EQ(want.slots.size(), got.slots.size()) << what;
  for (size_t s = 0; s < want.slots.size(); ++s) {
    ASSERT_EQ(want.slots[s].size(), got.slots[s].size()) << what;
    EXPECT_EQ(std::memcmp(want.slots[s].data(), got.slots[s].data(), want.slots[s].size() * sizeof(float)), 0)
        << what << " slot " << s;
  }
}

DynamicTableContents TieredExport(TieredDynamicTable* t) {
  absl::StatusOr<DynamicTableContents> c = t->Export();
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : DynamicTableContents();
}

// ---------------------------------------------------------------------------------------------- the file

TEST(TieredRowFileGrowTest, GrowKeepsTheRecordsAndRewritesTheHeader) {
  TempDir dir;
  const std::string path = dir.File("g.rows");
  TieredRowLayout layout;
  layout.num_rows = 3;
  layout.types = {StorageType::kFloat32, StorageType::kBfloat16};
  layout.widths = {2, 3};
  absl::StatusOr<std::unique_ptr<TieredRowFile>> file = TieredRowFile::Create(path, "g", layout);
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<std::vector<char>> records(3, std::vector<char>(layout.record_bytes()));
  std::vector<char*> pointers;
  for (int r = 0; r < 3; ++r) {
    const float w[] = {1.0f + r, 2.0f}, s[] = {0.5f, 0.25f, r * 1.0f};
    const float* const buffers[] = {w, s};
    EncodeRecord(layout, buffers, records[r].data());
    pointers.push_back(records[r].data());
  }
  ASSERT_TRUE((*file)->WriteRecords(0, 3, pointers.data()).ok());
  EXPECT_TRUE((*file)->Grow(2).ok());  // fewer rows: nothing to do
  EXPECT_EQ((*file)->layout().num_rows, 3);
  ASSERT_TRUE((*file)->Grow(10).ok());
  EXPECT_EQ((*file)->layout().num_rows, 10);
  ASSERT_TRUE((*file)->Sync().ok());  // (Open wants a file closed cleanly)
  // Reopened with the grown geometry: the header says 10 rows, the old records read back, the new ones are
  // never-written records.
  TieredRowLayout grown = layout;
  grown.num_rows = 10;
  absl::StatusOr<std::unique_ptr<TieredRowFile>> reopened = TieredRowFile::Open(path, "g", grown);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  std::vector<char> back(layout.record_bytes());
  char* const out[] = {back.data()};
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE((*reopened)->ReadRecords(r, 1, out).ok());
    EXPECT_EQ(back, records[r]) << r;
  }
  EXPECT_EQ((*reopened)->ReadRecords(7, 1, out).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(TieredRowFile::Open(path, "g", layout).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------- training

struct Lifecycle {
  AdmissionOptions admission;
  EvictionOptions eviction;
};

// The in-memory table and the tiered one (a cache of 12 rows for ~60 keys) see the same training lookups,
// updates and end-of-step evictions: every row, slot, count and step stays bitwise equal, and the rows the steps
// touch really went to the file and came back.
void ExpectTrainsLikeInMemory(const TableOptimization& o, StorageType storage, const Lifecycle& lifecycle,
                              const ShardFn& shard) {
  constexpr int64_t kDim = 5, kKeys = 60, kBatch = 12, kCapacity = 12;
  DynamicTableOptions options = Options(o, storage, kDim, /*max_rows=*/48);
  options.admission = lifecycle.admission;
  options.eviction = lifecycle.eviction;
  TempDir dir;
  auto mem = InMemory(options);
  const std::string path = dir.File("items.rows");
  auto tier = Tiered(options, path, kCapacity);
  ASSERT_NE(mem, nullptr);
  ASSERT_NE(tier, nullptr);
  const std::string what = absl::StrCat(OptimizerName(o.optimizer), " ", StorageTypeName(storage));
  std::mt19937_64 rng(31);
  for (int64_t step = 0; step < 10; ++step) {
    const std::vector<int64_t> keys = SkewedKeys(kBatch, kKeys, &rng);
    std::vector<int64_t> mem_rows(kBatch), tier_rows(kBatch);
    BatchStats mem_stats, tier_stats;
    ASSERT_TRUE(mem->FindOrInsert(keys.data(), kBatch, step, mem_rows.data(), &mem_stats).ok());
    const absl::Status s = tier->FindOrInsert(keys.data(), kBatch, step, tier_rows.data(), &tier_stats);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(mem_rows, tier_rows) << what << " step " << step;
    EXPECT_EQ(mem_stats.inserts, tier_stats.inserts);
    // The lookup reads the rows' weights through pinned records: the in-memory table's values.
    TieredPin pin;
    ASSERT_TRUE(tier->PinRows(tier_rows.data(), kBatch, &pin).ok());
    const TieredRowStorage records(tier->layout(), pin, /*window=*/false);
    const TieredRowLayout& layout = tier->layout();
    std::vector<std::vector<float>> got(layout.num_buffers());
    std::vector<float*> got_buffers;
    for (int64_t b = 0; b < layout.num_buffers(); ++b) {
      got[b].resize(layout.widths[b]);
      got_buffers.push_back(got[b].data());
    }
    std::vector<float> want(kDim);
    for (const int64_t row : pin.rows) {
      mem->ReadRow(0, row, want.data());
      DecodeRecord(layout, records.RecordOf(row), got_buffers.data());
      EXPECT_EQ(std::memcmp(want.data(), got[0].data(), kDim * sizeof(float)), 0) << what << " row " << row;
    }
    tier->cache().Release(&pin, /*dirty=*/false);

    Step update(mem_rows, kDim, &rng);  // (rows without a key, -1, contribute nothing)
    update.Build();
    const float lr = 0.04f * static_cast<float>(step + 1);
    const RoundingSpec rounding{Rounding::kStochastic, 9, step, 1};
    UpdateDynamicTable(o, lr, update.plan, mem.get(), shard, rounding);
    const absl::Status u = tier->Update(o, lr, update.plan, rounding, shard);
    ASSERT_TRUE(u.ok()) << u;
    absl::StatusOr<int64_t> mem_evicted = mem->EndStep(step);
    absl::StatusOr<int64_t> tier_evicted = tier->table().EndStep(step);
    ASSERT_TRUE(mem_evicted.ok() && tier_evicted.ok());
    EXPECT_EQ(*mem_evicted, *tier_evicted) << what;
  }
  ExpectSameContents(mem->Export(), TieredExport(tier.get()), what);
  const TieredCacheStats stats = tier->cache().stats();
  EXPECT_GT(stats.evictions, 0) << what;           // the cache was too small for the rows: they went to the file ...
  EXPECT_GT(stats.misses, 0) << what;              // ... and came back
  EXPECT_GT(tier->cache().num_rows(), 4) << what;  // the file grew
  // After a flush the file alone holds every live row (its header describes the grown file).
  ASSERT_TRUE(tier->cache().Flush().ok());
  const TieredRowLayout& layout = tier->layout();
  absl::StatusOr<std::unique_ptr<TieredRowFile>> file = TieredRowFile::Open(path, "items", layout);
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<char> record(layout.record_bytes());
  char* const records[] = {record.data()};
  std::vector<std::vector<float>> got(layout.num_buffers()), want(layout.num_buffers());
  std::vector<float*> got_buffers;
  for (int64_t b = 0; b < layout.num_buffers(); ++b) {
    got[b].resize(layout.widths[b]);
    want[b].resize(layout.widths[b]);
    got_buffers.push_back(got[b].data());
  }
  for (const int64_t row : mem->LiveRows()) {
    ASSERT_TRUE((*file)->ReadRecords(row, 1, records).ok()) << what << " row " << row;
    DecodeRecord(layout, record.data(), got_buffers.data());
    for (int64_t b = 0; b < layout.num_buffers(); ++b) {
      mem->ReadRow(b, row, want[b].data());
      EXPECT_EQ(std::memcmp(want[b].data(), got[b].data(), want[b].size() * sizeof(float)), 0)
          << what << " row " << row << " buffer " << b << " in the file";
    }
  }
}

TEST(TieredDynamicTableTest, TrainsBitwiseLikeTheInMemoryTableForEveryOptimizer) {
  Lifecycle lru;
  lru.eviction.policy = EvictionPolicy::kLru;
  lru.eviction.target_rows = 20;  // rows are freed every step and reused by new keys
  for (const OptimizerParams& p : EveryOptimizer()) {
    TableOptimization o;
    o.optimizer = p;
    o.gradient_clipping = {-1.5f, 1.5f};
    o.weight_decay_factor = 0.01f;
    for (StorageType storage : {StorageType::kFloat32, StorageType::kBfloat16}) {
      ExpectTrainsLikeInMemory(o, storage, lru, Threads(1));
    }
    ExpectTrainsLikeInMemory(o, StorageType::kFloat16, lru, Threads(3));
  }
}

TEST(TieredDynamicTableTest, AdmissionAndEveryMetadataPolicyMatchTheInMemoryTable) {
  TableOptimization o;
  o.optimizer = Adagrad{};
  std::vector<Lifecycle> lifecycles(5);
  lifecycles[0].admission.min_count = 2;
  lifecycles[0].admission.max_pending_keys = 10;
  lifecycles[0].eviction.policy = EvictionPolicy::kLfu;
  lifecycles[0].eviction.target_rows = 16;
  lifecycles[1].admission.min_count = 2;
  lifecycles[1].admission.bloom_num_counters = 256;
  lifecycles[1].admission.bloom_num_hashes = 2;
  lifecycles[1].eviction.policy = EvictionPolicy::kTtl;
  lifecycles[1].eviction.ttl_steps = 2;
  lifecycles[2].eviction.policy = EvictionPolicy::kDecayedLfu;
  lifecycles[2].eviction.target_rows = 18;
  lifecycles[2].eviction.decay = 0.5;
  lifecycles[3].eviction.policy = EvictionPolicy::kCountAndAge;
  lifecycles[3].eviction.min_count = 3;
  lifecycles[3].eviction.ttl_steps = 1;
  // [4]: no eviction, so max_rows (48) refuses keys once the table is full.
  for (const Lifecycle& l : lifecycles) {
    ExpectTrainsLikeInMemory(o, StorageType::kBfloat16, l, Threads(2));
  }
}

TEST(TieredDynamicTableTest, NumericsCheckFindsTheInMemoryRowAndWritesNothing) {
  for (bool non_lazy : {false, true}) {
    Adam adam;
    adam.use_non_lazy_adam = non_lazy;
    TableOptimization o;
    o.optimizer = adam;
    const DynamicTableOptions options = Options(o, StorageType::kFloat32, 3, 100);
    TempDir dir;
    auto mem = InMemory(options);
    auto tier = Tiered(options, dir.File("t.rows"), 5);
    std::vector<int64_t> keys;
    for (int64_t k = 0; k < 5; ++k) keys.push_back(k * 11);
    for (int64_t round = 0; round < 4; ++round) {  // 20 rows, in batches that fit the cache
      std::vector<int64_t> batch;
      for (int64_t k : keys) batch.push_back(k + round);
      std::vector<int64_t> rows(5);
      ASSERT_TRUE(mem->FindOrInsert(batch.data(), 5, 0, rows.data()).ok());
      ASSERT_TRUE(tier->FindOrInsert(batch.data(), 5, 0, rows.data()).ok());
    }
    std::mt19937_64 rng(4);
    Step rebuilt({3, 17, 9}, 3, &rng);
    rebuilt.gradient[1 * 3 + 2] = std::nanf("");
    rebuilt.gradient[2 * 3 + 0] = std::nanf("");
    rebuilt.plan.Build(&rebuilt.sources);  // (the sources point at the gradient: the plan sees the NaNs)
    const DynamicTableContents before = TieredExport(tier.get());
    const NonFiniteUpdate want = FindNonFiniteDynamicUpdate(o, 0.1f, rebuilt.plan, *mem, Threads(1));
    const absl::StatusOr<NonFiniteUpdate> got = tier->FindNonFinite(o, 0.1f, rebuilt.plan, RoundingSpec(), Threads(1));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(want.found);
    EXPECT_EQ(got->found, want.found);
    EXPECT_EQ(got->row, want.row);
    EXPECT_EQ(got->in_gradient, want.in_gradient);
    EXPECT_EQ(got->column, want.column);
    ExpectSameContents(before, TieredExport(tier.get()), "after the check");
  }
}

// ---------------------------------------------------------------------------------------------- refusals

TEST(TieredDynamicTableTest, RefusedCallsChangeNothing) {
  TableOptimization o;
  o.optimizer = Adagrad{};
  DynamicTableOptions options = Options(o, StorageType::kFloat32, 4, 100);
  options.admission.min_count = 2;
  options.admission.max_pending_keys = 50;
  TempDir dir;
  auto tier = Tiered(options, dir.File("t.rows"), 6);
  std::vector<int64_t> keys = {1, 2, 3, 1, 2, 3, 4};
  std::vector<int64_t> rows(keys.size());
  ASSERT_TRUE(tier->FindOrInsert(keys.data(), 7, 0, rows.data()).ok());
  const DynamicTableContents before = TieredExport(tier.get());
  const DynamicTableCounters counters = tier->table().counters();
  const int64_t file_rows = tier->cache().num_rows();
  auto expect_unchanged = [&](const char* what) {
    ExpectSameContents(before, TieredExport(tier.get()), what);
    EXPECT_EQ(tier->table().counters().inserts, counters.inserts) << what;
    EXPECT_EQ(tier->table().counters().below_admission, counters.below_admission) << what;
  };
  // More distinct keys than the cache holds: refused before any key is counted.
  std::vector<int64_t> wide = {10, 11, 12, 13, 14, 15, 16, 1};
  std::vector<int64_t> wide_rows(wide.size(), -5);
  const absl::Status too_many = tier->FindOrInsert(wide.data(), 8, 1, wide_rows.data());
  EXPECT_EQ(too_many.code(), absl::StatusCode::kInvalidArgument) << too_many;
  EXPECT_NE(too_many.message().find("items"), std::string::npos) << too_many;
  EXPECT_NE(too_many.message().find("8 distinct rows"), std::string::npos) << too_many;
  expect_unchanged("a batch larger than the cache");
  EXPECT_EQ(tier->cache().num_rows(), file_rows);
  // A negative step: DynamicTable's own refusal.
  EXPECT_EQ(tier->FindOrInsert(keys.data(), 7, -1, rows.data()).code(), absl::StatusCode::kInvalidArgument);
  expect_unchanged("a negative step");
  // An import of duplicate keys.
  DynamicTableContents bad = before;
  bad.keys.push_back(bad.keys[0]);
  bad.counts.push_back(1);
  bad.last_steps.push_back(0);
  bad.weights.resize(bad.keys.size() * 4);
  for (auto& s : bad.slots) s.resize(bad.keys.size() * 4);
  EXPECT_EQ(tier->Import(bad).code(), absl::StatusCode::kInvalidArgument);
  expect_unchanged("an import with a duplicate key");
  // Row values of the wrong size.
  DynamicTableContents short_rows = before;
  short_rows.weights.pop_back();
  EXPECT_EQ(tier->Import(short_rows).code(), absl::StatusCode::kInvalidArgument);
  expect_unchanged("an import with too few weights");
}

TEST(TieredDynamicTableTest, L2NormAndAnEmptyCacheAreRefusedNamingTheTable) {
  TableOptimization o;
  o.optimizer = Sgd{};
  DynamicTableOptions options = Options(o, StorageType::kFloat32, 4, 100);
  TempDir dir;
  options.eviction.policy = EvictionPolicy::kL2Norm;
  options.eviction.min_norm = 0.1;
  TieredDynamicOptions t{dir.File("a.rows"), 1 << 20};
  absl::StatusOr<std::unique_ptr<TieredDynamicTable>> l2 = TieredDynamicTable::Create(options, t);
  ASSERT_FALSE(l2.ok());
  EXPECT_NE(l2.status().message().find("'items'"), std::string::npos) << l2.status();
  EXPECT_NE(l2.status().message().find("L2Norm"), std::string::npos) << l2.status();
  options.eviction = EvictionOptions();
  auto table = Tiered(options, dir.File("b.rows"), 4);
  EvictionOptions explicit_l2;
  explicit_l2.policy = EvictionPolicy::kL2Norm;
  explicit_l2.min_norm = 0.1;
  const absl::StatusOr<int64_t> evicted = table->table().Evict(explicit_l2, 0);
  EXPECT_EQ(evicted.status().code(), absl::StatusCode::kInvalidArgument);
  TieredDynamicOptions tiny{dir.File("c.rows"), 10};
  const auto none = TieredDynamicTable::Create(options, tiny);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("cache_bytes = 10"), std::string::npos) << none.status();
}

// ---------------------------------------------------------------------------------------------- import, export

TEST(TieredDynamicTableTest, ImportsAndExportsLikeTheInMemoryTableWholeOrStreamed) {
  TableOptimization o;
  o.optimizer = Adam{};
  for (StorageType storage : {StorageType::kFloat32, StorageType::kBfloat16}) {
    const DynamicTableOptions options = Options(o, storage, 3, 200);
    auto source = InMemory(options);
    std::mt19937_64 rng(8);
    for (int64_t step = 0; step < 6; ++step) {
      std::vector<int64_t> keys = SkewedKeys(25, 90, &rng);
      std::vector<int64_t> rows(keys.size());
      ASSERT_TRUE(source->FindOrInsert(keys.data(), 25, step, rows.data()).ok());
      Step update(rows, 3, &rng);
      update.Build();
      UpdateDynamicTable(o, 0.1f, update.plan, source.get(), Threads(1), RoundingSpec{Rounding::kStochastic, 1, step});
    }
    const DynamicTableContents c = source->Export();
    TempDir dir;
    auto whole = Tiered(options, dir.File("whole.rows"), 7);
    ASSERT_TRUE(whole->Import(c).ok());
    ExpectSameContents(c, TieredExport(whole.get()), "imported whole");
    EXPECT_GE(whole->cache().num_rows(), static_cast<int64_t>(c.keys.size()));  // the file grew for the import
    // Streamed: the keys first (no row values), then the rows in chunks of 10 keys (row i = key i of c).
    auto streamed = Tiered(options, dir.File("streamed.rows"), 7);
    DynamicTableContents keys_only = c;
    keys_only.weights.clear();
    for (auto& s : keys_only.slots) s.clear();
    ASSERT_TRUE(streamed->Import(keys_only).ok());
    const int64_t n = static_cast<int64_t>(c.keys.size());
    for (int64_t first = 0; first < n; first += 10) {
      const int64_t count = std::min<int64_t>(10, n - first);
      std::vector<int64_t> rows(count);
      for (int64_t i = 0; i < count; ++i) rows[i] = first + i;
      std::vector<const float*> values{c.weights.data() + first * 3};
      for (size_t s = 0; s < c.slots.size(); ++s) values.push_back(c.slots[s].data() + first * c.slot_widths[s]);
      ASSERT_TRUE(streamed->WriteRows(rows, values).ok());
    }
    ExpectSameContents(c, TieredExport(streamed.get()), "imported in chunks");
    // Row statistics (the norms a score policy reads) come from the file, as the in-memory table's from memory.
    auto mem = InMemory(options);
    ASSERT_TRUE(mem->Import(c).ok());
    const DynamicTableRowStats want = mem->RowStats();
    const absl::StatusOr<DynamicTableRowStats> got = streamed->RowStats();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(want.keys, got->keys);
    EXPECT_EQ(want.norms, got->norms);
    EXPECT_EQ(want.counts, got->counts);
  }
}

TEST(TieredDynamicTableTest, ReadsAndWritesRowsByKeyAndRefusesAKeyWithoutARow) {
  TableOptimization o;
  o.optimizer = Adagrad{};
  const DynamicTableOptions options = Options(o, StorageType::kBfloat16, 3, 100);
  TempDir dir;
  auto tier = Tiered(options, dir.File("t.rows"), 2);  // 6 keys through a cache of 2 rows
  auto mem = InMemory(options);
  const std::vector<int64_t> keys = {40, 7, 900, 5, 1 << 20, 66};
  for (size_t i = 0; i < keys.size(); i += 2) {
    std::vector<int64_t> rows(2);
    ASSERT_TRUE(tier->FindOrInsert(keys.data() + i, 2, 0, rows.data()).ok());
    ASSERT_TRUE(mem->FindOrInsert(keys.data() + i, 2, 0, rows.data()).ok());
  }
  // Read in the export's key order, one chunk of keys at a time: the in-memory table's rows and slots, bitwise.
  const DynamicTableContents want = mem->Export();
  const int64_t n = static_cast<int64_t>(want.keys.size());
  std::vector<float> weights(n * 3), slot(n * 3);
  for (int64_t first = 0; first < n; first += 4) {
    const int64_t count = std::min<int64_t>(4, n - first);
    ASSERT_TRUE(tier->ReadRowsOfKeys(want.keys.data() + first, count, {&weights[first * 3], &slot[first * 3]}).ok());
  }
  EXPECT_EQ(std::memcmp(weights.data(), want.weights.data(), weights.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(slot.data(), want.slots[0].data(), slot.size() * sizeof(float)), 0);
  // Written back by key, in another order, the rows read the same.
  std::vector<float> twice(weights.size());
  for (size_t i = 0; i < twice.size(); ++i) twice[i] = 2.0f * weights[i];
  ASSERT_TRUE(tier->WriteRowsOfKeys(want.keys.data(), n, {twice.data(), slot.data()}).ok());
  std::vector<float> got(weights.size()), got_slot(slot.size());
  ASSERT_TRUE(tier->ReadRowsOfKeys(want.keys.data(), n, {got.data(), got_slot.data()}).ok());
  EXPECT_EQ(got, twice);  // bfloat16 values doubled stay exact
  EXPECT_EQ(got_slot, slot);
  // A key without a row, or a key written twice: refused before any row is written.
  const DynamicTableContents before = TieredExport(tier.get());
  const std::vector<int64_t> unknown = {40, 12345};
  std::vector<float> two(6, 9.0f);
  const absl::Status none = tier->WriteRowsOfKeys(unknown.data(), 2, {two.data(), two.data()});
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument) << none;
  EXPECT_NE(none.message().find("key 12345"), std::string::npos) << none;
  EXPECT_NE(none.message().find("'items'"), std::string::npos) << none;
  EXPECT_EQ(tier->ReadRowsOfKeys(unknown.data(), 2, {two.data(), two.data()}).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int64_t> repeated = {40, 40};
  EXPECT_EQ(tier->WriteRowsOfKeys(repeated.data(), 2, {two.data(), two.data()}).code(),
            absl::StatusCode::kInvalidArgument);
  ExpectSameContents(before, TieredExport(tier.get()), "refused writes by key");
}

// ---------------------------------------------------------------------------------------------- faults

TEST(TieredDynamicTableTest, ACorruptedRecordIsAnErrorNamingTheKeyAndThePath) {
  TableOptimization o;
  o.optimizer = Sgd{};
  const DynamicTableOptions options = Options(o, StorageType::kFloat32, 4, 100);
  TempDir dir;
  const std::string path = dir.File("t.rows");
  auto tier = Tiered(options, path, 3);
  for (int64_t k = 0; k < 12; k += 3) {
    std::vector<int64_t> keys = {k * 100, k * 100 + 100, k * 100 + 200};
    std::vector<int64_t> rows(3);
    ASSERT_TRUE(tier->FindOrInsert(keys.data(), 3, 0, rows.data()).ok());
  }
  ASSERT_TRUE(tier->cache().Flush().ok());
  // Row 0 (key 0) was written back long ago: flip a byte of its record on disk.
  PatchFile(path, TieredRowFile::kHeaderBytes + 2, {'\x5a'});
  std::vector<int64_t> row0 = {0};
  TieredPin pin;
  const absl::Status s = tier->PinRows(row0.data(), 1, &pin);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  for (const char* part : {"'items'", "key 0 (row 0)", "t.rows", "CRC32C"}) {
    EXPECT_NE(s.message().find(part), std::string::npos) << s << " lacks " << part;
  }
  const absl::StatusOr<DynamicTableContents> exported = tier->Export();
  EXPECT_EQ(exported.status().code(), absl::StatusCode::kDataLoss);
  // The other rows still read.
  std::vector<int64_t> row5 = {5};
  EXPECT_TRUE(tier->PinRows(row5.data(), 1, &pin).ok());
  tier->cache().Release(&pin, false);
}

TEST(TieredDynamicTableTest, AFullDiskRefusesTheGrowthBeforeAnyKeyIsInserted) {
  TableOptimization o;
  o.optimizer = Sgd{};
  const DynamicTableOptions options = Options(o, StorageType::kFloat32, 4, 1000);
  TempDir dir;
  const std::string path = dir.File("t.rows");
  auto tier = Tiered(options, path, 8);
  std::vector<int64_t> keys = {1, 2, 3};
  std::vector<int64_t> rows(3);
  ASSERT_TRUE(tier->FindOrInsert(keys.data(), 3, 0, rows.data()).ok());
  const DynamicTableContents before = TieredExport(tier.get());
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  // A file-size limit at the file's current size stands for a full disk (EFBIG, as ENOSPC: ResourceExhausted).
  struct rlimit old_limit;
  getrlimit(RLIMIT_FSIZE, &old_limit);
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit limit = old_limit;
  limit.rlim_cur = static_cast<rlim_t>(st.st_size);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
  std::vector<int64_t> more = {4, 5, 6, 7, 8, 9, 10, 11};
  std::vector<int64_t> more_rows(8);
  const absl::Status s = tier->FindOrInsert(more.data(), 8, 1, more_rows.data());
  setrlimit(RLIMIT_FSIZE, &old_limit);
  signal(SIGXFSZ, SIG_DFL);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  for (const char* part : {"'items'", "t.rows", "cannot grow"}) {
    EXPECT_NE(s.message().find(part), std::string::npos) << s << " lacks " << part;
  }
  ExpectSameContents(before, TieredExport(tier.get()), "after a refused growth");
  EXPECT_EQ(tier->table().size(), 3);
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, tier->cache().file().file_bytes());
  // With room again the same batch goes through.
  EXPECT_TRUE(tier->FindOrInsert(more.data(), 8, 1, more_rows.data()).ok());
  EXPECT_EQ(tier->table().size(), 11);
}

}  // namespace
}  // namespace tf_embed_ops
