// The DRAM tier of a tiered table (docs/tiered_tables.md): a fixed number of resident records (`capacity`
// rows of a TieredRowFile's records), an open-addressing index row -> slot, frequency-aware CLOCK replacement
// (below), a dirty bit per slot (dirty rows are written back on eviction and on Flush) and a pin count per slot
// (pinned rows are never evicted).
//
// Replacement: every row of the table (resident or not) has an access history, a saturating byte counting the
// calls that touched it (Acquire with read, Prefetch), halved for every row each kHistoryWindow * capacity touches
// so that it follows a drifting distribution.  A hand sweeps the slots as CLOCK's does and evicts a row only when
// its history is at most a threshold; the threshold rises to the lowest history of the rows the hand passed over
// when it passes kThresholdRun in a row (or sweeps the whole cache), and decays at every load.  Rows touched by one of
// the last kRecentCalls calls are passed over while others can be had: the current batch's rows survive the next
// batch's prefetch between the step's lookup and its update.  Recommender ids are skewed and mostly independent: most
// misses are rows of the long tail, seen once in a long while, which plain CLOCK keeps for a whole sweep of the
// hand in place of hot rows it then reads again; with the history the hand evicts the tail first, as LFU would,
// so a cache of a tenth of W1's rows serves about 0.88 of its ids (the hottest tenth's share of the accesses) where
// CLOCK served 0.83.
//
// Background write-back (Options::background_writeback): a thread of the cache writes dirty rows back ahead of
// the hand (the rows it evicts next), from copies taken under the mutex, so that the
// rows a step evicts are mostly clean and its misses wait only for their reads.  A row being written that way is
// not evicted until its write is done (a miss of it must not read the file first); a failed write leaves it dirty
// (the call that evicts it writes it, and reports the error).  Flush and WriteRecords wait for those writes.
//
// Thread safety: every member takes the cache's one mutex, and holds it for its whole call except while a miss's
// record is read: the misses are then resident, pinned and marked loading (a call that needs one of them waits
// for it), so reads run beside the other calls.  Callers serialise what the cache cannot know about: no
// Release(dirty) may race a reader of the same rows, and WriteRecords / Flush must not run while pinned rows are
// being updated (the kernels hold the table's reader/writer lock for that).
//
// Asynchronous prefetch (StartPrefetch): a thread of the cache makes the next batch's rows resident while the
// caller goes on (as FBGEMM's SSD tables read the next batch's rows beside the current step).  An Acquire that
// has rows to read waits for a prefetch asked for before it, so what a prefetch brings is a hit, as if it had run
// synchronously; an Acquire whose rows are all resident does not wait.  A failed prefetch leaves its rows not
// resident (the call that needs them reads them and reports the error) and is reported by the next StartPrefetch.
//
// Faults: an I/O error or a CRC mismatch is returned as a Status naming the table, the row and the path, and the
// cache stays consistent: a victim that could not be written back stays resident and dirty, rows that could not
// be read are not made resident, and a failed Acquire pins nothing (only which rows are resident changed).
#ifndef TF_EMBED_OPS_CC_LIB_TIERED_ROW_CACHE_H_
#define TF_EMBED_OPS_CC_LIB_TIERED_ROW_CACHE_H_

#include <array>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "cc/lib/distinct_rows.h"
#include "cc/lib/tiered_row_file.h"

namespace tf_embed_ops {

// Cumulative counters (TfEmbed>TieredTableStats returns them in this order).  hits / misses count the rows of
// Acquire calls found resident / read from the file then; rows a Prefetch read are counted in rows_read only (a
// step they serve counts hits).  resident_rows, capacity_rows and pinned_rows are the state now.
struct TieredCacheStats {
  static constexpr int kNumFields = 10;
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t rows_read = 0;
  int64_t rows_written = 0;
  int64_t bytes_read = 0;
  int64_t bytes_written = 0;
  int64_t evictions = 0;
  int64_t resident_rows = 0;
  int64_t capacity_rows = 0;
  int64_t pinned_rows = 0;

  std::array<int64_t, kNumFields> AsArray() const {
    return {hits,          misses,    rows_read,     rows_written,  bytes_read,
            bytes_written, evictions, resident_rows, capacity_rows, pinned_rows};
  }
};

// The rows one Acquire pinned: records[i] is the resident record of rows[i] (layout().record_bytes() bytes; its
// CRC field is unspecified), valid until Release.
struct TieredPin {
  std::vector<int64_t> rows;  // ascending, distinct
  std::vector<int32_t> slots;
  std::vector<char*> records;
};

class TieredRowCache {
 public:
  // Memory per cached row beyond its record: the slot's row id, pin count, touch stamp and dirty bytes, its free-list
  // entry, and up to four index entries (the index is a power of two at least twice the capacity).
  static constexpr int64_t kSlotOverheadBytes = 8 + 4 + 2 + 4 + 4 * 4;
  static constexpr int64_t kMaxCapacity = int64_t{1} << 30;

  // DRAM one cached row takes.
  static int64_t RowBytes(const TieredRowLayout& layout) { return layout.record_bytes() + kSlotOverheadBytes; }
  // The rows `cache_bytes` holds: min(num_rows, kMaxCapacity, cache_bytes / RowBytes) (0: not one row).
  static int64_t CapacityFor(int64_t cache_bytes, const TieredRowLayout& layout);

  struct Options {
    // Dirty rows are written back by a thread of the cache ahead of their eviction (see above).
    bool background_writeback = false;
  };
  // The most rows one background write-back batch copies (its buffer: this many records).
  static constexpr int64_t kMaxBackgroundRows = 4096;
  static constexpr int64_t kBulkWriteBytes = int64_t{1} << 20;

  // `capacity` in [1, kMaxCapacity]; the slot array is allocated here.
  TieredRowCache(std::unique_ptr<TieredRowFile> file, int64_t capacity)
      : TieredRowCache(std::move(file), capacity, {}) {}
  TieredRowCache(std::unique_ptr<TieredRowFile> file, int64_t capacity, Options options);
  // Stops the write-back and prefetch threads (after their batch in progress; a queued prefetch is dropped); dirty
  // rows are NOT written: Flush first.
  ~TieredRowCache();
  TieredRowCache(const TieredRowCache&) = delete;
  TieredRowCache& operator=(const TieredRowCache&) = delete;

  // Makes `rows` (ascending, distinct, in [0, num_rows)) resident and pinned (see the protocol above).  Errors:
  // InvalidArgument when they are more than the capacity (TooManyRows) or than what other pins leave free, or
  // not ascending/in range; the file's errors.  On an error nothing is pinned and `pin` is empty.
  // read = false: rows about to be written whole (a dynamic table's new rows) are made resident WITHOUT reading
  // the file; the records of those that were not resident hold unspecified bytes, and the caller must write every
  // pinned record whole before releasing them dirty.  Such a call counts neither hits nor misses, and the rows'
  // access histories start again from zero (a new row).
  absl::Status Acquire(std::vector<int64_t> rows, TieredPin* pin, bool read = true);
  // Unpins; `dirty`: the records were changed and must reach the file before they are dropped.  Empties `pin`.
  void Release(TieredPin* pin, bool dirty);

  // Makes as many of `rows` (ascending, distinct, in range) resident as the unpinned slots allow, without
  // pinning them.  Rows already resident are marked recently used.
  absl::Status Prefetch(const std::vector<int64_t>& rows);
  // The same on the cache's prefetch thread (see the protocol above) for a batch's `ids` (any order, repeats
  // allowed): checks that they are rows, queues them (replacing a queued prefetch that has not started) and
  // returns; the thread finds their distinct rows.  Errors: InvalidArgument for an id outside [0, num_rows); the
  // error of an earlier asynchronous prefetch, once (nothing is queued then).
  absl::Status StartPrefetch(std::vector<int64_t> ids);
  // Until no asynchronous prefetch is queued or running; returns (and clears) the error of one that failed.
  absl::Status WaitForPrefetch();
  // The distinct rows of a batch's `ids` (each in [0, num_rows): the caller checked them), ascending, and each
  // id's position among them (FindDistinctRows).  The last kDistinctMemo batches' are remembered and compared id
  // by id (a hit is exact), so that one batch's prefetch, lookup and update find them once.
  std::shared_ptr<const DistinctBatch> DistinctRows(std::vector<int64_t> ids);
  static constexpr int kDistinctMemo = 2;

  // Writes every dirty row back, then fsyncs the file.  On an error the rows not written stay dirty.
  absl::Status Flush();
  // Makes the file hold at least `num_rows` records (TieredRowFile::Grow): a dynamic table's rows grow.  The
  // caller serialises it with every call that names rows (Acquire checks rows against num_rows() first).
  absl::Status Grow(int64_t num_rows);

  // Records [first, first + n) into out (n * record_bytes, contiguous), the resident ones from the cache (dirty
  // rows included), the others from the file; the cache is not filled.  CRC fields of the output are unspecified.
  absl::Status ReadRecords(int64_t first, int64_t n, char* out);
  // Writes records [first, first + n) (contiguous, payloads encoded by the caller; their CRCs are stamped here)
  // to the file, and to the cache for rows resident there (which become clean).  A write of at least
  // kBulkWriteBytes is then synced and dropped from the page cache (TieredRowFile::DropCachedRecords).  On an error
  // each row of the range holds its old or its new value, and resident rows keep what the cache holds (marked dirty).
  absl::Status WriteRecords(int64_t first, int64_t n, char* records);
  // Waits until the background write-back asked for so far is done (tests; Flush and WriteRecords do it).
  void WaitForWriteback();

  // (Waits for a prefetch and a background write-back in progress, so that the counters include them.)
  TieredCacheStats stats() const;
  const TieredRowLayout& layout() const { return file_->layout(); }
  const std::string& table() const { return file_->table(); }
  const std::string& path() const { return file_->path(); }
  int64_t capacity() const { return capacity_; }
  int64_t num_rows() const { return file_->layout().num_rows; }
  int64_t record_bytes() const { return record_bytes_; }
  const TieredRowFile& file() const { return *file_; }
  // DRAM beside the cache's budget: the row file's location map and cleaning state (TieredRowFile::DramBytes) and
  // the replacement's history (a byte per row).
  int64_t dram_bytes_beside_budget() const { return file_->DramBytes() + num_rows(); }
  TieredLogStats log_stats() const { return file_->log_stats(); }

  // The error for a call that needs `needed` resident rows when the cache holds capacity() (names the table,
  // both counts and the cache_bytes that would do).
  absl::Status TooManyRows(int64_t needed, const std::string& what) const;

 private:
  static constexpr int32_t kEmpty = -1;

  char* Record(int32_t slot) const { return slots_.get() + static_cast<int64_t>(slot) * record_bytes_; }
  size_t Home(int64_t row) const;
  int32_t Find(int64_t row) const;  // the slot of a resident row, or kEmpty
  // Before Find(rows[i]) in a loop over `rows`: fetches the index entries and slot states of the rows ahead.
  static constexpr size_t kIndexAhead = 16;
  void PrefetchIndexAhead(const std::vector<int64_t>& rows, size_t i) const;
  void IndexInsert(int64_t row, int32_t slot);
  void IndexErase(int64_t row);
  absl::Status CheckRows(const std::vector<int64_t>& rows) const;
  absl::Status CheckRange(int64_t first, int64_t n) const;
  // Makes `misses` (ascending, not resident) resident (pinned once each, touched) in slots it returns in `out`;
  // the caller has checked that free plus evictable slots suffice (`lock` holds mu_; it is released to wait for
  // background writes and other loads, and while the misses are read).  partial: load only as many as the slots
  // that can be had (`misses` is shortened).  On an error no miss is resident.  read = false: the misses' records
  // are not read (see Acquire).
  absl::Status Load(std::vector<int64_t>* misses, std::vector<int32_t>* out, std::unique_lock<std::mutex>* lock,
                    bool read, bool partial);
  // Prefetch with mu_ held (`lock`; released while reading).
  absl::Status PrefetchLocked(const std::vector<int64_t>& rows, std::unique_lock<std::mutex>* lock);
  // The prefetch thread: runs the queued prefetch.
  void PrefetchLoop();
  bool PrefetchBusy() const { return prefetch_queued_ || prefetch_running_; }
  void WaitForPrefetchLocked(std::unique_lock<std::mutex>* lock) const;
  // Up to `count` victims (unpinned, not being written back, history at most the threshold, not touched recently
  // while others can be had: see Replacement above), each pinned for the moment so the hand skips it; appended to
  // `victims`.
  void TakeVictims(size_t count, std::vector<int32_t>* victims);
  // Slot `s` was touched by one of the last kRecentCalls calls.
  bool Recent(int64_t s) const { return static_cast<uint8_t>(calls_ - touched_[s]) < kRecentCalls; }
  // Whether the hand would evict slot `s` now (at today's threshold).
  bool Evictable(int64_t s) const {
    return slot_row_[s] >= 0 && pins_[s] == 0 && !writing_[s] && !Recent(s) && history_[slot_row_[s]] <= threshold_;
  }
  // The row of slot `s` touched by this call: its history (and the window's halving when it is due), its stamp.
  void Touch(int64_t row, int32_t s) {
    if (history_[row] != 0xff) ++history_[row];
    if (++history_touches_ >= kHistoryWindow * capacity_) AgeHistory();
    if (s != kEmpty) touched_[s] = calls_;
  }
  void AgeHistory();
  // The background write-back thread, and what wakes it: after a call evicted rows, the next as many victims.
  void WritebackLoop();
  // Until the thread has done what was asked of it (no batch pending or in progress).
  void WaitForWritebackLocked(std::unique_lock<std::mutex>* lock) const;
  // Until no transfer runs outside mu_ (loads, background writes) and none is asked for.
  void WaitForIoLocked(std::unique_lock<std::mutex>* lock) const;
  // Reads `rows` (ascending, distinct) into records[i] as one batch of runs of consecutive rows (no counters: it
  // may run without mu_); CountRead counts them.
  absl::Status ReadRunsOf(const std::vector<int64_t>& rows, const std::vector<char*>& records) const;
  void CountRead(int64_t rows);
  // Writes the dirty records of `slots` (any order) back as one append (TieredRowFile::WriteRows); clears their
  // dirty bits when it succeeded (on an error every one stays dirty).
  absl::Status WriteBack(std::vector<int32_t> slots);

  const std::unique_ptr<TieredRowFile> file_;
  const int64_t capacity_;
  const int64_t record_bytes_;
  mutable std::mutex mu_;
  std::unique_ptr<char[]> slots_;  // capacity_ records
  std::vector<int64_t> slot_row_;  // -1: free
  std::vector<int32_t> pins_;
  std::vector<uint8_t> touched_;  // per slot: the call that last touched it (calls_ then, modulo 256)
  std::vector<uint8_t> dirty_;
  std::vector<int32_t> free_;   // free slots (a stack)
  std::vector<int32_t> index_;  // open addressing, linear probing; slot or kEmpty
  size_t index_mask_ = 0;
  int64_t hand_ = 0;  // CLOCK
  // Replacement (see above): a byte of history per row of the table, the touches since the last halving, the
  // hand's threshold, and the calls that touch rows, counted modulo 256.
  static constexpr int64_t kHistoryWindow = 32;
  static constexpr int kThresholdRun = 16;
  static constexpr uint8_t kRecentCalls = 2;
  std::vector<uint8_t> history_;
  int64_t history_touches_ = 0;
  uint8_t threshold_ = 1;
  uint8_t calls_ = 0;
  int64_t pinned_slots_ = 0;  // slots with pins_ > 0
  TieredCacheStats stats_;    // counters only; the state fields are filled by stats()

  std::vector<uint8_t> loading_;  // per slot: its record is being read by Load with mu_ released
  int64_t loading_slots_ = 0;     // slots with loading_ set
  // Transfers outside mu_ finished (loads, a background write-back batch, a prefetch): waiters re-check.
  mutable std::condition_variable io_done_;

  // Background write-back (all under mu_ but the buffer, which only the thread touches while it writes).
  std::vector<uint8_t> writing_;  // per slot: a copy of its record is being written by the thread
  int64_t writing_slots_ = 0;     // slots with writing_ set
  int64_t writeback_wanted_ = 0;  // victims the next batch should clean
  bool stop_ = false;
  std::condition_variable wake_;    // the write-back thread: work or stop
  std::unique_ptr<char[]> staged_;  // kMaxBackgroundRows records

  // Asynchronous prefetch (under mu_).
  std::vector<int64_t> prefetch_rows_;  // the queued prefetch's ids
  bool prefetch_queued_ = false;
  bool prefetch_running_ = false;
  absl::Status prefetch_status_;  // the first error of an asynchronous prefetch not reported yet
  std::condition_variable prefetch_wake_;

  // DistinctRows' memo (its own mutex: a step's lookup does not wait for the cache's calls to compare ids).
  struct DistinctMemo {
    std::vector<int64_t> ids;
    std::shared_ptr<const DistinctBatch> batch;
  };
  std::mutex memo_mu_;
  std::array<DistinctMemo, kDistinctMemo> memo_;
  int memo_next_ = 0;  // the entry the next miss replaces

  // Threads last: started when the rest is built (the prefetch thread on the first StartPrefetch).
  std::thread writer_;
  std::thread prefetcher_;
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_TIERED_ROW_CACHE_H_
