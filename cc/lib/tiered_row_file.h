// The on-disk tier of a tiered table (docs/tiered_tables.md): one fixed-size record per row id in
// [0, num_rows), holding the row's weights and all its optimizer slots in their storage types, then a CRC32C of
// the record.  Record r starts at kHeaderBytes + r * record_bytes, so a static table needs no index: its id space
// is dense and known, and a key-value engine would add an index, compaction and write amplification for nothing.
//
// Layout (little-endian):
//   header (kHeaderBytes, zero-padded): magic "TFEROWS1", format version (u32), header bytes (u32), num_rows
//     (i64), buffer count (u32), record bytes (u32), per buffer its storage type (u32: 0 float32, 1 bfloat16,
//     2 float16) and width in elements (i64), then the CRC32C of everything before it.
//   record: buffer 0 (the table row), buffer 1 + k (slot k), each padded to a multiple of 4 bytes so float32
//     buffers stay aligned in memory, then the CRC32C (u32) of the bytes before it.
// A file is created with its whole size reserved (fallocate), so a full disk shows at creation rather than in
// the middle of a step, and its records read as all-zero bytes until written: such a record is reported as
// never written (a new file must be initialised row by row), any other CRC mismatch as corrupted.
//
// Every pread/pwrite/fsync result is checked; errors are absl::Status naming the table, the row and the path.
// The I/O calls go through RowFileIo so tests can inject a full disk or a failing device.
#ifndef TF_EMBED_OPS_CC_LIB_TIERED_ROW_FILE_H_
#define TF_EMBED_OPS_CC_LIB_TIERED_ROW_FILE_H_

#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cc/lib/storage_types.h"

namespace tf_embed_ops {

// CRC32C (Castagnoli), as iSCSI and ext4 use it: Crc32c("123456789") == 0xe3069283.  Uses the SSE4.2 crc32
// instruction where the CPU has it, else a table; both give the same value.
uint32_t Crc32c(const void* data, size_t size);

// The geometry of a table's records: buffer 0 is the table (width dim), buffer 1 + k slot k.
struct TieredRowLayout {
  static constexpr int64_t kMaxBuffers = 16;
  static constexpr int64_t kMaxWidth = int64_t{1} << 20;

  int64_t num_rows = 0;
  std::vector<StorageType> types;
  std::vector<int64_t> widths;

  // Checks the geometry (1..kMaxBuffers buffers, widths in [1, kMaxWidth], num_rows >= 1 and a file size that
  // fits int64); `what` names the table in the error.
  absl::Status Validate(const std::string& what) const;
  int64_t num_buffers() const { return static_cast<int64_t>(types.size()); }
  // Byte offset of buffer b in a record (each buffer padded to 4 bytes).
  int64_t offset(int64_t b) const;
  int64_t payload_bytes() const { return offset(num_buffers()); }
  // Payload + the CRC32C.
  int64_t record_bytes() const { return payload_bytes() + 4; }
  bool operator==(const TieredRowLayout& o) const {
    return num_rows == o.num_rows && types == o.types && widths == o.widths;
  }
  std::string DebugString() const;
};

// buffers[b] (layout.widths[b] floats) -> the record's buffer b in its storage type (16-bit: round to nearest,
// as TensorFlow's casts), and the record's CRC.
void EncodeRecord(const TieredRowLayout& layout, const float* const* buffers, char* record);
// The record's buffers widened to float32.
void DecodeRecord(const TieredRowLayout& layout, const char* record, float* const* buffers);
// Writes the CRC of the record's payload into its last 4 bytes.
void StampRecord(const TieredRowLayout& layout, char* record);

// The system calls the file uses (replaceable in tests); each has the POSIX signature and errno convention.
// preadv2 (called with RWF_NOWAIT only) and fadvise may be null: a batch of reads then goes one preadv at a time;
// sync_file_range may be null: DropCachedRecords then does nothing.
struct RowFileIo {
  ssize_t (*preadv)(int fd, const struct iovec* iov, int iovcnt, off_t offset);
  ssize_t (*pwritev)(int fd, const struct iovec* iov, int iovcnt, off_t offset);
  int (*fsync)(int fd);
  ssize_t (*preadv2)(int fd, const struct iovec* iov, int iovcnt, off_t offset, int flags);
  int (*fadvise)(int fd, off_t offset, off_t len, int advice);
  int (*sync_file_range)(int fd, off_t offset, off_t nbytes, unsigned int flags);
  static RowFileIo Posix();
};

// A run of consecutive records [first, first + n) and where each of them is in memory (records[0..n)).
struct RecordRun {
  int64_t first;
  int64_t n;
  char* const* records;
};

class TieredRowFile {
 public:
  static constexpr int64_t kHeaderBytes = 4096;
  static constexpr uint32_t kFormatVersion = 1;

  // A new file at `path` (an existing file is refused: AlreadyExists), with the header written and space for
  // every record reserved.  `table` names the table in errors.
  static absl::StatusOr<std::unique_ptr<TieredRowFile>> Create(const std::string& path, const std::string& table,
                                                               const TieredRowLayout& layout,
                                                               RowFileIo io = RowFileIo::Posix());
  // An existing file whose header (magic, version, CRC, geometry) and size match `layout`; else an error naming
  // the table, the path and the first field that differs.
  static absl::StatusOr<std::unique_ptr<TieredRowFile>> Open(const std::string& path, const std::string& table,
                                                             const TieredRowLayout& layout,
                                                             RowFileIo io = RowFileIo::Posix());
  ~TieredRowFile();
  TieredRowFile(const TieredRowFile&) = delete;
  TieredRowFile& operator=(const TieredRowFile&) = delete;

  // Reads records [first, first + n) into records[0..n) (record_bytes each) and checks each one's CRC.  On an
  // error the destinations hold unspecified bytes.
  absl::Status ReadRecords(int64_t first, int64_t n, char* const* records) const;
  // ReadRecords of several runs (ascending, disjoint), as one batch: every run whose records are in the page cache
  // is read at once (preadv2 with RWF_NOWAIT); the reads of the others are all started (POSIX_FADV_WILLNEED)
  // before the first is waited for, so a batch of cold rows waits for the device about once, not once per run.
  // On an error: the error of the first run (in order) that failed; the destinations hold unspecified bytes.
  absl::Status ReadRuns(const std::vector<RecordRun>& runs) const;
  // Stamps each record's CRC, then writes records [first, first + n).  On an error some of them may be written.
  absl::Status WriteRecords(int64_t first, int64_t n, char* const* records);
  absl::Status Sync();
  // Writes the dirty pages of records [first, first + n) to the device, waits, and drops them from the page cache.
  // For after a bulk write (initialisation, a restore): the kernel caches a large write in large folios, and on
  // ext4 a small write into a large folio walks every block of the folio, which made each later 516-byte
  // write-back about 4x dearer; records read again come back in page-size folios.  (The file is also opened
  // with POSIX_FADV_RANDOM: no readahead around a miss.)  An I/O error of the write is returned.
  absl::Status DropCachedRecords(int64_t first, int64_t n);
  // Extends the file to `num_rows` records (a dynamic table's rows grow; fewer than now: nothing to do): the new
  // space is reserved (fallocate) and the header rewritten.  A full disk fails here, before any record is written,
  // and leaves the file as it was.  The new records read as never written.  Must not run concurrently with any other
  // call on the file.
  absl::Status Grow(int64_t num_rows);

  const TieredRowLayout& layout() const { return layout_; }
  const std::string& path() const { return path_; }
  const std::string& table() const { return table_; }
  int64_t record_bytes() const { return record_bytes_; }

 private:
  TieredRowFile(int fd, std::string path, std::string table, TieredRowLayout layout, RowFileIo io);
  // "table 'x', row file '/p'": the start of every error.
  std::string What() const;
  // Records [first, first + n) from or to records[0..n), in preadv/pwritev calls of at most IOV_MAX records.
  absl::Status TransferRecords(bool write, int64_t first, int64_t n, char* const* records) const;
  // The CRC of records [first, first + n): a never-written (all-zero) or corrupted record is an error naming it.
  absl::Status CheckRecords(int64_t first, int64_t n, char* const* records) const;
  // Reads a run only if all of it is in the page cache (RWF_NOWAIT; runs of at most 1024 records); else false.
  bool ReadRunIfCached(const RecordRun& run) const;
  // All of the iovecs' bytes at `offset`, looping over short transfers.
  absl::Status Transfer(bool write, struct iovec* iov, int iovcnt, off_t offset, int64_t first, int64_t n) const;

  int fd_;
  std::string path_;
  std::string table_;
  TieredRowLayout layout_;
  int64_t record_bytes_;
  RowFileIo io_;
  // Cleared when the kernel or filesystem refuses RWF_NOWAIT (EOPNOTSUPP/EINVAL/ENOSYS): batches then read run by
  // run.
  mutable std::atomic<bool> nowait_reads_{true};
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_TIERED_ROW_FILE_H_
