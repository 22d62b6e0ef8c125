// The cache's loading (tiered_row_cache.h): making rows resident (victims, write-back, reads in runs) and the
// background write-back and prefetch threads.
#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cc/lib/prefetch.h"
#include "cc/lib/tiered_row_cache.h"

namespace tf_embed_ops {
namespace {

// Runs of consecutive rows in `rows` (ascending): calls fn(begin, end) for each maximal run [begin, end) of
// indices into `rows`, stopping at the first error.
template <typename Fn>
absl::Status ForEachRun(const std::vector<int64_t>& rows, const Fn& fn) {
  size_t begin = 0;
  while (begin < rows.size()) {
    size_t end = begin + 1;
    while (end < rows.size() && rows[end] == rows[end - 1] + 1) ++end;
    const absl::Status s = fn(begin, end);
    if (!s.ok()) return s;
    begin = end;
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------------------------- loading

absl::Status TieredRowCache::CheckRows(const std::vector<int64_t>& rows) const {
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= num_rows() || (i > 0 && rows[i] <= rows[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat("table '", table(), "': row ", rows[i], " at position ", i,
                                                     " is out of [0, ", num_rows(), ") or not ascending"));
    }
  }
  return absl::OkStatus();
}

absl::Status TieredRowCache::CheckRange(int64_t first, int64_t n) const {
  if (first >= 0 && n >= 0 && first <= num_rows() - n) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("table '", table(), "': rows [", first, ", ", first + n, ") outside [0, ", num_rows(), ")"));
}

absl::Status TieredRowCache::WriteBack(std::vector<int32_t> slots) {
  slots.erase(std::remove_if(slots.begin(), slots.end(), [this](int32_t s) { return !dirty_[s]; }), slots.end());
  if (slots.empty()) return absl::OkStatus();
  // One append of all of them (TieredRowFile::WriteRows: a pwritev per segment it spans), in row order.
  std::sort(slots.begin(), slots.end(), [this](int32_t a, int32_t b) { return slot_row_[a] < slot_row_[b]; });
  const int64_t n = static_cast<int64_t>(slots.size());
  std::vector<int64_t> rows(n);
  std::vector<char*> records(n);
  for (int64_t i = 0; i < n; ++i) {
    rows[i] = slot_row_[slots[i]];
    records[i] = Record(slots[i]);
  }
  if (const absl::Status s = file_->WriteRows(rows.data(), n, records.data()); !s.ok()) return s;
  for (const int32_t slot : slots) dirty_[slot] = 0;
  stats_.rows_written += n;
  stats_.bytes_written += n * record_bytes_;
  return absl::OkStatus();
}

absl::Status TieredRowCache::ReadRunsOf(const std::vector<int64_t>& rows, const std::vector<char*>& records) const {
  std::vector<RecordRun> runs;
  (void)ForEachRun(rows, [&](size_t begin, size_t end) {
    runs.push_back(RecordRun{rows[begin], static_cast<int64_t>(end - begin), records.data() + begin});
    return absl::OkStatus();
  });
  return file_->ReadRuns(runs);
}

void TieredRowCache::CountRead(int64_t rows) {
  stats_.rows_read += rows;
  stats_.bytes_read += rows * record_bytes_;
}

void TieredRowCache::TakeVictims(size_t count, std::vector<int32_t>* victims) {
  // One sweep from the hand: the first candidate whose history is at most the threshold.  The threshold rises to
  // the lowest history passed over after kThresholdRun such rows, or after a whole sweep of the cache, so two
  // sweeps find a victim if a candidate exists; recent_too: rows touched by the last calls are candidates too.
  const int64_t limit = 2 * capacity_ + 256 * kThresholdRun + 1;
  auto sweep = [&](bool recent_too) {
    int passed = 0;
    int64_t since_raise = 0;
    uint8_t lowest = 0xff;
    bool any = false;  // a candidate was met (a whole sweep without one ends the search)
    for (int64_t tries = 0; tries < limit && (any || tries < capacity_); ++tries, ++since_raise) {
      const int32_t s = static_cast<int32_t>(hand_);
      hand_ = hand_ + 1 == capacity_ ? 0 : hand_ + 1;
      if (pins_[s] > 0 || slot_row_[s] < 0 || writing_[s] || (!recent_too && Recent(s))) continue;
      any = true;
      const uint8_t history = history_[slot_row_[s]];
      if (history <= threshold_) return s;
      lowest = std::min(lowest, history);
      if (++passed == kThresholdRun || since_raise >= capacity_) {
        threshold_ = lowest;
        if (history <= threshold_) return s;  // this row was the lowest
        passed = 0;
        since_raise = 0;
        lowest = 0xff;
      }
    }
    return kEmpty;
  };
  // Once a sweep found only recently touched rows, the rest of this call takes them too (rather than sweeping the
  // whole cache again for each victim).
  bool recent_too = false;
  while (count > 0) {
    int32_t victim = sweep(recent_too);
    if (victim == kEmpty && !recent_too) {
      recent_too = true;
      victim = sweep(true);
    }
    if (victim == kEmpty) return;
    pins_[victim] = 1;
    victims->push_back(victim);
    --count;
  }
}

void TieredRowCache::AgeHistory() {
  for (uint8_t& h : history_) h >>= 1;
  threshold_ >>= 1;
  history_touches_ = 0;
}

absl::Status TieredRowCache::Load(std::vector<int64_t>* misses, std::vector<int32_t>* out,
                                  std::unique_lock<std::mutex>* lock, bool read, bool partial) {
  out->clear();
  if (misses->empty()) return absl::OkStatus();
  // 1. Slots: free ones first, then CLOCK victims (unpinned; a chosen victim is pinned for the moment so the hand
  //    skips it).  Rows being written in the background, or loaded by another call, are not taken: wait for those
  //    transfers when only such rows are left.
  std::vector<int32_t> victims;
  // The threshold decays a little at every load (by an eighth, at least 1, down to 1: a resident row was touched
  // at least once since its history was last halved, mostly), so that it follows the histories down after a burst
  // raised it; passing kThresholdRun rows raises it again where needed.
  if (threshold_ > 1) threshold_ -= std::min<uint8_t>(threshold_ - 1, 1 + threshold_ / 8);
  const size_t from_free = std::min(misses->size(), free_.size());
  for (size_t i = 0; i < from_free; ++i) {
    out->push_back(free_.back());
    free_.pop_back();
  }
  TakeVictims(misses->size() - out->size(), &victims);
  while (out->size() + victims.size() < misses->size() && (writing_slots_ > 0 || loading_slots_ > 0)) {
    const int64_t writing = writing_slots_, loading = loading_slots_;
    io_done_.wait(*lock, [&] { return writing_slots_ < writing || loading_slots_ < loading; });
    TakeVictims(misses->size() - out->size() - victims.size(), &victims);
  }
  auto give_back = [&] {
    for (int32_t s : victims) pins_[s] = 0;
    for (int32_t s : *out) free_.push_back(s);
    out->clear();
  };
  if (out->size() + victims.size() < misses->size()) {
    if (!partial) {
      give_back();
      return absl::InternalError(absl::StrCat("table '", table(), "': no evictable row in the cache"));
    }
    misses->resize(out->size() + victims.size());  // a prefetch loads what fits
    if (misses->empty()) return absl::OkStatus();
  }
  // 2. Victims' dirty records reach the file before their slots are reused; a victim not written stays resident
  //    and dirty.
  absl::Status s = WriteBack(victims);
  if (!s.ok()) {
    give_back();
    return s;
  }
  const int64_t evicted = static_cast<int64_t>(victims.size());
  for (size_t i = 0; i < victims.size(); ++i) {
    // The index entries are random in an index larger than the core's cache: fetch the one kIndexAhead on.
    if (i + kIndexAhead < victims.size()) PrefetchLine(&index_[Home(slot_row_[victims[i + kIndexAhead]])]);
    const int32_t v = victims[i];
    IndexErase(slot_row_[v]);
    slot_row_[v] = -1;
    pins_[v] = 0;
    ++stats_.evictions;
    out->push_back(v);
  }
  victims.clear();
  // 3. The misses are resident from here on, pinned and marked loading (another call that needs one waits; a
  //    prefetch skips it), and read straight into their slots with mu_ RELEASED, so that a prefetch's reads run
  //    beside a step's calls: one batch of runs of consecutive rows (TieredRowFile::ReadRuns, which reads beside
  //    appends).
  const int64_t n = static_cast<int64_t>(misses->size());
  std::vector<char*> records(n);
  for (int64_t i = 0; i < n; ++i) {
    if (i + static_cast<int64_t>(kIndexAhead) < n) PrefetchLine(&index_[Home((*misses)[i + kIndexAhead])]);
    const int32_t slot = (*out)[i];
    slot_row_[slot] = (*misses)[i];
    IndexInsert((*misses)[i], slot);
    pins_[slot] = 1;
    touched_[slot] = calls_;
    dirty_[slot] = 0;
    records[i] = Record(slot);
  }
  pinned_slots_ += n;
  if (read) {  // read = false: see Acquire
    for (const int32_t slot : *out) loading_[slot] = 1;
    loading_slots_ += n;
    lock->unlock();
    s = ReadRunsOf(*misses, records);
    lock->lock();
    for (const int32_t slot : *out) loading_[slot] = 0;
    loading_slots_ -= n;
    io_done_.notify_all();
  }
  if (!s.ok()) {  // the victims are gone (they were clean or written): only residency changed
    for (int64_t i = 0; i < n; ++i) {
      const int32_t slot = (*out)[i];
      IndexErase((*misses)[i]);
      slot_row_[slot] = -1;
      pins_[slot] = 0;
      free_.push_back(slot);
    }
    pinned_slots_ -= n;
    out->clear();
    return s;
  }
  if (read) CountRead(n);
  if (evicted > 0 && writer_.joinable()) {  // the next call will evict about as many: clean them now
    writeback_wanted_ = std::min(evicted, kMaxBackgroundRows);
    wake_.notify_one();
  }
  return absl::OkStatus();
}

void TieredRowCache::WritebackLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<int32_t> picked;
  std::vector<int64_t> rows;
  std::vector<char*> records;
  std::vector<uint8_t> written;
  while (true) {
    wake_.wait(lock, [this] { return stop_ || writeback_wanted_ > 0; });
    if (stop_) return;
    const int64_t want = std::min({writeback_wanted_, kMaxBackgroundRows, capacity_});
    writeback_wanted_ = 0;
    // The next victims, in the order the hand meets them (at today's threshold); the dirty ones are copied
    // (no step changes an unpinned row, so each copy is one consistent record) and marked clean and in writing.
    picked.clear();
    int64_t seen = 0;
    for (int64_t i = 0, s = hand_; i < capacity_ && seen < want; ++i, s = s + 1 == capacity_ ? 0 : s + 1) {
      if (!Evictable(s)) continue;
      ++seen;
      if (dirty_[s]) picked.push_back(static_cast<int32_t>(s));
    }
    if (picked.empty()) {
      io_done_.notify_all();  // (idle again)
      continue;
    }
    std::sort(picked.begin(), picked.end(), [this](int32_t a, int32_t b) { return slot_row_[a] < slot_row_[b]; });
    const size_t n = picked.size();
    rows.resize(n);
    records.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const int32_t slot = picked[i];
      rows[i] = slot_row_[slot];
      records[i] = staged_.get() + static_cast<int64_t>(i) * record_bytes_;
      std::memcpy(records[i], Record(slot), record_bytes_);
      writing_[slot] = 1;
      dirty_[slot] = 0;
    }
    writing_slots_ += static_cast<int64_t>(n);
    lock.unlock();
    // One append of the whole batch; if it fails, every row of it is marked dirty again below (a row the append
    // did write is then written again: harmless).
    const bool ok = file_->WriteRows(rows.data(), static_cast<int64_t>(n), records.data()).ok();
    written.assign(n, ok ? 1 : 0);
    lock.lock();
    int64_t done = 0;
    for (size_t i = 0; i < n; ++i) {
      writing_[picked[i]] = 0;
      if (written[i]) {
        ++done;
      } else {
        dirty_[picked[i]] = 1;  // still resident (a row in writing is never evicted): its eviction writes it
      }
    }
    writing_slots_ -= static_cast<int64_t>(n);
    stats_.rows_written += done;
    stats_.bytes_written += done * record_bytes_;
    io_done_.notify_all();
  }
}

void TieredRowCache::WaitForWritebackLocked(std::unique_lock<std::mutex>* lock) const {
  io_done_.wait(*lock, [this] { return writing_slots_ == 0 && (writeback_wanted_ == 0 || stop_); });
}

void TieredRowCache::WaitForIoLocked(std::unique_lock<std::mutex>* lock) const {
  io_done_.wait(*lock,
                [this] { return loading_slots_ == 0 && writing_slots_ == 0 && (writeback_wanted_ == 0 || stop_); });
}

void TieredRowCache::WaitForPrefetchLocked(std::unique_lock<std::mutex>* lock) const {
  io_done_.wait(*lock, [this] { return !PrefetchBusy(); });
}

void TieredRowCache::WaitForWriteback() {
  std::unique_lock<std::mutex> lock(mu_);
  WaitForWritebackLocked(&lock);
}

void TieredRowCache::PrefetchLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    prefetch_wake_.wait(lock, [this] { return stop_ || prefetch_queued_; });
    if (stop_) return;
    std::vector<int64_t> rows = std::move(prefetch_rows_);
    prefetch_rows_.clear();
    prefetch_queued_ = false;
    prefetch_running_ = true;
    lock.unlock();  // the batch's distinct rows, off the step's thread and outside the lock
    const std::shared_ptr<const DistinctBatch> batch = DistinctRows(std::move(rows));
    lock.lock();
    const absl::Status s = PrefetchLocked(batch->rows, &lock);
    prefetch_running_ = false;
    if (!s.ok() && prefetch_status_.ok()) prefetch_status_ = s;
    io_done_.notify_all();
  }
}

}  // namespace tf_embed_ops
