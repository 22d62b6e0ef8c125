// The optimizer step of tiered tables (docs/tiered_tables.md) through the one row walk: bitwise equal to the
// in-memory table for every optimizer with float32 and bfloat16 storage and a cache much smaller than the table,
// with write-back and prefetch beside it, a full disk that leaves the step unapplied, and the numerics check.
#include <errno.h>
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/lib/distinct_rows.h"
#include "cc/lib/embedding_config.h"
#include "cc/lib/gradient_accumulation.h"
#include "cc/lib/optimizers/registry.h"
#include "cc/lib/table_update.h"
#include "cc/lib/tests/tiered_cache_test_util.h"
#include "cc/lib/tests/tiered_test_util.h"
#include "cc/lib/tiered_row_cache.h"
#include "cc/lib/tiered_row_file.h"
#include "cc/lib/tiered_row_storage.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace tiered_test {
namespace {

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

// A lazy step as the kernel runs it: the plan over the ids' positions among the batch's distinct rows (the rows a
// walk by position, UpdatePinnedPositions, pins).
struct ByPosition {
  ByPosition(const Step& step, int64_t num_rows) : batch(FindDistinctRows(step.ids, num_rows)), sources(step.sources) {
    sources[0].ids = batch.positions.data();
    plan.Build(&sources, static_cast<int64_t>(batch.rows.size()));
  }

  DistinctBatch batch;
  std::vector<GradientSource> sources;
  RowGradientPlan plan;
};

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
    if (s % 2 == 1) {
      ASSERT_TRUE(cache->Prefetch(SkewedIds(1, kRows, &rng)).ok());
    }
    if (lazy) {
      const ByPosition lazy_step(step, kRows);
      TieredPin pin;
      ASSERT_TRUE(by_position->Acquire(lazy_step.batch.rows, &pin).ok());
      UpdatePinnedPositions(o, lr, lazy_step.plan, layout, pin, rounding, shard);
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

// An Adagrad table of rows x dim (weights and accumulators in float32) twice, from the same rows: tiered, behind a
// cache of `capacity` rows over a fresh file, and in memory (the reference).
struct AdagradTwins {
  AdagradTwins(int64_t rows, int64_t dim, int64_t capacity, RowFileIo io = RowFileIo::Posix(),
               bool background_writeback = false)
      : layout(Layout(rows, {StorageType::kFloat32, StorageType::kFloat32}, {dim, dim})),
        path(dir.File("t.rows")),
        cache(NewCache(path, layout, capacity, io, background_writeback)),
        dense_rows(ReadAll(cache.get())),
        dense{dense_rows[0].data(), {dense_rows[1].data()}, rows, dim} {
    o.optimizer = Adagrad{};
  }

  // Every row equals the reference's, through the cache and in the file after a flush.
  void ExpectSameRows() {
    EXPECT_EQ(ReadAll(cache.get()), dense_rows);
    ASSERT_TRUE(cache->Flush().ok());
    EXPECT_EQ(ReadAll(Reopen(path, layout, 4).get()), dense_rows);
  }

  TableOptimization o;
  TempDir dir;
  TieredRowLayout layout;
  std::string path;
  std::unique_ptr<TieredRowCache> cache;
  std::vector<std::vector<float>> dense_rows;
  TableBuffers dense;
};

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
  RowFileIo io = RowFileIo::Posix();
  io.pwritev = ThreadCountingPwritev;
  g_disk_full = false;
  g_writes_elsewhere = 0;
  g_test_thread = std::this_thread::get_id();
  AdagradTwins t(kRows, kDim, kCapacity, io, /*background_writeback=*/true);
  std::mt19937_64 rng(23);
  int failed = 0;
  for (int s = 0; s < 60; ++s) {
    g_disk_full = s >= 20 && s < 30;
    Step step(SkewedIds(12, kRows, &rng), kDim, &rng);
    step.Build(kRows);
    t.cache->WaitForWriteback();  // the thread has cleaned what the previous step asked for
    const std::vector<std::vector<float>> before = ReadAll(t.cache.get());
    const absl::Status status = UpdateTieredTable(t.o, 0.1f, step.plan, t.cache.get(), RoundingSpec(), Serial(), "t");
    if (!status.ok()) {
      EXPECT_TRUE(g_disk_full) << status;
      EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
      EXPECT_EQ(ReadAll(t.cache.get()), before) << "step " << s;
      ++failed;
      continue;
    }
    UpdateTable(t.o, 0.1f, step.plan, t.dense, Serial());
  }
  EXPECT_GT(failed, 0);
  EXPECT_GT(g_writes_elsewhere.load(), 0);  // the thread did write rows back
  t.ExpectSameRows();
}

TEST(TieredTableUpdateTest, PrefetchesBesideTheWalkChangeNoResult) {
  // While a step's pinned rows are updated (no lock held), another thread prefetches other rows, evicting and
  // writing back dirty unpinned rows of earlier steps: the rows must end bitwise as the in-memory table's.
  constexpr int64_t kRows = 200, kDim = 8, kCapacity = 24;
  AdagradTwins t(kRows, kDim, kCapacity);
  std::mt19937_64 rng(9);
  for (int s = 0; s < 20; ++s) {
    Step step(SkewedIds(16, kRows, &rng), kDim, &rng);
    step.Build(kRows);
    UpdateTable(t.o, 0.1f, step.plan, t.dense, Serial());
    TieredPin pin;
    ASSERT_TRUE(AcquirePlanRows(step.plan, t.cache.get(), "t", &pin).ok());
    std::vector<std::vector<int64_t>> next(10);
    for (auto& rows : next) {
      rows = SkewedIds(6, kRows, &rng);
      std::sort(rows.begin(), rows.end());
      rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    }
    std::thread prefetcher([&] {
      for (const auto& rows : next) EXPECT_TRUE(t.cache->Prefetch(rows).ok());
    });
    UpdatePinnedRows(t.o, 0.1f, step.plan, t.layout, pin, RoundingSpec(), Threads(2));
    prefetcher.join();
    t.cache->Release(&pin, /*dirty=*/true);
  }
  EXPECT_GT(t.cache->stats().evictions, 0);
  t.ExpectSameRows();
}

TEST(TieredTableUpdateTest, AsynchronousPrefetchOfTheNextStepChangesNoResultAndItsRowsHit) {
  // Each step pins its rows, asks the cache's thread to prefetch the next step's rows (StartPrefetch returns at
  // once), updates its own rows meanwhile and releases them; a cache of 40 of 300 rows with the write-back thread
  // on.  Every row ends bitwise as the in-memory table's, and each next step reads nothing itself: what it needs
  // was prefetched (its rows fit beside the pinned ones), so its Acquire waited for the prefetch and hit.
  constexpr int64_t kRows = 300, kDim = 8, kCapacity = 40;
  AdagradTwins t(kRows, kDim, kCapacity, RowFileIo::Posix(), /*background_writeback=*/true);
  std::mt19937_64 rng(31);
  std::vector<std::unique_ptr<Step>> steps;  // (a Step points into itself: never moved)
  for (int s = 0; s < 30; ++s) {
    steps.push_back(std::make_unique<Step>(SkewedIds(16, kRows, &rng), kDim, &rng));
    steps.back()->Build(kRows);
  }
  int64_t prefetched_steps_missing = 0;
  for (size_t s = 0; s < steps.size(); ++s) {
    UpdateTable(t.o, 0.1f, steps[s]->plan, t.dense, Serial());
    const int64_t misses_before = t.cache->stats().misses;
    TieredPin pin;
    ASSERT_TRUE(AcquirePlanRows(steps[s]->plan, t.cache.get(), "t", &pin).ok());
    if (s > 0) prefetched_steps_missing += t.cache->stats().misses - misses_before;
    if (s + 1 < steps.size()) {
      ASSERT_TRUE(t.cache->StartPrefetch(PlanRows(steps[s + 1]->plan, kRows)).ok());
    }
    UpdatePinnedRows(t.o, 0.1f, steps[s]->plan, t.layout, pin, RoundingSpec(), Threads(2));
    t.cache->Release(&pin, /*dirty=*/true);
  }
  EXPECT_EQ(prefetched_steps_missing, 0);
  EXPECT_GT(t.cache->stats().evictions, 0);
  EXPECT_TRUE(t.cache->WaitForPrefetch().ok());
  t.ExpectSameRows();
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
  const ByPosition lazy_step(step, 50);
  TieredPin pin;
  ASSERT_TRUE(cache->Acquire(lazy_step.batch.rows, &pin).ok());
  const NonFiniteUpdate by_position =
      FindNonFinitePinnedPositions(o, -4.0f, lazy_step.plan, layout, pin, RoundingSpec(), Serial());
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
}  // namespace tiered_test
}  // namespace tf_embed_ops
