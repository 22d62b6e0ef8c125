// Touched-row tracking (docs/tracking.md): which rows of one table changed since a version, for consumers that
// each keep their own version (the serving publisher's deltas, incremental checkpoints) and never reset each
// other.  TensorFlow-free; the kernels call it under the table's exclusive lock (or their own mutex).
//
//   * version(): a 64-bit counter; BeginUpdate() advances it, and every row marked until the next BeginUpdate
//     carries the new version.  A consumer remembers the version it last read and asks Since(that version).
//   * A row's version is kept as a uint32 stamp relative to base_ (4 bytes per row).  Before the stamps would
//     overflow (2^32 - 1 updates after base_), every stamp is cleared and the tracker reports "everything
//     changed" once to older cursors: rare, and never silently wrong.
//   * Mark() sets the row's bit in a pending bitmap (1 bit per row: 128 KiB for 1M rows, which stays in the
//     caches, where a stamp is a miss of its own in a 4 MiB array).  A read (Since, CurrentVersion) first stamps
//     every pending row with the current version and clears the bitmap.  That is exact: every version a consumer
//     holds was current at a read, so the pending rows changed after all of them.
//   * MarkAll() (a restore, an import, non-lazy Adam's every-row update) costs O(1): Since() reports full for
//     any older version, and the consumer takes the whole table.
//   * Evicted keys (dynamic tables) are not kept here: the tracker reads the table's one eviction record
//     (eviction_log.h, attached by AttachEvictionLog) from where each eviction round's update began
//     (MarkEvictions).  Its bound is the log's: a consumer whose evictions the log has dropped reads full.
//   * Mark() is not thread-safe (two rows share a bitmap word): mark after a sharded walk, from one thread.
#ifndef TF_EMBED_OPS_CC_LIB_TOUCHED_ROWS_H_
#define TF_EMBED_OPS_CC_LIB_TOUCHED_ROWS_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "cc/lib/eviction_log.h"

namespace tf_embed_ops {

class TouchedRows {
 public:
  static constexpr int kLog2RowsPerChunk = 16;

  // What changed after a version.  full: treat every row as changed (rows and evicted are then empty).
  struct Changes {
    int64_t version = 0;  // the version the consumer should remember
    bool full = false;
    std::vector<int64_t> rows;     // ascending row indices
    std::vector<int64_t> evicted;  // keys in eviction order (may repeat; the caller filters live keys)
  };

  // `num_rows` rows allocated now (false from ok() on allocation failure).  A new tracker starts at version 1
  // with everything changed, so the version a consumer holds from before (0, or any older number) reads full.
  explicit TouchedRows(int64_t num_rows);

  bool ok() const { return ok_; }
  // A random number fixed at construction: a version is only meaningful to the tracker that gave it out, so a
  // consumer presents both (a table re-created since, or another table, reads full).
  int64_t id() const { return id_; }
  int64_t capacity() const { return static_cast<int64_t>(chunks_.size()) << kLog2RowsPerChunk; }
  int64_t version() const { return version_; }
  // The version a consumer that takes the whole table now should remember: version() once every pending mark
  // is stamped (so that the next Since reports exactly the rows changed after it).
  int64_t CurrentVersion() {
    StampPending();
    return version_;
  }

  // Makes rows [0, rows) markable (new rows read as unchanged).  False (keeping what it had) on allocation
  // failure.
  bool Reserve(int64_t rows);

  // Starts an update; returns its version.
  int64_t BeginUpdate();
  // Marks `row` (< capacity()) as changed by the current update.
  void Mark(int64_t row) { pending_[static_cast<uint64_t>(row) >> 6] |= uint64_t{1} << (row & 63); }
  void MarkRows(const int64_t* rows, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      if (rows[i] >= 0) Mark(rows[i]);
    }
  }
  // Every row changed in the current update (call after BeginUpdate).
  void MarkAll() { full_since_ = version_; }
  // The eviction record this tracker reports evicted keys from (the owning dynamic table's; it outlives the
  // tracker).  Without one (static tables) Since() reports no evicted keys.
  void AttachEvictionLog(const EvictionLog* log) { log_ = log; }
  // The current update evicts rows: their entries start at sequence `first_seq` of the attached log.
  void MarkEvictions(int64_t first_seq);

  // Changes after `since`, over rows [0, num_rows) (num_rows <= capacity()).  Stamps the pending marks first.
  Changes Since(int64_t since, int64_t num_rows);

  int64_t MemoryBytes() const;

 private:
  static constexpr int64_t kChunkMask = (int64_t{1} << kLog2RowsPerChunk) - 1;
  void Rebase();
  // Gives every pending row the current stamp and clears the bitmap.
  void StampPending();

  bool ok_ = true;
  int64_t id_;
  std::vector<std::unique_ptr<uint32_t[]>> chunks_;
  std::vector<uint64_t> pending_;  // a bit per row of capacity(): marked since the last read
  int64_t version_ = 1;
  int64_t base_ = 1;        // stamps are version - base_; 0 = unchanged since base_
  uint32_t stamp_ = 0;      // version_ - base_
  int64_t full_since_ = 1;  // Since(v) with v < full_since_ is full
  const EvictionLog* log_ = nullptr;
  // (version, first log sequence) of each update that evicted rows, versions increasing; marks whose first entry
  // the log has dropped are forgotten, and Since(v) with v < lost_through_ is full (it would miss evictions).
  std::vector<std::pair<int64_t, int64_t>> marks_;
  int64_t lost_through_ = 0;
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_TOUCHED_ROWS_H_
