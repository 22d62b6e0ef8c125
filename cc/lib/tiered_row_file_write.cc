// The row file's writes (tiered_row_file.h): the log's appends, segment cleaning, growth, sync.
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cc/lib/tiered_row_file.h"
#include "cc/lib/tiered_row_file_internal.h"

namespace tf_embed_ops {

absl::Status TieredRowFile::WriteRecords(int64_t first, int64_t n, char* const* records) {
  if (first < 0 || n < 0 || first > layout_.num_rows - n) {
    return absl::InvalidArgumentError(
        absl::StrCat(What(), ": ", Rows(first, n), " outside [0, ", layout_.num_rows, ")"));
  }
  std::vector<int64_t> rows(n);
  for (int64_t i = 0; i < n; ++i) rows[i] = first + i;
  return WriteRows(rows.data(), n, records);
}

absl::Status TieredRowFile::WriteRows(const int64_t* rows, int64_t n, char* const* records) {
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] < 0 || rows[i] >= layout_.num_rows) {
      return absl::InvalidArgumentError(
          absl::StrCat(What(), ": row ", rows[i], " at position ", i, " outside [0, ", layout_.num_rows, ")"));
    }
  }
  if (n == 0) return absl::OkStatus();
  for (int64_t i = 0; i < n; ++i) StampRecord(layout_, records[i]);
  std::lock_guard<std::mutex> lock(append_mu_);
  RETURN_IF_ERROR_(MarkWritingLocked());
  return AppendLocked(rows, n, records);
}

absl::Status TieredRowFile::MarkWritingLocked() {
  if (!clean_) return absl::OkStatus();
  // Before any record moves, the header stops vouching for the map on the device (a crash now leaves a file that
  // Open refuses, never one whose map points at another row's record).
  RETURN_IF_ERROR_(WriteHeader(kStateWriting, generation_));
  RETURN_IF_ERROR_(FsyncLocked());
  clean_ = false;
  return absl::OkStatus();
}

absl::Status TieredRowFile::EnsureRoomLocked() {
  while (current_ < 0 || next_slot_ == (current_ + 1) * segment_slots_) {
    // One free segment is kept for cleaning: cleaning appends a segment's live records before it frees it.
    if (free_segments_.size() >= 2 || (cleaning_ && !free_segments_.empty())) {
      current_ = free_segments_.back();
      free_segments_.pop_back();
      is_free_[current_] = 0;
      next_slot_ = current_ * segment_slots_;
      return absl::OkStatus();
    }
    if (cleaning_) {
      return absl::InternalError(absl::StrCat(What(), ": no free segment left for cleaning"));
    }
    RETURN_IF_ERROR_(CleanOneLocked());
  }
  return absl::OkStatus();
}

absl::Status TieredRowFile::CleanOneLocked() {
  // Greedy: the segment with the fewest live records frees the most slots per record moved.
  int64_t victim = -1;
  for (int64_t g = 0; g < static_cast<int64_t>(live_.size()); ++g) {
    if (g == current_ || is_free_[g]) continue;
    if (victim < 0 || live_[g] < live_[victim]) victim = g;
  }
  if (victim < 0 || live_[victim] >= segment_slots_) {
    return absl::InternalError(absl::StrCat(What(), ": no segment to clean (every slot is live)"));
  }
  if (live_[victim] > 0) {
    if (!clean_buffer_) clean_buffer_.reset(new char[segment_slots_ * record_bytes_]);
    // The live records only, a run of consecutive live slots per read, where they are few runs (the greedy victim
    // of skewed write-backs is mostly dead); else the whole segment in one read.
    const int64_t first_slot = victim * segment_slots_;
    std::vector<std::pair<int64_t, int64_t>> runs;  // [begin, end) slots within the segment
    for (int64_t s = 0; s < segment_slots_; ++s) {
      if (owner_[first_slot + s] == kNoSlot) continue;
      if (!runs.empty() && runs.back().second == s) {
        ++runs.back().second;
      } else {
        runs.emplace_back(s, s + 1);
      }
    }
    if (runs.size() > 64) runs.assign(1, {0, segment_slots_});
    for (const auto& [begin, end] : runs) {
      struct iovec iov = {clean_buffer_.get() + begin * record_bytes_,
                          static_cast<size_t>((end - begin) * record_bytes_)};
      RETURN_IF_ERROR_(Transfer(/*write=*/false, &iov, 1, kHeaderBytes + (first_slot + begin) * record_bytes_, [&] {
        return absl::StrCat("the records of slots [", first_slot + begin, ", ", first_slot + end, ") to clean");
      }));
    }
    std::vector<int64_t> rows;
    std::vector<char*> records;
    for (int64_t s = 0; s < segment_slots_; ++s) {
      const uint32_t row = owner_[first_slot + s];
      if (row == kNoSlot) continue;
      rows.push_back(row);
      records.push_back(clean_buffer_.get() + s * record_bytes_);
    }
    // The records move as they are (CRC included: a corrupted record stays detectably corrupted).
    cleaning_ = true;
    const absl::Status s = AppendLocked(rows.data(), static_cast<int64_t>(rows.size()), records.data());
    cleaning_ = false;
    RETURN_IF_ERROR_(s);
    ++log_stats_.segments_cleaned;
    log_stats_.records_moved += static_cast<int64_t>(rows.size());
  }
  // Every record of the victim now lives elsewhere (published under the exclusive lock, after which no reader
  // can still be reading the victim): its slots may be written.
  is_free_[victim] = 1;
  free_segments_.insert(free_segments_.begin(), static_cast<uint32_t>(victim));
  return absl::OkStatus();
}

absl::Status TieredRowFile::AppendLocked(const int64_t* rows, int64_t n, char* const* records) {
  std::vector<struct iovec> iov;
  for (int64_t i = 0; i < n;) {
    const int64_t full_segment = current_;  // (full when EnsureRoomLocked takes another)
    const int64_t full_next = next_slot_;
    RETURN_IF_ERROR_(EnsureRoomLocked());
    const int64_t k = std::min(n - i, (current_ + 1) * segment_slots_ - next_slot_);
    const int64_t slot = next_slot_;
    for (int64_t begin = 0; begin < k; begin += kMaxIov) {
      const int64_t count = std::min<int64_t>(kMaxIov, k - begin);
      RecordIovecs(records + i + begin, count, record_bytes_, &iov);
      const absl::Status written = Transfer(/*write=*/true, iov.data(), static_cast<int>(iov.size()),
                                            kHeaderBytes + (slot + begin) * record_bytes_, [&] {
                                              std::vector<Piece> named(count);
                                              for (int64_t j = 0; j < count; ++j) named[j].row = rows[i + begin + j];
                                              return RowsOf(named.data(), count);
                                            });
      if (!written.ok()) {
        // A segment taken for this write and still empty goes back on top of the free stack.  Kept as the current
        // segment, it would be filled by the next appends without cleaning; when it is cleaning's reserve (taken
        // by a cleaning whose write failed: a full disk), the next cleaning would then find no free segment, and
        // every later write would fail after the disk has room again.
        if (current_ != full_segment && next_slot_ == current_ * segment_slots_) {
          is_free_[current_] = 1;
          free_segments_.push_back(static_cast<uint32_t>(current_));
          current_ = full_segment;
          next_slot_ = full_next;
        }
        return written;
      }
    }
    {
      // Publish: the rows' old slots are free from now on.
      std::unique_lock<std::shared_mutex> lock(map_mu_);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t row = rows[i + j];
        const uint32_t old = map_[row];
        if (old != kNoSlot) {
          owner_[old] = kNoSlot;
          --live_[old / segment_slots_];
        }
        const uint32_t now = static_cast<uint32_t>(slot + j);
        map_[row] = now;
        owner_[now] = static_cast<uint32_t>(row);
        ++live_[now / segment_slots_];
      }
    }
    next_slot_ += k;
    i += k;
  }
  return absl::OkStatus();
}

absl::Status TieredRowFile::DropCachedRecords(int64_t first, int64_t n) {
  if (io_.sync_file_range == nullptr || n <= 0) return absl::OkStatus();
  std::vector<uint32_t> slots;
  {
    std::shared_lock<std::shared_mutex> lock(map_mu_);
    for (int64_t r = std::max<int64_t>(first, 0); r < std::min(first + n, layout_.num_rows); ++r) {
      if (map_[r] != kNoSlot) slots.push_back(map_[r]);
    }
  }
  std::sort(slots.begin(), slots.end());
  for (size_t begin = 0; begin < slots.size();) {
    size_t end = begin + 1;
    while (end < slots.size() && slots[end] == slots[end - 1] + 1) ++end;
    const off_t offset = kHeaderBytes + static_cast<int64_t>(slots[begin]) * record_bytes_;
    const off_t bytes = static_cast<off_t>(end - begin) * record_bytes_;
    while (io_.sync_file_range(fd_, offset, bytes,
                               SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER) != 0) {
      if (errno == EINTR) continue;
      if (errno == ENOSYS || errno == EINVAL || errno == ESPIPE) return absl::OkStatus();  // not supported here
      return IoError(errno, absl::StrCat(What(), ": cannot write ", Rows(first, n), " to the device"));
    }
    if (io_.fadvise != nullptr) io_.fadvise(fd_, offset, bytes, POSIX_FADV_DONTNEED);  // a hint
    begin = end;
  }
  return absl::OkStatus();
}

absl::Status TieredRowFile::Grow(int64_t num_rows) {
  if (num_rows <= layout_.num_rows) return absl::OkStatus();
  TieredRowLayout grown = layout_;
  grown.num_rows = num_rows;
  RETURN_IF_ERROR_(grown.Validate(What()));
  std::lock_guard<std::mutex> append(append_mu_);
  std::unique_lock<std::shared_mutex> lock(map_mu_);
  const int64_t old_rows = layout_.num_rows;
  const int64_t old_physical = physical_slots_;
  const int64_t new_physical = PhysicalSlotsFor(num_rows, segment_slots_);
  const int64_t old_size = MapRegionAt() + MapRegionBytes(old_rows);
  const int64_t size = kHeaderBytes + new_physical * record_bytes_ + MapRegionBytes(num_rows);
  const std::string growing = absl::StrCat(What(), ": cannot grow it from ", old_rows, " to ", num_rows, " rows (",
                                           size - old_size, " more bytes)");
  if (::fallocate(fd_, 0, old_size, size - old_size) != 0) {
    const int err = errno;
    if (err != EOPNOTSUPP && err != ENOSYS) {
      (void)::ftruncate(fd_, old_size);  // a partly reserved extension goes
      return IoError(err, growing);
    }
    if (::ftruncate(fd_, size) != 0) return IoError(errno, growing);
  }
  // (The old map region now lies in new, free slots.)
  layout_.num_rows = num_rows;
  physical_slots_ = new_physical;
  if (const absl::Status s = WriteHeader(kStateWriting, generation_); !s.ok()) {
    layout_.num_rows = old_rows;
    physical_slots_ = old_physical;
    (void)::ftruncate(fd_, old_size);
    return s;
  }
  clean_ = false;
  SizeState(old_physical);
  return absl::OkStatus();
}

absl::Status TieredRowFile::Sync() {
  std::lock_guard<std::mutex> append(append_mu_);
  RETURN_IF_ERROR_(FsyncLocked());
  if (clean_) return absl::OkStatus();  // nothing written since the map was
  // The map, one chunk at a time, CRC'd as it goes; then the header that vouches for it.
  const uint64_t generation = generation_ + 1;
  std::vector<char> chunk;
  uint32_t crc = ~0u;
  int64_t at = MapRegionAt();
  auto put = [&](const void* data, size_t size) -> absl::Status {
    chunk.assign(static_cast<const char*>(data), static_cast<const char*>(data) + size);
    crc = Crc32cExtend(crc, chunk.data(), chunk.size());
    struct iovec iov = {chunk.data(), chunk.size()};
    RETURN_IF_ERROR_(Transfer(/*write=*/true, &iov, 1, at, [] { return std::string("the location map"); }));
    at += static_cast<int64_t>(size);
    return absl::OkStatus();
  };
  {
    std::shared_lock<std::shared_mutex> lock(map_mu_);
    char head[16];
    Put<uint64_t>(head, 0, generation);
    Put<int64_t>(head, 8, layout_.num_rows);
    RETURN_IF_ERROR_(put(head, sizeof(head)));
    constexpr int64_t kChunkRows = 1 << 18;  // 1 MiB of map per write
    for (int64_t r = 0; r < layout_.num_rows; r += kChunkRows) {
      RETURN_IF_ERROR_(put(map_.data() + r, 4 * static_cast<size_t>(std::min(kChunkRows, layout_.num_rows - r))));
    }
  }
  const uint32_t final_crc = ~crc;
  struct iovec iov = {const_cast<uint32_t*>(&final_crc), 4};
  RETURN_IF_ERROR_(Transfer(/*write=*/true, &iov, 1, at, [] { return std::string("the location map"); }));
  RETURN_IF_ERROR_(FsyncLocked());
  RETURN_IF_ERROR_(WriteHeader(kStateClean, generation));
  RETURN_IF_ERROR_(FsyncLocked());
  generation_ = generation;
  clean_ = true;
  return absl::OkStatus();
}

int64_t TieredRowFile::RecordOffset(int64_t row) const {
  std::shared_lock<std::shared_mutex> lock(map_mu_);
  if (row < 0 || row >= layout_.num_rows || map_[row] == kNoSlot) return -1;
  return kHeaderBytes + static_cast<int64_t>(map_[row]) * record_bytes_;
}

TieredLogStats TieredRowFile::log_stats() const {
  std::lock_guard<std::mutex> lock(const_cast<std::mutex&>(append_mu_));
  TieredLogStats out = log_stats_;
  out.free_segments = static_cast<int64_t>(free_segments_.size());
  return out;
}

int64_t TieredRowFile::DramBytes() const {
  return 4 * layout_.num_rows + 4 * physical_slots_ + 6 * (physical_slots_ / segment_slots_) +
         (clean_buffer_ ? segment_slots_ * record_bytes_ : 0);
}

}  // namespace tf_embed_ops
