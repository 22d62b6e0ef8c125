#include "cc/lib/touched_rows.h"

#include <algorithm>
#include <limits>
#include <new>
#include <random>

namespace tf_embed_ops {

TouchedRows::TouchedRows(int64_t num_rows, int64_t max_evicted_log)
    : max_evicted_log_(std::max<int64_t>(2, max_evicted_log)) {
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
    for (int64_t c = static_cast<int64_t>(chunks_.size()); c < needed; ++c) {
      fresh.emplace_back(new uint32_t[kChunkMask + 1]());  // zero: unchanged since base_
    }
  } catch (const std::bad_alloc&) {
    return false;
  }
  for (auto& chunk : fresh) chunks_.push_back(std::move(chunk));
  return true;
}

void TouchedRows::Rebase() {
  // 2^32 - 1 updates since base_: forget the stamps; consumers older than now read full once.
  for (auto& chunk : chunks_) std::fill_n(chunk.get(), kChunkMask + 1, 0u);
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

void TouchedRows::LogEviction(int64_t key) {
  if (static_cast<int64_t>(evicted_.size()) >= max_evicted_log_) {
    const size_t drop = evicted_.size() / 2;
    log_floor_ = std::max(log_floor_, evicted_[drop - 1].first);
    // Entries at the floor's version that stay would be reported to no one (full covers them): drop them too.
    size_t end = drop;
    while (end < evicted_.size() && evicted_[end].first <= log_floor_) ++end;
    evicted_.erase(evicted_.begin(), evicted_.begin() + static_cast<std::ptrdiff_t>(end));
  }
  evicted_.emplace_back(version_, key);
}

TouchedRows::Changes TouchedRows::Since(int64_t since, int64_t num_rows) const {
  Changes c;
  c.version = version_;
  if (since < full_since_ || since < log_floor_ || since > version_) {
    // A version from before tracking, a restore, a rebase or a dropped log entry, or one this tracker never
    // gave out (another table's, a table re-created since): the consumer must take everything.
    c.full = true;
    return c;
  }
  if (since == version_) return c;
  const uint32_t after = static_cast<uint32_t>(since - base_);  // since >= full_since_ >= base_
  num_rows = std::min(num_rows, capacity());
  for (int64_t r = 0; r < num_rows; ++r) {
    if (chunks_[r >> kLog2RowsPerChunk][r & kChunkMask] > after) c.rows.push_back(r);
  }
  auto first = std::upper_bound(evicted_.begin(), evicted_.end(), since,
                                [](int64_t v, const std::pair<int64_t, int64_t>& e) { return v < e.first; });
  for (auto it = first; it != evicted_.end(); ++it) c.evicted.push_back(it->second);
  return c;
}

int64_t TouchedRows::MemoryBytes() const {
  return capacity() * static_cast<int64_t>(sizeof(uint32_t)) +
         static_cast<int64_t>(evicted_.capacity() * sizeof(std::pair<int64_t, int64_t>));
}

}  // namespace tf_embed_ops
