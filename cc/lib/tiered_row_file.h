// The on-disk tier of a tiered table (docs/tiered_storage.md, "The row file"): the records of rows [0, num_rows),
// each holding the row's weights and all its optimizer slots in their storage types, then a CRC32C of the record,
// kept LOG-STRUCTURED: a record lives in one of `physical_slots` record slots (num_rows plus spare slots), a DRAM
// location map row -> slot says which, and every write appends the records it writes to the current free segment
// (`segment_slots` consecutive slots) with one pwritev, so a batch of write-backs of random rows is one sequential
// write instead of one system call per row.  A row's previous slot becomes free; a segment whose slots are all
// free is reused; when free segments run low the segment with the fewest live records is cleaned (read with one
// pread, its live records appended again).  The map is written into the file by Sync (with a generation and a
// CRC, then the header marks the file clean), so mode "open" can train on the file again; a file that was being
// written when its process stopped (no Sync after the last write) is refused on Open: its map is stale, and the
// table is restored from its checkpoint (the row file is never the only copy of checkpointed state).
//
// Layout (little-endian):
//   header (kHeaderBytes, zero-padded): magic "TFEROWS1", format version (u32), header bytes (u32), num_rows
//     (i64), buffer count (u32), record bytes (u32), per buffer (at 32 + 16 b) its storage type (u32: 0 float32,
//     1 bfloat16, 2 float16) and width in elements (i64); at 288 physical slots (i64), segment slots (u32), state
//     (u32: 1 clean, the map region is current; 0 being written), generation (u64); at 320 the CRC32C of the
//     bytes before it.
//   record slots: slot s at kHeaderBytes + s * record_bytes.  A record: buffer 0 (the table row), buffer 1 + k
//     (slot k), each padded to a multiple of 4 bytes so float32 buffers stay aligned in memory, then the CRC32C
//     (u32) of the bytes before it.
//   map region (after the slots): generation (u64), num_rows (i64), per row its slot (u32; 0xffffffff: never
//     written), then the CRC32C of the region before it.
// The whole file is reserved at creation (fallocate), so a full disk shows at creation (or Grow) rather than in
// the middle of a step.  Format version 1 (one record per row at a fixed place) is refused with an error saying
// to restore the table from its checkpoint into a new row file.
//
// DRAM beside the records: the map (4 bytes per row), the owner of each slot (4 bytes per physical slot, about 5
// bytes per row), a live count and a flag per segment, and one segment's records for cleaning.
//
// Thread safety: appends (WriteRecords, WriteRows, cleaning) are serialised by one mutex; reads look the map up
// and read under a shared lock that an append takes exclusively only to publish new locations, so reads run
// beside an append's write.  A slot a reader was sent to is not reused before that reader is done (a segment is
// freed only under the exclusive lock).  Grow and Sync must not run concurrently with other calls.
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
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
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
  // The location map holds 32-bit slot numbers: rows and their spare slots must stay below 2^32 - 1.
  static constexpr int64_t kMaxRows = int64_t{3} << 30;

  int64_t num_rows = 0;
  std::vector<StorageType> types;
  std::vector<int64_t> widths;

  // Checks the geometry (1..kMaxBuffers buffers, widths in [1, kMaxWidth], num_rows in [1, kMaxRows] and a file
  // size that fits int64); `what` names the table in the error.
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

// Cleaning's counters (cumulative): segments cleaned and the live records they re-appended.
struct TieredLogStats {
  int64_t segments_cleaned = 0;
  int64_t records_moved = 0;
  int64_t free_segments = 0;  // now
};

class TieredRowFile {
 public:
  static constexpr int64_t kHeaderBytes = 4096;
  static constexpr uint32_t kFormatVersion = 2;
  static constexpr uint32_t kNoSlot = 0xffffffffu;
  // The most slots a segment has (about 1 MiB of W1's 516-byte records); small tables get smaller segments.
  static constexpr int64_t kMaxSegmentSlots = 2048;

  // Slots per segment and the physical slots of a table of `num_rows` rows: num_rows plus a quarter spare (at least
  // three segments), rounded up to whole segments.  The spare bounds cleaning's work: the emptiest segment is at
  // most 1 / 1.25 = 80% live on average, so each freed slot costs at most 4 moved records, and much less with
  // skewed write-backs.
  static int64_t SegmentSlotsFor(int64_t num_rows);
  static int64_t PhysicalSlotsFor(int64_t num_rows, int64_t segment_slots);
  // DRAM the location map takes for `num_rows` rows (the map and the slots' owners): about 9 bytes per row.
  static int64_t MapBytesFor(int64_t num_rows);

  // A new file at `path` (an existing file is refused: AlreadyExists), with the header written and space for
  // every slot and the map reserved.  `table` names the table in errors.  Every row reads as never written.
  static absl::StatusOr<std::unique_ptr<TieredRowFile>> Create(const std::string& path, const std::string& table,
                                                               const TieredRowLayout& layout,
                                                               RowFileIo io = RowFileIo::Posix());
  // An existing file whose header (magic, version, CRC, geometry), size and map match `layout` and that was
  // closed cleanly (Sync after its last write); else an error naming the table, the path and what differs.
  static absl::StatusOr<std::unique_ptr<TieredRowFile>> Open(const std::string& path, const std::string& table,
                                                             const TieredRowLayout& layout,
                                                             RowFileIo io = RowFileIo::Posix());
  ~TieredRowFile();
  TieredRowFile(const TieredRowFile&) = delete;
  TieredRowFile& operator=(const TieredRowFile&) = delete;

  // Reads rows [first, first + n) into records[0..n) (record_bytes each) and checks each one's CRC.  On an
  // error the destinations hold unspecified bytes.
  absl::Status ReadRecords(int64_t first, int64_t n, char* const* records) const;
  // ReadRecords of several runs of rows (ascending, disjoint), as one batch: the records are read in the order of
  // their slots, consecutive slots in one preadv; every such run the page cache holds is read at once (preadv2
  // with RWF_NOWAIT); the reads of the others are all started (POSIX_FADV_WILLNEED) before the first is waited
  // for, so a batch of cold rows waits for the device about once, not once per run.  On an error: the error of
  // the first row (in the runs' order) that is never written or corrupted, or the first read that failed; the
  // destinations hold unspecified bytes.
  absl::Status ReadRuns(const std::vector<RecordRun>& runs) const;
  // Stamps each record's CRC, then appends rows [first, first + n).  On an error each row holds its old or its
  // new record.
  absl::Status WriteRecords(int64_t first, int64_t n, char* const* records);
  // The same for any rows (in [0, num_rows), any order; a row given twice keeps the later record): one pwritev
  // per segment the batch spans.
  absl::Status WriteRows(const int64_t* rows, int64_t n, char* const* records);
  // Makes the file reopenable: fsyncs the records, writes the map (next generation, CRC), fsyncs, then marks the
  // header clean and fsyncs.  The next write marks the header "being written" again (one header write and fsync)
  // before it writes a record.
  absl::Status Sync();
  // Writes the dirty pages of the records of rows [first, first + n) to the device, waits, and drops them from the
  // page cache.  For after a bulk write (initialisation, a restore): the kernel caches a large write in large
  // folios, and on ext4 a small write into a large folio walks every block of the folio; records read again come
  // back in page-size folios.  (The file is also opened with POSIX_FADV_RANDOM: no readahead around a miss.)  An
  // I/O error of the write is returned.
  absl::Status DropCachedRecords(int64_t first, int64_t n);
  // Extends the table to `num_rows` rows (a dynamic table's rows grow; fewer than now: nothing to do): the new
  // slots and the larger map are reserved (fallocate) and the header rewritten.  A full disk fails here, before
  // any record is written, and leaves the file as it was.  The new rows read as never written.  Must not run
  // concurrently with any other call on the file.
  absl::Status Grow(int64_t num_rows);

  // The byte offset of row `row`'s record now, or -1 when it was never written (tests, tools).
  int64_t RecordOffset(int64_t row) const;
  TieredLogStats log_stats() const;
  const TieredRowLayout& layout() const { return layout_; }
  const std::string& path() const { return path_; }
  const std::string& table() const { return table_; }
  int64_t record_bytes() const { return record_bytes_; }
  int64_t physical_slots() const { return physical_slots_; }
  int64_t segment_slots() const { return segment_slots_; }
  // The file's size: the header, the record slots and the map region.
  int64_t file_bytes() const { return MapRegionAt() + MapRegionBytes(layout_.num_rows); }
  // DRAM of the map, the owners, the segments' state and the cleaning buffer.
  int64_t DramBytes() const;

 private:
  // One record of a read: its row, slot and destination.
  struct Piece {
    uint32_t slot;
    int64_t row;
    char* record;
    int64_t index = 0;  // its position in the call's list (ReadRuns reads them in slot order)
  };

  TieredRowFile(int fd, std::string path, std::string table, TieredRowLayout layout, RowFileIo io,
                int64_t segment_slots);
  // "table 'x', row file '/p'": the start of every error.
  std::string What() const;
  // Sizes the map, the owners and the segments for layout_.num_rows and physical_slots_ (new slots free).
  void SizeState(int64_t old_physical);
  std::vector<char> EncodeHeader(uint32_t state, uint64_t generation) const;
  absl::Status WriteHeader(uint32_t state, uint64_t generation);
  int64_t MapRegionAt() const { return kHeaderBytes + physical_slots_ * record_bytes_; }
  static int64_t MapRegionBytes(int64_t num_rows) { return 16 + 4 * num_rows + 4; }
  // Reads the map region and builds the owners and live counts; an error when it does not match the header.
  absl::Status LoadMap(uint64_t generation);
  // All of the iovecs' bytes at `offset`, looping over short transfers; `rows` names them in errors.
  absl::Status Transfer(bool write, struct iovec* iov, int iovcnt, off_t offset,
                        absl::FunctionRef<std::string()> rows) const;
  // Reads pieces [begin, end) (consecutive slots) into their records, preadv calls of at most 1024 records.
  absl::Status ReadPieces(const Piece* pieces, int64_t n) const;
  // Reads the pieces only if all of them are in the page cache (RWF_NOWAIT; at most 1024 records); else false.
  bool ReadPiecesIfCached(const Piece* pieces, int64_t n) const;
  // The CRC of a record read for `row`: a corrupted record is an error naming the row.
  absl::Status CheckRecord(int64_t row, const char* record) const;
  // Whether a record's stored CRC matches its payload (CheckRecord without the error).
  bool RecordCrcOk(const char* record) const;
  // Appends (append_mu_ held; CRCs already stamped): one pwritev per segment the records span, each piece's new
  // locations published after its write.  A write that fails gives back the segment it took if it is still empty,
  // so a failed write (a full disk) never keeps cleaning's reserve as the segment being appended to.
  absl::Status AppendLocked(const int64_t* rows, int64_t n, char* const* records);
  // The current segment has a free slot after this (cleans when free segments run low).
  absl::Status EnsureRoomLocked();
  // Cleans the segment with the fewest live records (not the current one): reads it, appends its live records.
  absl::Status CleanOneLocked();
  // Before the first write after a Sync (or an Open): the header says "being written", on the device.
  absl::Status MarkWritingLocked();
  absl::Status FsyncLocked();

  int fd_;
  std::string path_;
  std::string table_;
  TieredRowLayout layout_;
  int64_t record_bytes_;
  RowFileIo io_;
  const int64_t segment_slots_;
  int64_t physical_slots_ = 0;

  // Appends, cleaning, Sync and Grow (and everything below but the map's readers).
  std::mutex append_mu_;
  // map_ and owner_: shared by readers for a lookup and its read; exclusive to publish locations.
  mutable std::shared_mutex map_mu_;
  std::vector<uint32_t> map_;            // row -> slot (kNoSlot: never written)
  std::vector<uint32_t> owner_;          // slot -> row (kNoSlot: free)
  std::vector<uint32_t> live_;           // per segment: slots owned
  std::vector<uint8_t> is_free_;         // per segment: in free_segments_
  std::vector<uint32_t> free_segments_;  // a stack; the lowest segment on top at creation
  int64_t current_ = -1;                 // the segment being appended to
  int64_t next_slot_ = 0;                // its next free slot
  bool cleaning_ = false;
  bool clean_ = false;                    // the header says clean (no write since the last Sync)
  uint64_t generation_ = 0;               // of the map last written
  std::unique_ptr<char[]> clean_buffer_;  // one segment of records, allocated at the first cleaning
  TieredLogStats log_stats_;
  // Cleared when the kernel or filesystem refuses RWF_NOWAIT (EOPNOTSUPP/EINVAL/ENOSYS): batches then read run by
  // run.
  mutable std::atomic<bool> nowait_reads_{true};
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_TIERED_ROW_FILE_H_
