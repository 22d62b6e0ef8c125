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
                 kBuffersAt = 32, kBufferBytes = 16, kPhysicalAt = 288, kSegmentAt = 296, kStateAt = 300,
                 kGenerationAt = 304, kHeaderCrcAt = 320;
constexpr uint32_t kStateWriting = 0, kStateClean = 1;
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
// The crc32 instruction takes 3 cycles and can start one a cycle: one chain of them runs at a third of the speed
// the core allows.  So blocks of 3 * kLane bytes are summed as three independent lanes (each register starts from
// 0 but the first's), and the lanes are joined by linearity: the register after lane a then lane b is the register
// of a moved over kLane zero bytes, xor b's.  Moving a register over kLane zero bytes is linear in its 32 bits, so
// it is four lookups in tables built once (by feeding zeros through the bytewise table).
constexpr size_t kCrcLane = 128;

struct CrcZerosShift {
  std::array<std::array<uint32_t, 256>, 4> table;
  CrcZerosShift() {
    const std::array<unsigned char, kCrcLane> zeros{};
    for (uint32_t j = 0; j < 4; ++j) {
      for (uint32_t b = 0; b < 256; ++b) table[j][b] = Crc32cTable(b << (8 * j), zeros.data(), zeros.size());
    }
  }
  uint32_t operator()(uint32_t crc) const {
    return table[0][crc & 0xffu] ^ table[1][(crc >> 8) & 0xffu] ^ table[2][(crc >> 16) & 0xffu] ^ table[3][crc >> 24];
  }
};

__attribute__((target("sse4.2"))) uint32_t Crc32cSse42(uint32_t crc, const unsigned char* p, size_t n) {
  uint64_t c = crc;
  if (n >= 3 * kCrcLane) {
    static const CrcZerosShift shift;
    for (; n >= 3 * kCrcLane; n -= 3 * kCrcLane, p += 3 * kCrcLane) {
      uint64_t a = c, b = 0, d = 0;
      for (size_t i = 0; i < kCrcLane; i += 8) {
        uint64_t va, vb, vd;
        std::memcpy(&va, p + i, 8);
        std::memcpy(&vb, p + kCrcLane + i, 8);
        std::memcpy(&vd, p + 2 * kCrcLane + i, 8);
        a = _mm_crc32_u64(a, va);
        b = _mm_crc32_u64(b, vb);
        d = _mm_crc32_u64(d, vd);
      }
      c = shift(shift(static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b)) ^ static_cast<uint32_t>(d);
    }
  }
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

}  // namespace

// The CRC32C register after `size` more bytes (start from ~0u, finish with ~).
static uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
#if defined(__x86_64__)
  static const bool has_sse42 = __builtin_cpu_supports("sse4.2");
  if (has_sse42) return Crc32cSse42(crc, p, size);
#endif
  return Crc32cTable(crc, p, size);
}

uint32_t Crc32c(const void* data, size_t size) { return ~Crc32cExtend(~0u, data, size); }

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
  // (The file: the header, num_rows plus a quarter spare record slots, the map; the map's slot numbers are 32-bit.)
  const int64_t max_rows = std::min(kMaxRows, (INT64_MAX / 4) / record_bytes());
  if (num_rows < 1 || num_rows > max_rows) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": num_rows is ", num_rows, "; allowed [1, ", max_rows,
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

namespace {

// The rows of pieces [0, n) for an error: "rows [a, b)" when consecutive, else the first few.
template <typename P>
std::string RowsOf(const P* pieces, int64_t n) {
  bool consecutive = true;
  for (int64_t i = 1; i < n && consecutive; ++i) consecutive = pieces[i].row == pieces[i - 1].row + 1;
  if (consecutive) return Rows(pieces[0].row, n);
  std::string out = "rows ";
  for (int64_t i = 0; i < std::min<int64_t>(n, 4); ++i) absl::StrAppend(&out, i ? ", " : "", pieces[i].row);
  if (n > 4) absl::StrAppend(&out, " and ", n - 4, " more");
  return out;
}

// iovecs for `n` records of `record_bytes` at pointers[0..n), adjacent records merged into one iovec.
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

}  // namespace

namespace {

// iovecs for pieces [0, n) (consecutive slots), adjacent destinations merged; returns how many.
template <typename P>
int PieceIovecs(const P* pieces, int64_t n, int64_t record_bytes, struct iovec* iov) {
  int count = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (count > 0 && static_cast<char*>(iov[count - 1].iov_base) + iov[count - 1].iov_len == pieces[i].record) {
      iov[count - 1].iov_len += static_cast<size_t>(record_bytes);
    } else {
      iov[count++] = {pieces[i].record, static_cast<size_t>(record_bytes)};
    }
  }
  return count;
}

}  // namespace

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
