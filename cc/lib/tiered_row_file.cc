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

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the row file format is little-endian and is read and written with memcpy"
#endif

// (cc/lib has no TensorFlow, hence no TF_RETURN_IF_ERROR.)
#define RETURN_IF_ERROR_(expr)           \
  do {                                   \
    const absl::Status status_ = (expr); \
    if (!status_.ok()) return status_;   \
  } while (0)

namespace tf_embed_ops {
namespace {

constexpr char kMagic[8] = {'T', 'F', 'E', 'R', 'O', 'W', 'S', '1'};
// Header field offsets (bytes); per buffer 16 bytes: type (u32), 4 zero bytes, width (i64).
constexpr size_t kVersionAt = 8, kHeaderBytesAt = 12, kNumRowsAt = 16, kNumBuffersAt = 24, kRecordBytesAt = 28,
                 kBuffersAt = 32, kBufferBytes = 16;
// The most iovecs one preadv/pwritev takes (POSIX guarantees at least 16; Linux has 1024).
constexpr int kMaxIov = 1024;

std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;  // reflected Castagnoli polynomial
    table[i] = c;
  }
  return table;
}

uint32_t Crc32cTable(uint32_t crc, const unsigned char* p, size_t n) {
  static const std::array<uint32_t, 256> table = MakeCrcTable();
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xffu] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Crc32cSse42(uint32_t crc, const unsigned char* p, size_t n) {
  uint64_t c = crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return c32;
}
#endif

template <typename T>
void Put(char* header, size_t at, T value) {
  std::memcpy(header + at, &value, sizeof(T));
}
template <typename T>
T Get(const char* header, size_t at) {
  T value;
  std::memcpy(&value, header + at, sizeof(T));
  return value;
}

size_t HeaderCrcAt(int64_t num_buffers) { return kBuffersAt + kBufferBytes * static_cast<size_t>(num_buffers); }

std::vector<char> EncodeHeader(const TieredRowLayout& layout) {
  std::vector<char> header(TieredRowFile::kHeaderBytes, 0);
  std::memcpy(header.data(), kMagic, sizeof(kMagic));
  Put<uint32_t>(header.data(), kVersionAt, TieredRowFile::kFormatVersion);
  Put<uint32_t>(header.data(), kHeaderBytesAt, static_cast<uint32_t>(TieredRowFile::kHeaderBytes));
  Put<int64_t>(header.data(), kNumRowsAt, layout.num_rows);
  Put<uint32_t>(header.data(), kNumBuffersAt, static_cast<uint32_t>(layout.num_buffers()));
  Put<uint32_t>(header.data(), kRecordBytesAt, static_cast<uint32_t>(layout.record_bytes()));
  for (int64_t b = 0; b < layout.num_buffers(); ++b) {
    Put<uint32_t>(header.data(), kBuffersAt + kBufferBytes * b, static_cast<uint32_t>(layout.types[b]));
    Put<int64_t>(header.data(), kBuffersAt + kBufferBytes * b + 8, layout.widths[b]);
  }
  const size_t crc_at = HeaderCrcAt(layout.num_buffers());
  Put<uint32_t>(header.data(), crc_at, Crc32c(header.data(), crc_at));
  return header;
}

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

bool AllZero(const char* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (p[i] != 0) return false;
  return true;
}

}  // namespace

uint32_t Crc32c(const void* data, size_t size) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
#if defined(__x86_64__)
  static const bool has_sse42 = __builtin_cpu_supports("sse4.2");
  if (has_sse42) return ~Crc32cSse42(~0u, p, size);
#endif
  return ~Crc32cTable(~0u, p, size);
}

// ---------------------------------------------------------------------------------------------- layout

absl::Status TieredRowLayout::Validate(const std::string& what) const {
  if (types.size() != widths.size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", types.size(), " storage types for ", widths.size(),
                                                   " buffers; give one per buffer (the table, then each slot)"));
  }
  if (types.empty() || num_buffers() > kMaxBuffers) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", types.size(), " buffers; a table has 1 to ", kMaxBuffers,
                                                   " (the table and its slots)"));
  }
  for (int64_t b = 0; b < num_buffers(); ++b) {
    if (widths[b] < 1 || widths[b] > kMaxWidth) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": buffer ", b, " (", b == 0 ? "the table" : "a slot",
                                                     ") has width ", widths[b], "; allowed [1, ", kMaxWidth, "]"));
    }
  }
  if (num_rows < 1 || num_rows > (INT64_MAX - TieredRowFile::kHeaderBytes) / record_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": num_rows is ", num_rows, "; allowed [1, ",
                                                   (INT64_MAX - TieredRowFile::kHeaderBytes) / record_bytes(),
                                                   "] for records of ", record_bytes(), " bytes"));
  }
  return absl::OkStatus();
}

int64_t TieredRowLayout::offset(int64_t b) const {
  int64_t at = 0;
  for (int64_t i = 0; i < b; ++i) at += (widths[i] * StorageBytes(types[i]) + 3) / 4 * 4;
  return at;
}

std::string TieredRowLayout::DebugString() const {
  std::string out = absl::StrCat(num_rows, " rows of [");
  for (int64_t b = 0; b < num_buffers(); ++b) {
    absl::StrAppend(&out, b ? ", " : "", StorageTypeName(types[b]), " x ", widths[b]);
  }
  absl::StrAppend(&out, "]");
  return out;
}

void EncodeRecord(const TieredRowLayout& layout, const float* const* buffers, char* record) {
  std::memset(record, 0, layout.payload_bytes());  // the padding too: the CRC covers it
  for (int64_t b = 0; b < layout.num_buffers(); ++b) {
    char* dst = record + layout.offset(b);
    const int64_t w = layout.widths[b];
    if (layout.types[b] == StorageType::kFloat32) {
      std::memcpy(dst, buffers[b], w * sizeof(float));
      continue;
    }
    for (int64_t d = 0; d < w; ++d) {
      const uint16_t bits = layout.types[b] == StorageType::kBfloat16 ? FloatToBfloat16Nearest(buffers[b][d])
                                                                      : FloatToFloat16Nearest(buffers[b][d]);
      std::memcpy(dst + 2 * d, &bits, 2);
    }
  }
  StampRecord(layout, record);
}

void DecodeRecord(const TieredRowLayout& layout, const char* record, float* const* buffers) {
  for (int64_t b = 0; b < layout.num_buffers(); ++b) {
    const char* src = record + layout.offset(b);
    const int64_t w = layout.widths[b];
    if (layout.types[b] == StorageType::kFloat32) {
      std::memcpy(buffers[b], src, w * sizeof(float));
      continue;
    }
    for (int64_t d = 0; d < w; ++d) {
      uint16_t bits;
      std::memcpy(&bits, src + 2 * d, 2);
      buffers[b][d] = StoredToFloat(layout.types[b], bits);
    }
  }
}

void StampRecord(const TieredRowLayout& layout, char* record) {
  const int64_t payload = layout.payload_bytes();
  const uint32_t crc = Crc32c(record, static_cast<size_t>(payload));
  std::memcpy(record + payload, &crc, 4);
}

// ---------------------------------------------------------------------------------------------- file

RowFileIo RowFileIo::Posix() {
  return RowFileIo{::preadv, ::pwritev, ::fsync, ::preadv2, ::posix_fadvise, ::sync_file_range};
}

TieredRowFile::TieredRowFile(int fd, std::string path, std::string table, TieredRowLayout layout, RowFileIo io)
    : fd_(fd),
      path_(std::move(path)),
      table_(std::move(table)),
      layout_(std::move(layout)),
      record_bytes_(layout_.record_bytes()),
      io_(io) {
  // Rows are read one record at a time, in no order: readahead would only read (and cache) other rows.  A hint.
  if (io_.fadvise != nullptr) io_.fadvise(fd_, 0, 0, POSIX_FADV_RANDOM);
}

TieredRowFile::~TieredRowFile() { ::close(fd_); }

std::string TieredRowFile::What() const { return absl::StrCat("table '", table_, "', row file '", path_, "'"); }

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
  auto fail = [&](absl::Status s) {
    ::close(fd);
    ::unlink(path.c_str());  // a half-made file would be refused by the next Create
    return s;
  };
  const int64_t size = kHeaderBytes + layout.num_rows * layout.record_bytes();
  if (::fallocate(fd, 0, 0, size) != 0) {
    const int err = errno;
    if (err != EOPNOTSUPP && err != ENOSYS) {
      return fail(IoError(err, absl::StrCat(what, ": cannot reserve ", size, " bytes for ", layout.DebugString())));
    }
    if (::ftruncate(fd, size) != 0) {
      return fail(IoError(errno, absl::StrCat(what, ": cannot size it to ", size, " bytes")));
    }
  }
  std::unique_ptr<TieredRowFile> file(new TieredRowFile(fd, path, table, layout, io));
  std::vector<char> header = EncodeHeader(layout);
  struct iovec iov = {header.data(), header.size()};
  absl::Status s = file->Transfer(/*write=*/true, &iov, 1, 0, -1, 0);
  if (s.ok()) s = file->Sync();
  if (!s.ok()) {
    file.reset();  // closes fd
    ::unlink(path.c_str());
    return s;
  }
  return file;
}

absl::StatusOr<std::unique_ptr<TieredRowFile>> TieredRowFile::Open(const std::string& path, const std::string& table,
                                                                   const TieredRowLayout& layout, RowFileIo io) {
  const std::string what = absl::StrCat("table '", table, "', row file '", path, "'");
  RETURN_IF_ERROR_(layout.Validate(what));
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return IoError(errno, absl::StrCat(what, ": cannot open it"));
  std::unique_ptr<TieredRowFile> file(new TieredRowFile(fd, path, table, layout, io));
  struct stat st;
  if (::fstat(fd, &st) != 0) return IoError(errno, absl::StrCat(what, ": cannot stat it"));
  if (st.st_size < kHeaderBytes) {
    return absl::DataLossError(absl::StrCat(what, ": ", st.st_size, " bytes, shorter than the ", kHeaderBytes,
                                            "-byte header: not a row file, or truncated"));
  }
  std::vector<char> header(kHeaderBytes);
  struct iovec iov = {header.data(), header.size()};
  RETURN_IF_ERROR_(file->Transfer(/*write=*/false, &iov, 1, 0, -1, 0));
  auto mismatch = [&](const std::string& field, const std::string& in_file, const std::string& expected) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the file's ", field, " is ", in_file, " but the table has ",
                                                   expected, " (a row file of another table or configuration)"));
  };
  if (std::memcmp(header.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError(absl::StrCat(what, ": bad magic (not a row file)"));
  }
  const uint32_t version = Get<uint32_t>(header.data(), kVersionAt);
  if (version != kFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": format version ", version, "; this build reads version ", kFormatVersion));
  }
  const uint32_t num_buffers = Get<uint32_t>(header.data(), kNumBuffersAt);
  if (num_buffers < 1 || num_buffers > TieredRowLayout::kMaxBuffers ||
      Get<uint32_t>(header.data(), kHeaderBytesAt) != kHeaderBytes) {
    return absl::DataLossError(absl::StrCat(what, ": corrupted header (buffer count ", num_buffers, ")"));
  }
  const size_t crc_at = HeaderCrcAt(num_buffers);
  if (Get<uint32_t>(header.data(), crc_at) != Crc32c(header.data(), crc_at)) {
    return absl::DataLossError(absl::StrCat(what, ": corrupted header (CRC mismatch)"));
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
      return absl::DataLossError(absl::StrCat(what, ": corrupted header (buffer ", b, " type ", type, ")"));
    }
    if (static_cast<StorageType>(type) != layout.types[b]) {
      return mismatch(absl::StrCat("buffer ", b, " storage type"), StorageTypeName(static_cast<StorageType>(type)),
                      StorageTypeName(layout.types[b]));
    }
    if (width != layout.widths[b]) {
      return mismatch(absl::StrCat("buffer ", b, " width"), absl::StrCat(width), absl::StrCat(layout.widths[b]));
    }
  }
  const int64_t expected_size = kHeaderBytes + layout.num_rows * layout.record_bytes();
  if (Get<uint32_t>(header.data(), kRecordBytesAt) != layout.record_bytes() || st.st_size != expected_size) {
    return absl::DataLossError(absl::StrCat(what, ": ", st.st_size, " bytes but ", layout.DebugString(), " take ",
                                            expected_size, " (truncated or extended)"));
  }
  return file;
}

absl::Status TieredRowFile::Transfer(bool write, struct iovec* iov, int iovcnt, off_t offset, int64_t first,
                                     int64_t n) const {
  const std::string rows = first < 0 ? std::string("the header") : Rows(first, n);
  while (iovcnt > 0) {
    const ssize_t done = write ? io_.pwritev(fd_, iov, iovcnt, offset) : io_.preadv(fd_, iov, iovcnt, offset);
    if (done < 0) {
      if (errno == EINTR) continue;
      return IoError(errno, absl::StrCat(What(), ": cannot ", write ? "write " : "read ", rows));
    }
    if (done == 0) {
      return absl::DataLossError(absl::StrCat(What(), ": short ", write ? "write" : "read", " of ", rows, " at byte ",
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

absl::Status TieredRowFile::TransferRecords(bool write, int64_t first, int64_t n, char* const* records) const {
  if (first < 0 || n < 0 || first > layout_.num_rows - n) {
    return absl::InvalidArgumentError(
        absl::StrCat(What(), ": ", Rows(first, n), " outside [0, ", layout_.num_rows, ")"));
  }
  std::vector<struct iovec> iov;
  for (int64_t begin = 0; begin < n; begin += kMaxIov) {
    const int64_t count = std::min<int64_t>(kMaxIov, n - begin);
    iov.resize(count);
    for (int64_t i = 0; i < count; ++i) iov[i] = {records[begin + i], static_cast<size_t>(record_bytes_)};
    RETURN_IF_ERROR_(Transfer(write, iov.data(), static_cast<int>(count),
                              kHeaderBytes + (first + begin) * record_bytes_, first + begin, count));
  }
  return absl::OkStatus();
}

absl::Status TieredRowFile::CheckRecords(int64_t first, int64_t n, char* const* records) const {
  const int64_t payload = layout_.payload_bytes();
  for (int64_t i = 0; i < n; ++i) {
    uint32_t stored;
    std::memcpy(&stored, records[i] + payload, 4);
    if (stored == Crc32c(records[i], static_cast<size_t>(payload))) continue;
    if (AllZero(records[i], record_bytes_)) {
      return absl::FailedPreconditionError(absl::StrCat(
          What(), ": row ", first + i, " was never written (a new row file must be initialised with every row)"));
    }
    return absl::DataLossError(absl::StrCat(What(), ": row ", first + i,
                                            " is corrupted (CRC32C mismatch); restore the table from a checkpoint"));
  }
  return absl::OkStatus();
}

absl::Status TieredRowFile::ReadRecords(int64_t first, int64_t n, char* const* records) const {
  RETURN_IF_ERROR_(TransferRecords(/*write=*/false, first, n, records));
  return CheckRecords(first, n, records);
}

bool TieredRowFile::ReadRunIfCached(const RecordRun& run) const {
  if (run.n > kMaxIov || !nowait_reads_.load(std::memory_order_relaxed)) return false;
  std::array<struct iovec, kMaxIov> iov;
  for (int64_t i = 0; i < run.n; ++i) iov[i] = {run.records[i], static_cast<size_t>(record_bytes_)};
  const ssize_t want = static_cast<ssize_t>(run.n * record_bytes_);
  ssize_t done;
  do {
    done = io_.preadv2(fd_, iov.data(), static_cast<int>(run.n), kHeaderBytes + run.first * record_bytes_, RWF_NOWAIT);
  } while (done < 0 && errno == EINTR);
  if (done < 0 && (errno == EOPNOTSUPP || errno == EINVAL || errno == ENOSYS)) {
    nowait_reads_.store(false, std::memory_order_relaxed);
  }
  // EAGAIN (not cached), a part of the run, or an error: the blocking read does the run again and reports errors.
  return done == want;
}

absl::Status TieredRowFile::ReadRuns(const std::vector<RecordRun>& runs) const {
  for (const RecordRun& run : runs) {
    if (run.first < 0 || run.n < 0 || run.first > layout_.num_rows - run.n) {
      return absl::InvalidArgumentError(
          absl::StrCat(What(), ": ", Rows(run.first, run.n), " outside [0, ", layout_.num_rows, ")"));
    }
  }
  // 1. What the page cache holds, without blocking; 2. every other run's read started; 3. those read, waiting.
  // (A single run has nothing to overlap with: it is read directly.)
  std::vector<uint8_t> cached(runs.size(), 0);
  bool probed = runs.size() > 1 && io_.preadv2 != nullptr && nowait_reads_.load(std::memory_order_relaxed);
  if (probed) {
    for (size_t k = 0; k < runs.size(); ++k) cached[k] = ReadRunIfCached(runs[k]);
    probed = nowait_reads_.load(std::memory_order_relaxed);  // (not when the kernel refused RWF_NOWAIT)
  }
  if (probed && io_.fadvise != nullptr) {
    int64_t cold = 0;
    for (size_t k = 0; k < runs.size(); ++k) cold += !cached[k];
    for (size_t k = 0; k < runs.size() && cold > 1; ++k) {
      if (cached[k]) continue;
      // A hint: an error here only loses the overlap, and the read below reports any real fault.
      io_.fadvise(fd_, kHeaderBytes + runs[k].first * record_bytes_, runs[k].n * record_bytes_, POSIX_FADV_WILLNEED);
    }
  }
  for (size_t k = 0; k < runs.size(); ++k) {
    const RecordRun& run = runs[k];
    if (!cached[k]) RETURN_IF_ERROR_(TransferRecords(/*write=*/false, run.first, run.n, run.records));
    RETURN_IF_ERROR_(CheckRecords(run.first, run.n, run.records));
  }
  return absl::OkStatus();
}

absl::Status TieredRowFile::WriteRecords(int64_t first, int64_t n, char* const* records) {
  if (first >= 0 && n >= 0 && first <= layout_.num_rows - n) {
    for (int64_t i = 0; i < n; ++i) StampRecord(layout_, records[i]);
  }
  return TransferRecords(/*write=*/true, first, n, records);
}

absl::Status TieredRowFile::DropCachedRecords(int64_t first, int64_t n) {
  if (io_.sync_file_range == nullptr || n <= 0) return absl::OkStatus();
  const off_t offset = kHeaderBytes + first * record_bytes_;
  const off_t bytes = n * record_bytes_;
  while (io_.sync_file_range(fd_, offset, bytes,
                             SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER) != 0) {
    if (errno == EINTR) continue;
    if (errno == ENOSYS || errno == EINVAL || errno == ESPIPE) return absl::OkStatus();  // not supported here
    return IoError(errno, absl::StrCat(What(), ": cannot write ", Rows(first, n), " to the device"));
  }
  if (io_.fadvise != nullptr) io_.fadvise(fd_, offset, bytes, POSIX_FADV_DONTNEED);  // a hint
  return absl::OkStatus();
}

absl::Status TieredRowFile::Grow(int64_t num_rows) {
  if (num_rows <= layout_.num_rows) return absl::OkStatus();
  TieredRowLayout grown = layout_;
  grown.num_rows = num_rows;
  RETURN_IF_ERROR_(grown.Validate(What()));
  const int64_t old_size = kHeaderBytes + layout_.num_rows * record_bytes_;
  const int64_t size = kHeaderBytes + num_rows * record_bytes_;
  const std::string growing = absl::StrCat(What(), ": cannot grow it from ", layout_.num_rows, " to ", num_rows,
                                           " rows (", size - old_size, " more bytes)");
  if (::fallocate(fd_, 0, old_size, size - old_size) != 0) {
    const int err = errno;
    if (err != EOPNOTSUPP && err != ENOSYS) {
      (void)::ftruncate(fd_, old_size);  // a partly reserved extension goes
      return IoError(err, growing);
    }
    if (::ftruncate(fd_, size) != 0) return IoError(errno, growing);
  }
  std::vector<char> header = EncodeHeader(grown);
  struct iovec iov = {header.data(), header.size()};
  if (const absl::Status s = Transfer(/*write=*/true, &iov, 1, 0, -1, 0); !s.ok()) {
    (void)::ftruncate(fd_, old_size);
    return s;
  }
  layout_.num_rows = num_rows;
  return absl::OkStatus();
}

absl::Status TieredRowFile::Sync() {
  while (io_.fsync(fd_) != 0) {
    if (errno == EINTR) continue;
    return IoError(errno, absl::StrCat(What(), ": fsync failed"));
  }
  return absl::OkStatus();
}

}  // namespace tf_embed_ops
