#include "cc/lib/tiered_row_file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cc/lib/tiered_row_file_internal.h"

namespace tf_embed_ops {
namespace {

constexpr char kMagic[8] = {'T', 'F', 'E', 'R', 'O', 'W', 'S', '1'};
// Header field offsets (bytes); per buffer 16 bytes: type (u32), 4 zero bytes, width (i64).
constexpr size_t kVersionAt = 8, kHeaderBytesAt = 12, kNumRowsAt = 16, kNumBuffersAt = 24, kRecordBytesAt = 28,
                 kBuffersAt = 32, kBufferBytes = 16, kPhysicalAt = 288, kSegmentAt = 296, kStateAt = 300,
                 kGenerationAt = 304, kHeaderCrcAt = 320;

}  // namespace

namespace row_file_internal {

absl::Status IoError(int err, const std::string& message) {
  const std::string text = absl::StrCat(message, ": ", std::strerror(err));
  if (err == ENOSPC || err == EDQUOT || err == EFBIG) return absl::ResourceExhaustedError(text);
  if (err == ENOENT) return absl::NotFoundError(text);
  if (err == EEXIST) return absl::AlreadyExistsError(text);
  if (err == EACCES || err == EPERM || err == EROFS) return absl::PermissionDeniedError(text);
  return absl::InternalError(text);
}

std::string Rows(int64_t first, int64_t n) {
  return n == 1 ? absl::StrCat("row ", first) : absl::StrCat("rows [", first, ", ", first + n, ")");
}

void RecordIovecs(char* const* records, int64_t n, int64_t record_bytes, std::vector<struct iovec>* iov) {
  iov->clear();
  for (int64_t i = 0; i < n; ++i) {
    if (!iov->empty() && static_cast<char*>(iov->back().iov_base) + iov->back().iov_len == records[i]) {
      iov->back().iov_len += static_cast<size_t>(record_bytes);
    } else {
      iov->push_back({records[i], static_cast<size_t>(record_bytes)});
    }
  }
}

}  // namespace row_file_internal

// ---------------------------------------------------------------------------------------------- file

RowFileIo RowFileIo::Posix() {
  return RowFileIo{::preadv, ::pwritev, ::fsync, ::preadv2, ::posix_fadvise, ::sync_file_range};
}

int64_t TieredRowFile::SegmentSlotsFor(int64_t num_rows) {
  return std::clamp<int64_t>(num_rows / 8, 1, kMaxSegmentSlots);
}

int64_t TieredRowFile::PhysicalSlotsFor(int64_t num_rows, int64_t segment_slots) {
  const int64_t slots = num_rows + std::max(num_rows / 4, 3 * segment_slots);
  return (slots + segment_slots - 1) / segment_slots * segment_slots;
}

int64_t TieredRowFile::MapBytesFor(int64_t num_rows) {
  const int64_t s = SegmentSlotsFor(num_rows);
  return 4 * num_rows + 4 * PhysicalSlotsFor(num_rows, s) + 6 * (PhysicalSlotsFor(num_rows, s) / s);
}

TieredRowFile::TieredRowFile(int fd, std::string path, std::string table, TieredRowLayout layout, RowFileIo io,
                             int64_t segment_slots)
    : fd_(fd),
      path_(std::move(path)),
      table_(std::move(table)),
      layout_(std::move(layout)),
      record_bytes_(layout_.record_bytes()),
      io_(io),
      segment_slots_(segment_slots) {
  // Misses read records one by one, in no order: readahead would only read (and cache) other records.  A hint.
  if (io_.fadvise != nullptr) io_.fadvise(fd_, 0, 0, POSIX_FADV_RANDOM);
}

TieredRowFile::~TieredRowFile() { ::close(fd_); }

std::string TieredRowFile::What() const { return absl::StrCat("table '", table_, "', row file '", path_, "'"); }

void TieredRowFile::SizeState(int64_t old_physical) {
  map_.resize(layout_.num_rows, kNoSlot);
  owner_.resize(physical_slots_, kNoSlot);
  const int64_t old_segments = old_physical / segment_slots_;
  const int64_t segments = physical_slots_ / segment_slots_;
  live_.resize(segments, 0);
  is_free_.resize(segments, 1);
  // New segments go under the ones already free, the lowest on top: a new file fills from its start.
  std::vector<uint32_t> added;
  for (int64_t g = segments - 1; g >= old_segments; --g) added.push_back(static_cast<uint32_t>(g));
  free_segments_.insert(free_segments_.begin(), added.begin(), added.end());
}

std::vector<char> TieredRowFile::EncodeHeader(uint32_t state, uint64_t generation) const {
  std::vector<char> header(kHeaderBytes, 0);
  std::memcpy(header.data(), kMagic, sizeof(kMagic));
  Put<uint32_t>(header.data(), kVersionAt, kFormatVersion);
  Put<uint32_t>(header.data(), kHeaderBytesAt, static_cast<uint32_t>(kHeaderBytes));
  Put<int64_t>(header.data(), kNumRowsAt, layout_.num_rows);
  Put<uint32_t>(header.data(), kNumBuffersAt, static_cast<uint32_t>(layout_.num_buffers()));
  Put<uint32_t>(header.data(), kRecordBytesAt, static_cast<uint32_t>(record_bytes_));
  for (int64_t b = 0; b < layout_.num_buffers(); ++b) {
    Put<uint32_t>(header.data(), kBuffersAt + kBufferBytes * b, static_cast<uint32_t>(layout_.types[b]));
    Put<int64_t>(header.data(), kBuffersAt + kBufferBytes * b + 8, layout_.widths[b]);
  }
  Put<int64_t>(header.data(), kPhysicalAt, physical_slots_);
  Put<uint32_t>(header.data(), kSegmentAt, static_cast<uint32_t>(segment_slots_));
  Put<uint32_t>(header.data(), kStateAt, state);
  Put<uint64_t>(header.data(), kGenerationAt, generation);
  Put<uint32_t>(header.data(), kHeaderCrcAt, Crc32c(header.data(), kHeaderCrcAt));
  return header;
}

absl::Status TieredRowFile::WriteHeader(uint32_t state, uint64_t generation) {
  std::vector<char> header = EncodeHeader(state, generation);
  struct iovec iov = {header.data(), header.size()};
  return Transfer(/*write=*/true, &iov, 1, 0, [] { return std::string("the header"); });
}

absl::Status TieredRowFile::FsyncLocked() {
  while (io_.fsync(fd_) != 0) {
    if (errno == EINTR) continue;
    return IoError(errno, absl::StrCat(What(), ": fsync failed"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TieredRowFile>> TieredRowFile::Create(const std::string& path, const std::string& table,
                                                                     const TieredRowLayout& layout, RowFileIo io) {
  const std::string what = absl::StrCat("table '", table, "', row file '", path, "'");
  RETURN_IF_ERROR_(layout.Validate(what));
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    return IoError(err, absl::StrCat(what, ": cannot create it",
                                     err == EEXIST ? " (it already exists; open it with "
                                                     "mode 'open', or remove it)"
                                                   : ""));
  }
  const int64_t segment_slots = SegmentSlotsFor(layout.num_rows);
  std::unique_ptr<TieredRowFile> file(new TieredRowFile(fd, path, table, layout, io, segment_slots));
  file->physical_slots_ = PhysicalSlotsFor(layout.num_rows, segment_slots);
  auto fail = [&](absl::Status s) {
    file.reset();            // closes fd
    ::unlink(path.c_str());  // a half-made file would be refused by the next Create
    return s;
  };
  const int64_t size = file->MapRegionAt() + MapRegionBytes(layout.num_rows);
  if (::fallocate(fd, 0, 0, size) != 0) {
    const int err = errno;
    if (err != EOPNOTSUPP && err != ENOSYS) {
      return fail(IoError(err, absl::StrCat(what, ": cannot reserve ", size, " bytes for ", layout.DebugString(), " (",
                                            file->physical_slots_, " record slots and the location map)")));
    }
    if (::ftruncate(fd, size) != 0) {
      return fail(IoError(errno, absl::StrCat(what, ": cannot size it to ", size, " bytes")));
    }
  }
  file->SizeState(0);
  absl::Status s = file->WriteHeader(kStateWriting, 0);
  if (s.ok()) s = file->FsyncLocked();
  if (!s.ok()) return fail(s);
  return file;
}

absl::StatusOr<std::unique_ptr<TieredRowFile>> TieredRowFile::Open(const std::string& path, const std::string& table,
                                                                   const TieredRowLayout& layout, RowFileIo io) {
  const std::string what = absl::StrCat("table '", table, "', row file '", path, "'");
  RETURN_IF_ERROR_(layout.Validate(what));
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return IoError(errno, absl::StrCat(what, ": cannot open it"));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return IoError(err, absl::StrCat(what, ": cannot stat it"));
  }
  std::vector<char> header(kHeaderBytes);
  if (st.st_size >= kHeaderBytes) {
    ssize_t got;
    do {
      got = ::pread(fd, header.data(), header.size(), 0);
    } while (got < 0 && errno == EINTR);
    if (got != static_cast<ssize_t>(header.size())) {
      const int err = got < 0 ? errno : EIO;
      ::close(fd);
      return IoError(err, absl::StrCat(what, ": cannot read its header"));
    }
  }
  // The geometry fields are checked before the file object exists (its segment size comes from the header).
  auto refuse = [&](absl::Status s) {
    ::close(fd);
    return s;
  };
  if (st.st_size < kHeaderBytes) {
    return refuse(absl::DataLossError(absl::StrCat(what, ": ", st.st_size, " bytes, shorter than the ", kHeaderBytes,
                                                   "-byte header: not a row file, or truncated")));
  }
  auto mismatch = [&](const std::string& field, const std::string& in_file, const std::string& expected) {
    return refuse(
        absl::InvalidArgumentError(absl::StrCat(what, ": the file's ", field, " is ", in_file, " but the table has ",
                                                expected, " (a row file of another table or configuration)")));
  };
  if (std::memcmp(header.data(), kMagic, sizeof(kMagic)) != 0) {
    return refuse(absl::DataLossError(absl::StrCat(what, ": bad magic (not a row file)")));
  }
  const uint32_t version = Get<uint32_t>(header.data(), kVersionAt);
  if (version != kFormatVersion) {
    return refuse(absl::FailedPreconditionError(absl::StrCat(
        what, ": format version ", version, "; this build reads version ", kFormatVersion,
        version < kFormatVersion ? " (log-structured records); restore the table from its checkpoint into a new row "
                                   "file (mode='overwrite')"
                                 : "")));
  }
  if (Get<uint32_t>(header.data(), kHeaderCrcAt) != Crc32c(header.data(), kHeaderCrcAt)) {
    return refuse(absl::DataLossError(absl::StrCat(what, ": corrupted header (CRC mismatch)")));
  }
  const uint32_t num_buffers = Get<uint32_t>(header.data(), kNumBuffersAt);
  if (num_buffers < 1 || num_buffers > TieredRowLayout::kMaxBuffers ||
      Get<uint32_t>(header.data(), kHeaderBytesAt) != kHeaderBytes) {
    return refuse(absl::DataLossError(absl::StrCat(what, ": corrupted header (buffer count ", num_buffers, ")")));
  }
  const int64_t num_rows = Get<int64_t>(header.data(), kNumRowsAt);
  if (num_rows != layout.num_rows) return mismatch("num_rows", absl::StrCat(num_rows), absl::StrCat(layout.num_rows));
  if (static_cast<int64_t>(num_buffers) != layout.num_buffers()) {
    return mismatch("buffer count (table + slots)", absl::StrCat(num_buffers), absl::StrCat(layout.num_buffers()));
  }
  for (int64_t b = 0; b < layout.num_buffers(); ++b) {
    const uint32_t type = Get<uint32_t>(header.data(), kBuffersAt + kBufferBytes * b);
    const int64_t width = Get<int64_t>(header.data(), kBuffersAt + kBufferBytes * b + 8);
    if (type > static_cast<uint32_t>(StorageType::kFloat16)) {
      return refuse(absl::DataLossError(absl::StrCat(what, ": corrupted header (buffer ", b, " type ", type, ")")));
    }
    if (static_cast<StorageType>(type) != layout.types[b]) {
      return mismatch(absl::StrCat("buffer ", b, " storage type"), StorageTypeName(static_cast<StorageType>(type)),
                      StorageTypeName(layout.types[b]));
    }
    if (width != layout.widths[b]) {
      return mismatch(absl::StrCat("buffer ", b, " width"), absl::StrCat(width), absl::StrCat(layout.widths[b]));
    }
  }
  const int64_t segment_slots = Get<uint32_t>(header.data(), kSegmentAt);
  const int64_t physical = Get<int64_t>(header.data(), kPhysicalAt);
  if (segment_slots < 1 || segment_slots > kMaxSegmentSlots || physical != PhysicalSlotsFor(num_rows, segment_slots)) {
    return refuse(absl::DataLossError(
        absl::StrCat(what, ": corrupted header (", physical, " record slots in segments of ", segment_slots, ")")));
  }
  const int64_t expected_size = kHeaderBytes + physical * layout.record_bytes() + MapRegionBytes(num_rows);
  if (Get<uint32_t>(header.data(), kRecordBytesAt) != layout.record_bytes() || st.st_size != expected_size) {
    return refuse(absl::DataLossError(absl::StrCat(what, ": ", st.st_size, " bytes but ", layout.DebugString(),
                                                   " take ", expected_size, " (truncated or extended)")));
  }
  if (Get<uint32_t>(header.data(), kStateAt) != kStateClean) {
    return refuse(absl::FailedPreconditionError(absl::StrCat(
        what,
        ": it was not closed cleanly (its process stopped while training on it, before a flush), so where its "
        "rows are is not known; restore the table from its last checkpoint into a new row file "
        "(mode='overwrite')")));
  }
  std::unique_ptr<TieredRowFile> file(new TieredRowFile(fd, path, table, layout, io, segment_slots));
  file->physical_slots_ = physical;
  file->SizeState(0);
  RETURN_IF_ERROR_(file->LoadMap(Get<uint64_t>(header.data(), kGenerationAt)));
  return file;
}

absl::Status TieredRowFile::LoadMap(uint64_t generation) {
  const int64_t bytes = MapRegionBytes(layout_.num_rows);
  std::vector<char> region(bytes);
  struct iovec iov = {region.data(), region.size()};
  RETURN_IF_ERROR_(Transfer(/*write=*/false, &iov, 1, MapRegionAt(), [] { return std::string("the location map"); }));
  auto stale = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(What(), ": its location map is ", why,
                                            "; restore the table from its last checkpoint into a new row file "
                                            "(mode='overwrite')"));
  };
  if (Get<uint32_t>(region.data(), bytes - 4) != Crc32c(region.data(), bytes - 4))
    return stale("corrupted (CRC mismatch)");
  if (Get<uint64_t>(region.data(), 0) != generation || Get<int64_t>(region.data(), 8) != layout_.num_rows) {
    return stale(absl::StrCat("of generation ", Get<uint64_t>(region.data(), 0), " but the header says ", generation));
  }
  // free_segments_ is rebuilt from the live counts below.
  free_segments_.clear();
  std::memcpy(map_.data(), region.data() + 16, 4 * layout_.num_rows);
  for (int64_t r = 0; r < layout_.num_rows; ++r) {
    const uint32_t slot = map_[r];
    if (slot == kNoSlot) continue;
    if (slot >= physical_slots_ || owner_[slot] != kNoSlot) {
      return stale(absl::StrCat("corrupted (row ", r, " at slot ", slot, ")"));
    }
    owner_[slot] = static_cast<uint32_t>(r);
    ++live_[slot / segment_slots_];
  }
  for (int64_t g = static_cast<int64_t>(live_.size()) - 1; g >= 0; --g) {
    is_free_[g] = live_[g] == 0;
    if (is_free_[g]) free_segments_.push_back(static_cast<uint32_t>(g));
  }
  generation_ = generation;
  clean_ = true;
  return absl::OkStatus();
}

absl::Status TieredRowFile::Transfer(bool write, struct iovec* iov, int iovcnt, off_t offset,
                                     absl::FunctionRef<std::string()> rows) const {
  while (iovcnt > 0) {
    const ssize_t done = write ? io_.pwritev(fd_, iov, iovcnt, offset) : io_.preadv(fd_, iov, iovcnt, offset);
    if (done < 0) {
      if (errno == EINTR) continue;
      return IoError(errno, absl::StrCat(What(), ": cannot ", write ? "write " : "read ", rows()));
    }
    if (done == 0) {
      return absl::DataLossError(absl::StrCat(What(), ": short ", write ? "write" : "read", " of ", rows(), " at byte ",
                                              offset, " (truncated?)"));
    }
    offset += done;
    // Skip the iovecs the call completed, and shorten the one it stopped in.
    size_t left = static_cast<size_t>(done);
    while (iovcnt > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --iovcnt;
    }
    if (iovcnt > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return absl::OkStatus();
}

absl::Status TieredRowFile::ReadPieces(const Piece* pieces, int64_t n) const {
  std::array<struct iovec, kMaxIov> iov;
  for (int64_t begin = 0; begin < n; begin += kMaxIov) {
    const int64_t count = std::min<int64_t>(kMaxIov, n - begin);
    const int iovcnt = PieceIovecs(pieces + begin, count, record_bytes_, iov.data());
    RETURN_IF_ERROR_(Transfer(/*write=*/false, iov.data(), iovcnt,
                              kHeaderBytes + static_cast<int64_t>(pieces[begin].slot) * record_bytes_,
                              [&] { return RowsOf(pieces + begin, count); }));
  }
  return absl::OkStatus();
}

bool TieredRowFile::ReadPiecesIfCached(const Piece* pieces, int64_t n) const {
  if (n > kMaxIov || !nowait_reads_.load(std::memory_order_relaxed)) return false;
  std::array<struct iovec, kMaxIov> iov;
  const int iovcnt = PieceIovecs(pieces, n, record_bytes_, iov.data());
  const ssize_t want = static_cast<ssize_t>(n * record_bytes_);
  ssize_t done;
  do {
    done = io_.preadv2(fd_, iov.data(), iovcnt, kHeaderBytes + static_cast<int64_t>(pieces[0].slot) * record_bytes_,
                       RWF_NOWAIT);
  } while (done < 0 && errno == EINTR);
  if (done < 0 && (errno == EOPNOTSUPP || errno == EINVAL || errno == ENOSYS)) {
    nowait_reads_.store(false, std::memory_order_relaxed);
  }
  // EAGAIN (not cached), a part of the run, or an error: the blocking read does the run again and reports errors.
  return done == want;
}

bool TieredRowFile::RecordCrcOk(const char* record) const {
  const int64_t payload = layout_.payload_bytes();
  uint32_t stored;
  std::memcpy(&stored, record + payload, 4);
  return stored == Crc32c(record, static_cast<size_t>(payload));
}

absl::Status TieredRowFile::CheckRecord(int64_t row, const char* record) const {
  if (RecordCrcOk(record)) return absl::OkStatus();
  return absl::DataLossError(
      absl::StrCat(What(), ": row ", row, " is corrupted (CRC32C mismatch); restore the table from a checkpoint"));
}

absl::Status TieredRowFile::ReadRecords(int64_t first, int64_t n, char* const* records) const {
  return ReadRuns({RecordRun{first, n, records}});
}

absl::Status TieredRowFile::ReadRuns(const std::vector<RecordRun>& runs) const {
  int64_t total = 0;
  for (const RecordRun& run : runs) {
    if (run.first < 0 || run.n < 0 || run.first > layout_.num_rows - run.n) {
      return absl::InvalidArgumentError(
          absl::StrCat(What(), ": ", Rows(run.first, run.n), " outside [0, ", layout_.num_rows, ")"));
    }
    total += run.n;
  }
  std::shared_lock<std::shared_mutex> lock(map_mu_);
  // The rows' slots, in the runs' order (never-written rows are errors in that order, after the reads).
  std::vector<Piece> pieces;
  pieces.reserve(total);
  int64_t never_written = -1;
  for (const RecordRun& run : runs) {
    for (int64_t i = 0; i < run.n; ++i) {
      const uint32_t slot = map_[run.first + i];
      if (slot == kNoSlot) {
        if (never_written < 0) never_written = run.first + i;
        continue;
      }
      pieces.push_back(Piece{slot, run.first + i, run.records[i], static_cast<int64_t>(pieces.size())});
    }
  }
  // Read in slot order, consecutive slots together: 1. what the page cache holds, without blocking; 2. every
  // other run's read started; 3. those read, waiting.  (A single run has nothing to overlap with.)
  std::vector<Piece> by_slot = pieces;
  std::sort(by_slot.begin(), by_slot.end(), [](const Piece& a, const Piece& b) { return a.slot < b.slot; });
  std::vector<std::pair<int64_t, int64_t>> slot_runs;  // [begin, end) into by_slot
  for (int64_t begin = 0, n = static_cast<int64_t>(by_slot.size()); begin < n;) {
    int64_t end = begin + 1;
    while (end < n && end - begin < kMaxIov && by_slot[end].slot == by_slot[end - 1].slot + 1) ++end;
    slot_runs.emplace_back(begin, end);
    begin = end;
  }
  // A run's records are checked as soon as it is read, while they are in the core's cache (checked after the
  // whole batch's reads, W1's 1.4 MB of misses came back from memory for it); errors are reported after the
  // reads, in the runs' order.
  std::vector<uint8_t> crc_ok(pieces.size(), 0);
  auto check_run = [&](size_t k) {
    for (int64_t j = slot_runs[k].first; j < slot_runs[k].second; ++j) {
      crc_ok[by_slot[j].index] = RecordCrcOk(by_slot[j].record);
    }
  };
  std::vector<uint8_t> cached(slot_runs.size(), 0);
  bool probed = slot_runs.size() > 1 && io_.preadv2 != nullptr && nowait_reads_.load(std::memory_order_relaxed);
  if (probed) {
    for (size_t k = 0; k < slot_runs.size(); ++k) {
      cached[k] = ReadPiecesIfCached(by_slot.data() + slot_runs[k].first, slot_runs[k].second - slot_runs[k].first);
      if (cached[k]) check_run(k);
    }
    probed = nowait_reads_.load(std::memory_order_relaxed);  // (not when the kernel refused RWF_NOWAIT)
  }
  if (probed && io_.fadvise != nullptr) {
    int64_t cold = 0;
    for (size_t k = 0; k < slot_runs.size(); ++k) cold += !cached[k];
    for (size_t k = 0; k < slot_runs.size() && cold > 1; ++k) {
      if (cached[k]) continue;
      // A hint: an error here only loses the overlap, and the read below reports any real fault.
      io_.fadvise(fd_, kHeaderBytes + static_cast<int64_t>(by_slot[slot_runs[k].first].slot) * record_bytes_,
                  (slot_runs[k].second - slot_runs[k].first) * record_bytes_, POSIX_FADV_WILLNEED);
    }
  }
  for (size_t k = 0; k < slot_runs.size(); ++k) {
    if (cached[k]) continue;
    RETURN_IF_ERROR_(ReadPieces(by_slot.data() + slot_runs[k].first, slot_runs[k].second - slot_runs[k].first));
    check_run(k);
  }
  lock.unlock();
  size_t at = 0;
  for (const RecordRun& run : runs) {
    for (int64_t i = 0; i < run.n; ++i) {
      const int64_t row = run.first + i;
      if (row == never_written) {
        return absl::FailedPreconditionError(absl::StrCat(
            What(), ": row ", row,
            " was never written: a new row file holds the rows its initialisation or a checkpoint restore wrote "
            "(a table created with te.Tiered(mode='restore') has no rows until its checkpoint is restored)"));
      }
      if (at < pieces.size() && pieces[at].row == row) {
        if (!crc_ok[at]) RETURN_IF_ERROR_(CheckRecord(row, pieces[at].record));
        ++at;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace tf_embed_ops
