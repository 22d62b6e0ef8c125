#include "cc/lib/tiered_row_cache.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cc/lib/distinct_rows.h"
#include "cc/lib/prefetch.h"

namespace tf_embed_ops {

int64_t TieredRowCache::CapacityFor(int64_t cache_bytes, const TieredRowLayout& layout) {
  if (cache_bytes <= 0) return 0;
  return std::min({layout.num_rows, kMaxCapacity, cache_bytes / RowBytes(layout)});
}

TieredRowCache::TieredRowCache(std::unique_ptr<TieredRowFile> file, int64_t capacity, Options options)
    : file_(std::move(file)),
      capacity_(capacity),
      record_bytes_(file_->record_bytes()),
      slots_(new char[capacity * record_bytes_]),
      slot_row_(capacity, -1),
      pins_(capacity, 0),
      touched_(capacity, 0),
      dirty_(capacity, 0),
      loading_(capacity, 0),
      writing_(capacity, 0),
      history_(file_->layout().num_rows, 0) {
  free_.reserve(capacity);
  for (int64_t s = capacity - 1; s >= 0; --s) free_.push_back(static_cast<int32_t>(s));
  size_t size = 1;
  while (size < static_cast<size_t>(2 * capacity)) size <<= 1;
  index_.assign(size, kEmpty);
  index_mask_ = size - 1;
  stats_.capacity_rows = capacity;
  if (options.background_writeback) {
    staged_.reset(new char[std::min(capacity, kMaxBackgroundRows) * record_bytes_]);
    writer_ = std::thread([this] { WritebackLoop(); });
  }
}

TieredRowCache::~TieredRowCache() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  prefetch_wake_.notify_all();
  if (prefetcher_.joinable()) prefetcher_.join();  // after its prefetch in progress (a queued one is dropped)
  if (writer_.joinable()) writer_.join();
}

// ---------------------------------------------------------------------------------------------- index

size_t TieredRowCache::Home(int64_t row) const {
  // Fibonacci hashing: consecutive rows (the common case) spread over the table.
  return static_cast<size_t>((static_cast<uint64_t>(row) * 0x9e3779b97f4a7c15ULL) >> 20) & index_mask_;
}

int32_t TieredRowCache::Find(int64_t row) const {
  for (size_t i = Home(row);; i = (i + 1) & index_mask_) {
    const int32_t slot = index_[i];
    if (slot == kEmpty || slot_row_[slot] == row) return slot;
  }
}

void TieredRowCache::IndexInsert(int64_t row, int32_t slot) {
  size_t i = Home(row);
  while (index_[i] != kEmpty) i = (i + 1) & index_mask_;
  index_[i] = slot;
}

void TieredRowCache::PrefetchIndexAhead(const std::vector<int64_t>& rows, size_t i) const {
  // The index and the slot arrays are larger than the core's cache and the rows are random: fetch the index entry
  // of the row kIndexAhead on, and the slot state of the row kIndexAhead / 2 on (its entry fetched by then).
  if (i + kIndexAhead < rows.size()) {
    PrefetchLine(&index_[Home(rows[i + kIndexAhead])]);
    PrefetchLine(&history_[rows[i + kIndexAhead]]);
  }
  if (i + kIndexAhead / 2 < rows.size()) {
    const int32_t ahead = index_[Home(rows[i + kIndexAhead / 2])];
    if (ahead != kEmpty) {
      PrefetchLine(&slot_row_[ahead]);
      PrefetchLine(&pins_[ahead]);
    }
  }
}

void TieredRowCache::IndexErase(int64_t row) {
  size_t i = Home(row);
  while (slot_row_[index_[i]] != row) i = (i + 1) & index_mask_;
  // Backward-shift deletion (linear probing needs no tombstones): move later entries of the cluster into the hole
  // when the hole lies on their probe path.
  index_[i] = kEmpty;
  for (size_t j = (i + 1) & index_mask_; index_[j] != kEmpty; j = (j + 1) & index_mask_) {
    const size_t home = Home(slot_row_[index_[j]]);
    // Entry j may move to i when its home is not cyclically in (i, j].
    const bool home_in_gap = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (home_in_gap) continue;
    index_[i] = index_[j];
    index_[j] = kEmpty;
    i = j;
  }
}

// ---------------------------------------------------------------------------------------------- public

absl::Status TieredRowCache::TooManyRows(int64_t needed, const std::string& what) const {
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": needs ", needed, " distinct rows resident at once but the cache of table '", table(),
                   "' holds ", capacity_, " rows; use cache_bytes >= ", needed * RowBytes(layout()), " (",
                   RowBytes(layout()), " bytes per row), or smaller batches"));
}

absl::Status TieredRowCache::Acquire(std::vector<int64_t> rows, TieredPin* pin, bool read) {
  *pin = TieredPin();
  const int64_t n = static_cast<int64_t>(rows.size());
  if (n > capacity_) return TooManyRows(n, absl::StrCat("table '", table(), "'"));
  if (const absl::Status s = CheckRows(rows); !s.ok()) return s;
  std::unique_lock<std::mutex> lock(mu_);
  // One index probe per row: its slot (or kEmpty), and how many slots this call would newly pin.
  std::vector<int32_t> slots(n);
  std::vector<int64_t> misses;
  std::vector<size_t> miss_at;
  int64_t newly_pinned = 0;
  while (true) {
    misses.clear();
    miss_at.clear();
    newly_pinned = 0;
    bool loading = false;
    for (int64_t i = 0; i < n; ++i) {
      PrefetchIndexAhead(rows, static_cast<size_t>(i));
      const int32_t slot = Find(rows[i]);
      slots[i] = slot;
      if (slot == kEmpty) {
        misses.push_back(rows[i]);
        miss_at.push_back(static_cast<size_t>(i));
        ++newly_pinned;
      } else {
        loading = loading || loading_[slot];
        if (pins_[slot] == 0) ++newly_pinned;
      }
    }
    const bool too_many = pinned_slots_ + newly_pinned > capacity_;
    // A prefetch asked for before this call completes before this call reads anything (so the rows it brings are
    // hits, as if it had run synchronously); a row another call is loading is waited for; the pins of loads in
    // progress are transient, so they refuse nothing.
    if (PrefetchBusy() && (!misses.empty() || loading || too_many)) {
      WaitForPrefetchLocked(&lock);
      continue;
    }
    if (loading || (too_many && loading_slots_ > 0)) {
      const int64_t in_progress = loading_slots_;
      io_done_.wait(lock, [&] { return loading_slots_ < in_progress; });
      continue;
    }
    break;
  }
  // Refuse before changing anything when the rows and the rows other calls hold pinned do not fit together.
  if (pinned_slots_ + newly_pinned > capacity_) {
    return absl::InvalidArgumentError(absl::StrCat("table '", table(), "': needs ", n, " rows resident but ",
                                                   pinned_slots_, " of the cache's ", capacity_,
                                                   " rows are pinned by concurrent calls"));
  }
  ++calls_;
  for (int64_t i = 0; i < n; ++i) {  // (a new row's history starts again; Load stamps the misses)
    if (i + static_cast<int64_t>(kIndexAhead) < n) PrefetchLine(&history_[rows[i + kIndexAhead]]);
    const int32_t slot = slots[i];
    if (slot != kEmpty && pins_[slot]++ == 0) ++pinned_slots_;
    if (read) {
      Touch(rows[i], slot);
    } else {
      history_[rows[i]] = 0;
      if (slot != kEmpty) touched_[slot] = calls_;
    }
  }
  std::vector<int32_t> loaded;  // pinned by Load
  const int64_t num_misses = static_cast<int64_t>(misses.size());
  if (const absl::Status s = Load(&misses, &loaded, &lock, read, /*partial=*/false); !s.ok()) {
    for (int32_t slot : slots) {
      if (slot != kEmpty && --pins_[slot] == 0) --pinned_slots_;
    }
    return s;
  }
  for (size_t k = 0; k < loaded.size(); ++k) slots[miss_at[k]] = loaded[k];
  if (read) {
    stats_.hits += n - num_misses;
    stats_.misses += num_misses;
  }
  pin->records.resize(n);
  for (int64_t i = 0; i < n; ++i) pin->records[i] = Record(slots[i]);
  pin->rows = std::move(rows);
  pin->slots = std::move(slots);
  return absl::OkStatus();
}

void TieredRowCache::Release(TieredPin* pin, bool dirty) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int32_t slot : pin->slots) {
      if (dirty) dirty_[slot] = 1;
      if (--pins_[slot] == 0) --pinned_slots_;
    }
  }
  *pin = TieredPin();
}

absl::Status TieredRowCache::Prefetch(const std::vector<int64_t>& rows) {
  if (const absl::Status s = CheckRows(rows); !s.ok()) return s;
  std::unique_lock<std::mutex> lock(mu_);
  return PrefetchLocked(rows, &lock);
}

absl::Status TieredRowCache::PrefetchLocked(const std::vector<int64_t>& rows, std::unique_lock<std::mutex>* lock) {
  // The resident ones are pinned for the call so that loading the others does not evict them; rows another call
  // is loading are left to it.
  std::vector<int32_t> held;
  std::vector<int64_t> misses;
  const size_t n = rows.size();
  ++calls_;
  for (size_t i = 0; i < n; ++i) {
    const int64_t row = rows[i];
    PrefetchIndexAhead(rows, i);
    const int32_t slot = Find(row);
    Touch(row, slot);
    if (slot == kEmpty) {
      misses.push_back(row);
      continue;
    }
    if (loading_[slot]) continue;
    if (pins_[slot]++ == 0) ++pinned_slots_;
    held.push_back(slot);
  }
  const int64_t room = capacity_ - pinned_slots_;
  if (static_cast<int64_t>(misses.size()) > room) misses.resize(std::max<int64_t>(room, 0));
  std::vector<int32_t> loaded;
  const absl::Status s = Load(&misses, &loaded, lock, /*read=*/true, /*partial=*/true);
  for (int32_t slot : held) {
    if (--pins_[slot] == 0) --pinned_slots_;
  }
  for (int32_t slot : loaded) {
    if (--pins_[slot] == 0) --pinned_slots_;
  }
  return s;
}

absl::Status TieredRowCache::StartPrefetch(std::vector<int64_t> ids) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= num_rows()) {
      return absl::InvalidArgumentError(absl::StrCat("table '", table(), "': prefetch id ", ids[i], " at position ", i,
                                                     " is out of [0, ", num_rows(), ")"));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!prefetch_status_.ok()) {  // reported once, by the next prefetch; its rows were not made resident
    const absl::Status failed = std::move(prefetch_status_);
    prefetch_status_ = absl::OkStatus();
    return absl::Status(failed.code(), absl::StrCat("an earlier prefetch failed: ", failed.message()));
  }
  // A prefetch not started yet is replaced: its batch is the one being trained now.
  prefetch_rows_ = std::move(ids);
  prefetch_queued_ = true;
  if (!prefetcher_.joinable()) prefetcher_ = std::thread([this] { PrefetchLoop(); });
  prefetch_wake_.notify_one();
  return absl::OkStatus();
}

std::shared_ptr<const DistinctBatch> TieredRowCache::DistinctRows(std::vector<int64_t> ids) {
  {
    std::lock_guard<std::mutex> lock(memo_mu_);
    for (const DistinctMemo& m : memo_) {
      if (!m.ids.empty() && m.ids == ids) return m.batch;
    }
  }
  auto batch = std::make_shared<const DistinctBatch>(FindDistinctRows(ids, num_rows()));
  std::lock_guard<std::mutex> lock(memo_mu_);
  memo_[memo_next_] = DistinctMemo{std::move(ids), batch};
  memo_next_ = (memo_next_ + 1) % kDistinctMemo;
  return batch;
}

absl::Status TieredRowCache::WaitForPrefetch() {
  std::unique_lock<std::mutex> lock(mu_);
  WaitForPrefetchLocked(&lock);
  absl::Status s = std::move(prefetch_status_);
  prefetch_status_ = absl::OkStatus();
  return s;
}

absl::Status TieredRowCache::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  WaitForIoLocked(&lock);  // (TieredRowFile::Sync runs beside no read)
  std::vector<int32_t> dirty;
  for (int64_t s = 0; s < capacity_; ++s) {
    if (dirty_[s]) dirty.push_back(static_cast<int32_t>(s));
  }
  if (const absl::Status s = WriteBack(std::move(dirty)); !s.ok()) return s;
  return file_->Sync();
}

absl::Status TieredRowCache::Grow(int64_t num_rows) {
  std::unique_lock<std::mutex> lock(mu_);
  WaitForIoLocked(&lock);  // TieredRowFile::Grow must run beside no other transfer
  const absl::Status s = file_->Grow(num_rows);
  history_.resize(this->num_rows(), 0);
  return s;
}

absl::Status TieredRowCache::ReadRecords(int64_t first, int64_t n, char* out) {
  if (const absl::Status s = CheckRange(first, n); !s.ok()) return s;
  std::unique_lock<std::mutex> lock(mu_);
  io_done_.wait(lock, [this] { return loading_slots_ == 0; });  // a record being loaded holds no value yet
  std::vector<int64_t> cold;                                    // rows not resident, read from the file in runs
  for (int64_t i = 0; i < n; ++i) {
    const int32_t slot = Find(first + i);
    if (slot == kEmpty) {
      cold.push_back(first + i);
    } else {
      std::memcpy(out + i * record_bytes_, Record(slot), record_bytes_);
    }
  }
  std::vector<char*> records(cold.size());
  for (size_t i = 0; i < cold.size(); ++i) records[i] = out + (cold[i] - first) * record_bytes_;
  if (const absl::Status s = ReadRunsOf(cold, records); !s.ok()) return s;
  CountRead(static_cast<int64_t>(cold.size()));
  return absl::OkStatus();
}

absl::Status TieredRowCache::WriteRecords(int64_t first, int64_t n, char* records) {
  if (const absl::Status s = CheckRange(first, n); !s.ok()) return s;
  std::vector<char*> pointers(n);
  for (int64_t i = 0; i < n; ++i) pointers[i] = records + i * record_bytes_;
  std::unique_lock<std::mutex> lock(mu_);
  WaitForIoLocked(&lock);  // an older copy of a row must not land after this write, nor a load read half of it
  const absl::Status s = file_->WriteRecords(first, n, pointers.data());
  for (int64_t i = 0; i < n; ++i) {
    const int32_t slot = Find(first + i);
    if (slot == kEmpty) continue;
    if (s.ok()) {
      std::memcpy(Record(slot), pointers[i], record_bytes_);
      dirty_[slot] = 0;
    } else {
      dirty_[slot] = 1;  // the cache's (old) value wins over whatever part of the write reached the file
    }
  }
  if (!s.ok()) return s;
  stats_.rows_written += n;
  stats_.bytes_written += n * record_bytes_;
  // A bulk write (initialisation, a restore) leaves the page cache in large folios: see DropCachedRecords.
  if (n * record_bytes_ >= kBulkWriteBytes) return file_->DropCachedRecords(first, n);
  return absl::OkStatus();
}

TieredCacheStats TieredRowCache::stats() const {
  std::unique_lock<std::mutex> lock(mu_);
  // Counters that do not move behind the caller's back: a prefetch asked for, and the background write-back asked
  // for, are counted first.
  WaitForPrefetchLocked(&lock);
  WaitForWritebackLocked(&lock);
  TieredCacheStats out = stats_;
  out.resident_rows = capacity_ - static_cast<int64_t>(free_.size());
  out.capacity_rows = capacity_;
  out.pinned_rows = pinned_slots_;
  return out;
}

}  // namespace tf_embed_ops
