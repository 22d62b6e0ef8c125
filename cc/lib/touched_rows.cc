#include "cc/lib/touched_rows.h"

#include <algorithm>
#include <limits>
#include <new>
#include <random>

namespace tf_embed_ops {

TouchedRows::TouchedRows(int64_t num_rows) {
  std::random_device seed;
  id_ = static_cast<int64_t>(((uint64_t{seed()} << 32) | seed()) >> 1);
  ok_ = Reserve(num_rows);
}

bool TouchedRows::Reserve(int64_t rows) {
  const int64_t needed = (rows + kChunkMask) >> kLog2RowsPerChunk;
  if (needed <= static_cast<int64_t>(chunks_.size())) return true;
  std::vector<std::unique_ptr<uint32_t[]>> fresh;
  try {
    chunks_.reserve(needed);
    pending_.reserve(static_cast<size_t>(needed) << (kLog2RowsPerChunk - 6));
    for (int64_t c = static_cast<int64_t>(chunks_.size()); c < needed; ++c) {
      fresh.emplace_back(new uint32_t[kChunkMask + 1]());  // zero: unchanged since base_
    }
  } catch (const std::bad_alloc&) {
    return false;
  }
  for (auto& chunk : fresh) chunks_.push_back(std::move(chunk));
  pending_.resize(static_cast<size_t>(needed) << (kLog2RowsPerChunk - 6), 0);  // reserved: cannot throw
  return true;
}

void TouchedRows::Rebase() {
  // 2^32 - 1 updates since base_: forget the stamps; consumers older than now read full once.
  // Pending marks are from updates up to now: every consumer either reads full or read after them.
  for (auto& chunk : chunks_) std::fill_n(chunk.get(), kChunkMask + 1, 0u);
  std::fill(pending_.begin(), pending_.end(), 0);
  base_ = version_;
  full_since_ = version_;
  stamp_ = 0;
}

int64_t TouchedRows::BeginUpdate() {
  if (version_ - base_ >= static_cast<int64_t>(std::numeric_limits<uint32_t>::max())) Rebase();
  ++version_;
  stamp_ = static_cast<uint32_t>(version_ - base_);
  return version_;
}

void TouchedRows::MarkEvictions(int64_t first_seq) {
  // Forget the marks whose first entry the log no longer holds (their consumers read full), then mark this update.
  const int64_t floor = log_ == nullptr ? first_seq : log_->first_seq();
  size_t gone = 0;
  while (gone < marks_.size() && marks_[gone].second < floor) lost_through_ = marks_[gone++].first;
  marks_.erase(marks_.begin(), marks_.begin() + static_cast<std::ptrdiff_t>(gone));
  if (marks_.empty() || marks_.back().first != version_) marks_.emplace_back(version_, first_seq);
}

void TouchedRows::StampPending() {
  for (size_t w = 0; w < pending_.size(); ++w) {
    for (uint64_t bits = pending_[w]; bits != 0; bits &= bits - 1) {
      const int64_t row = static_cast<int64_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(bits)));
      chunks_[row >> kLog2RowsPerChunk][row & kChunkMask] = stamp_;
    }
    pending_[w] = 0;
  }
}

TouchedRows::Changes TouchedRows::Since(int64_t since, int64_t num_rows) {
  StampPending();
  Changes c;
  c.version = version_;
  // The first update after `since` that evicted rows: its entries (and every later one) are the evicted keys.
  auto mark = std::upper_bound(marks_.begin(), marks_.end(), since,
                               [](int64_t v, const std::pair<int64_t, int64_t>& m) { return v < m.first; });
  const bool lost =
      since < lost_through_ || (mark != marks_.end() && log_ != nullptr && mark->second < log_->first_seq());
  if (since < full_since_ || lost || since > version_) {
    // A version from before tracking, a restore or a rebase, one whose evictions the eviction log has dropped
    // (its bound), or one this tracker never gave out (another table's, a table re-created since): the consumer
    // must take everything.
    c.full = true;
    return c;
  }
  if (since == version_) return c;
  const uint32_t after = static_cast<uint32_t>(since - base_);  // since >= full_since_ >= base_
  num_rows = std::min(num_rows, capacity());
  for (int64_t r = 0; r < num_rows; ++r) {
    if (chunks_[r >> kLog2RowsPerChunk][r & kChunkMask] > after) c.rows.push_back(r);
  }
  if (mark != marks_.end() && log_ != nullptr) {
    std::vector<int64_t> keys;
    std::vector<LogKind> kinds;
    log_->Read(mark->second, -1, &keys, nullptr, &kinds);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (kinds[i] != LogKind::kRefused) c.evicted.push_back(keys[i]);  // refusals are not removals
    }
  }
  return c;
}

int64_t TouchedRows::MemoryBytes() const {
  return capacity() * static_cast<int64_t>(sizeof(uint32_t)) +
         static_cast<int64_t>(pending_.capacity() * sizeof(uint64_t)) +
         static_cast<int64_t>(marks_.capacity() * sizeof(std::pair<int64_t, int64_t>));
}

}  // namespace tf_embed_ops
