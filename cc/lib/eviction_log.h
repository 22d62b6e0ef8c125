// The one eviction record of a dynamic table (docs/dynamic_lifecycle.md, "Evicted keys"): every row a policy evicts,
// every key removed by EvictKeys and (when asked) every key refused admission, with the step, in one bounded
// log.  Each entry has a sequence number that only grows, so its readers each keep their own cursor and never
// reset each other: the user's evicted_keys() (a cursor per table object, TfEmbed>DynamicTableReadLog) and the
// touched-row tracker (touched_rows.h: a sequence per update that evicted, read for each consumer's version),
// through which the serving publisher's deltas and incremental checkpoints see evictions.
//
// Bounded: at most `capacity` entries (the table's eviction_log_capacity) are held; the oldest go first.  The
// overflow rule, the same for every reader: a reader whose cursor points at entries that are gone is never given
// the rest as if complete.  Read() reports `resync` (and how many it missed): evicted_keys() raises (strict) or
// skips on; the tracker reports `full` for a version whose evictions were dropped, and its consumer takes the whole
// table.  Restart() (a table import / restore) invalidates every cursor the same way.  Not thread-safe: the
// table's lock covers it.
#ifndef TF_EMBED_OPS_CC_LIB_EVICTION_LOG_H_
#define TF_EMBED_OPS_CC_LIB_EVICTION_LOG_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <vector>

namespace tf_embed_ops {

enum class LogKind : uint8_t {
  kEvicted = 0,  // removed by an eviction policy (end of step, or an explicit Evict)
  kErased = 1,   // removed by EvictKeys
  kRefused = 2,  // seen by a training lookup and given no row (logged only when the admission asks for it)
};

class EvictionLog {
 public:
  static constexpr int64_t kDefaultCapacity = int64_t{1} << 20;
  static constexpr int64_t kMaxCapacity = int64_t{1} << 32;

  explicit EvictionLog(int64_t capacity = kDefaultCapacity) : capacity_(capacity) {}

  int64_t capacity() const { return capacity_; }
  int64_t first_seq() const { return next_seq_ - static_cast<int64_t>(entries_.size()); }
  int64_t next_seq() const { return next_seq_; }
  int64_t size() const { return static_cast<int64_t>(entries_.size()); }
  // Entries ever dropped because the log was full (not counting Restart).
  int64_t overflowed() const { return overflowed_; }
  int64_t MemoryBytes() const { return size() * static_cast<int64_t>(sizeof(Entry)); }

  void Append(int64_t key, int64_t step, LogKind kind) {
    if (size() >= capacity_) {
      entries_.pop_front();
      ++overflowed_;
    }
    entries_.push_back(Entry{key, step, kind});
    ++next_seq_;
  }

  struct ReadResult {
    int64_t next_cursor = 0;  // the cursor of the next Read
    bool resync = false;      // entries this cursor wanted are gone: rebuild from the table's content
    int64_t dropped = 0;      // entries missed because the log was full (0 when only a restart made it stale)
  };

  // Appends the entries with sequence numbers in [max(cursor, first_seq), next_seq), at most `max_entries`
  // (< 0: all), to the vectors (any may be null).  A cursor beyond next_seq (one from before a restore) is a
  // resync that starts at first_seq.
  ReadResult Read(int64_t cursor, int64_t max_entries, std::vector<int64_t>* keys, std::vector<int64_t>* steps,
                  std::vector<LogKind>* kinds) const {
    ReadResult r;
    const int64_t first = first_seq();
    int64_t from = cursor;
    if (cursor < first || cursor > next_seq_) {
      r.resync = true;
      // Only entries lost to overflow since the latest restart count: those before it belong to replaced content.
      r.dropped = cursor < first ? first - std::max(cursor, restart_seq_) : 0;
      if (r.dropped < 0) r.dropped = 0;
      from = first;
    }
    int64_t count = next_seq_ - from;
    if (max_entries >= 0) count = std::min(count, max_entries);
    for (int64_t i = 0; i < count; ++i) {
      const Entry& e = entries_[from - first + i];
      if (keys != nullptr) keys->push_back(e.key);
      if (steps != nullptr) steps->push_back(e.step);
      if (kinds != nullptr) kinds->push_back(e.kind);
    }
    r.next_cursor = from + count;
    return r;
  }

  // Drops every entry and moves next_seq on by one, so every cursor in use (even one that had read everything)
  // is stale: its next Read reports resync.
  void Restart() {
    entries_.clear();
    ++next_seq_;
    restart_seq_ = next_seq_;
  }

 private:
  struct Entry {
    int64_t key;
    int64_t step;
    LogKind kind;
  };
  int64_t capacity_;
  int64_t next_seq_ = 0;
  int64_t restart_seq_ = 0;  // next_seq_ right after the latest Restart
  int64_t overflowed_ = 0;
  std::deque<Entry> entries_;
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_EVICTION_LOG_H_
