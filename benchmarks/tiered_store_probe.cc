// The disk tier of a tiered table, measured alone: what the stores a tiered table could sit on cost for the I/O a
// real training run asks of them (docs/design_notes.md, "Tiered tables: the row file").
//
// The I/O is made exactly as a tiered table makes it: a CLOCK cache of `capacity` rows is simulated over the
// steps' ids (ids.bin: `steps` x `ids_per_step` int64), every row a step touches is updated (so dirty), each miss
// reads the row's record and evicts a CLOCK victim, and a dirty victim is written back.  The simulation runs
// first, untimed; then, per step, the store is asked for the step's write-backs (the victims' records) and its
// reads (the misses' records), and that is what is timed.  Engines:
//
//   rowfile  the tiered table's row file: record r at r * record_bytes; one pread / pwrite per run of
//            consecutive records (what TieredRowFile does; POSIX_FADV_RANDOM; bulk-initialised, then the bulk
//            write's pages written and dropped, as the table does).
//   log      write-backs appended to a log (one pwrite per step, records contiguous), reads from each row's
//            current location (a DRAM map row -> offset).  No cleaning of stale records: a lower bound of a
//            log-structured design's cost.
//   rocksdb  RocksDB (the store FBGEMM's SSD tables use): key = the row id (8 bytes big-endian), value = the
//            record; MultiGet of the step's misses, one WriteBatch of its write-backs, the write-ahead log off (a
//            checkpoint, not the store, is what a restart restores), no compression, a bloom filter, a
//            `block_cache_mib` LRU block cache, `memtable_mib` write buffers.  Its background flushes and
//            compactions run on its own threads: they are in the process CPU time reported.
//
// Every record read is checked: its first 16 bytes hold the row id and the number of times it was written, which
// the probe tracks, so a store that returned a stale or wrong record fails the run (exit 1).
//
// Usage: tiered_store_probe ENGINE DIR IDS_FILE STEPS IDS_PER_STEP NUM_ROWS RECORD_BYTES CAPACITY WARMUP
//                           [BLOCK_CACHE_MIB MEMTABLE_MIB]
// Prints one JSON object.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

// RocksDB is optional: without its headers (Debian's librocksdb-dev), or built with
// -DTIERED_STORE_PROBE_NO_ROCKSDB (what the Python side passes when it does not link the library), the probe has
// the other two engines.
#if !defined(TIERED_STORE_PROBE_NO_ROCKSDB) && __has_include("rocksdb/db.h")
#define TIERED_STORE_PROBE_ROCKSDB 1
#include "rocksdb/cache.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/options.h"
#include "rocksdb/table.h"
#include "rocksdb/write_batch.h"
#endif

namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "tiered_store_probe: %s\n", what.c_str());
  std::exit(2);
}

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double CpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Resident memory now (KiB), from /proc/self/statm.
int64_t RssKib() {
  long pages_total = 0, pages_resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr || std::fscanf(f, "%ld %ld", &pages_total, &pages_resident) != 2) Die("/proc/self/statm");
  std::fclose(f);
  return pages_resident * (sysconf(_SC_PAGESIZE) / 1024);
}

// One step's I/O: the rows whose records are written back (ascending), then the rows read (ascending).
struct StepIo {
  std::vector<int64_t> writes;
  std::vector<int64_t> reads;
};

// CLOCK over `capacity` slots, every touched row dirty; what each step reads and writes back.
std::vector<StepIo> Simulate(const std::vector<int64_t>& ids, int64_t steps, int64_t per_step, int64_t num_rows,
                             int64_t capacity) {
  std::vector<int32_t> slot_of(num_rows, -1);
  std::vector<int64_t> row_of(capacity, -1);
  std::vector<uint8_t> referenced(capacity, 0), dirty(capacity, 0), pinned(capacity, 0);
  int64_t hand = 0, used = 0;
  std::vector<StepIo> out(steps);
  std::vector<int64_t> distinct;
  for (int64_t s = 0; s < steps; ++s) {
    distinct.assign(ids.begin() + s * per_step, ids.begin() + (s + 1) * per_step);
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    if (static_cast<int64_t>(distinct.size()) > capacity) Die("a step's distinct rows exceed the capacity");
    StepIo& io = out[s];
    std::vector<int32_t> step_slots;
    for (int64_t row : distinct) {  // hits first: pinned, so the misses' victims are never this step's rows
      if (slot_of[row] >= 0) {
        referenced[slot_of[row]] = 1;
        pinned[slot_of[row]] = 1;
        step_slots.push_back(slot_of[row]);
      }
    }
    for (int64_t row : distinct) {
      if (slot_of[row] >= 0) continue;
      int32_t slot;
      if (used < capacity) {
        slot = static_cast<int32_t>(used++);
      } else {
        for (;;) {
          const int64_t h = hand;
          hand = (hand + 1) % capacity;
          if (pinned[h]) continue;
          if (referenced[h]) {
            referenced[h] = 0;
            continue;
          }
          slot = static_cast<int32_t>(h);
          break;
        }
        if (dirty[slot]) io.writes.push_back(row_of[slot]);
        slot_of[row_of[slot]] = -1;
      }
      io.reads.push_back(row);
      row_of[slot] = row;
      slot_of[row] = slot;
      referenced[slot] = 1;
      pinned[slot] = 1;
      step_slots.push_back(slot);
    }
    for (int32_t slot : step_slots) {
      pinned[slot] = 0;
      dirty[slot] = 1;
    }
    std::sort(io.writes.begin(), io.writes.end());
  }
  return out;
}

// The stores.  Each record's first 16 bytes: row id and write count (checked on every read).
class Store {
 public:
  virtual ~Store() = default;
  virtual void Write(const std::vector<int64_t>& rows, const std::vector<char>& records) = 0;
  virtual void Read(const std::vector<int64_t>& rows, std::vector<char>* records) = 0;
  virtual int64_t DiskBytes() = 0;
};

void FullPwrite(int fd, const char* p, size_t n, off_t at) {
  while (n > 0) {
    const ssize_t w = pwrite(fd, p, n, at);
    if (w <= 0) Die(std::string("pwrite: ") + std::strerror(errno));
    p += w;
    n -= w;
    at += w;
  }
}

void FullPread(int fd, char* p, size_t n, off_t at) {
  while (n > 0) {
    const ssize_t r = pread(fd, p, n, at);
    if (r <= 0) Die(std::string("pread: ") + (r == 0 ? "end of file" : std::strerror(errno)));
    p += r;
    n -= r;
    at += r;
  }
}

// Writes every record once, in row order, in large pieces (what a table's initialisation does).
template <typename Put>
void Initialise(int64_t num_rows, int64_t record_bytes, const Put& put) {
  const int64_t chunk = std::max<int64_t>(1, (int64_t{8} << 20) / record_bytes);
  std::vector<char> buf(chunk * record_bytes, 0);
  for (int64_t first = 0; first < num_rows; first += chunk) {
    const int64_t n = std::min(chunk, num_rows - first);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t stamp[2] = {first + i, 0};
      std::memcpy(buf.data() + i * record_bytes, stamp, sizeof(stamp));
    }
    put(first, n, buf.data());
  }
}

// A file of records, initialised in row order in large writes whose pages are then written and dropped from the
// page cache, opened for random access (what the tiered table does with its row file).
class FileStore : public Store {
 protected:
  FileStore(const std::string& path, int64_t num_rows, int64_t record_bytes) : path_(path), rb_(record_bytes) {
    fd_ = open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd_ < 0) Die("open " + path_);
    if (posix_fallocate(fd_, 0, num_rows * rb_) != 0) Die("fallocate");
    Initialise(num_rows, rb_,
               [&](int64_t first, int64_t n, const char* p) { FullPwrite(fd_, p, n * rb_, first * rb_); });
    sync_file_range(fd_, 0, 0, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
    posix_fadvise(fd_, 0, 0, POSIX_FADV_RANDOM);
  }
  ~FileStore() override {
    close(fd_);
    unlink(path_.c_str());
  }
  int64_t DiskBytes() override {
    struct stat st;
    fstat(fd_, &st);
    return st.st_blocks * 512;
  }

  const std::string path_;
  const int64_t rb_;
  int fd_;
};

// Record r at r * record_bytes, written in place.
class RowFile : public FileStore {
 public:
  RowFile(const std::string& dir, int64_t num_rows, int64_t record_bytes)
      : FileStore(dir + "/rows.bin", num_rows, record_bytes) {}
  void Write(const std::vector<int64_t>& rows, const std::vector<char>& records) override {
    Runs(rows, [&](size_t i, size_t n) { FullPwrite(fd_, records.data() + i * rb_, n * rb_, rows[i] * rb_); });
  }
  void Read(const std::vector<int64_t>& rows, std::vector<char>* records) override {
    Runs(rows, [&](size_t i, size_t n) { FullPread(fd_, records->data() + i * rb_, n * rb_, rows[i] * rb_); });
  }

 private:
  // fn(first index, count) per run of consecutive rows (rows ascending), as the table coalesces them.
  template <typename Fn>
  static void Runs(const std::vector<int64_t>& rows, const Fn& fn) {
    for (size_t i = 0; i < rows.size();) {
      size_t j = i + 1;
      while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
      fn(i, j - i);
      i = j;
    }
  }
};

// Every write appended at the end of the file, each row's current offset in a DRAM map (no cleaning).
class Log : public FileStore {
 public:
  Log(const std::string& dir, int64_t num_rows, int64_t record_bytes)
      : FileStore(dir + "/log.bin", num_rows, record_bytes), where_(num_rows), tail_(num_rows * record_bytes) {
    for (int64_t r = 0; r < num_rows; ++r) where_[r] = r * rb_;
  }
  void Write(const std::vector<int64_t>& rows, const std::vector<char>& records) override {
    if (rows.empty()) return;
    FullPwrite(fd_, records.data(), rows.size() * rb_, tail_);
    for (size_t i = 0; i < rows.size(); ++i) where_[rows[i]] = tail_ + static_cast<int64_t>(i) * rb_;
    tail_ += static_cast<int64_t>(rows.size()) * rb_;
  }
  void Read(const std::vector<int64_t>& rows, std::vector<char>* records) override {
    for (size_t i = 0; i < rows.size(); ++i) FullPread(fd_, records->data() + i * rb_, rb_, where_[rows[i]]);
  }

 private:
  std::vector<int64_t> where_;
  int64_t tail_;
};

#ifdef TIERED_STORE_PROBE_ROCKSDB
class Rocks : public Store {
 public:
  Rocks(const std::string& dir, int64_t num_rows, int64_t record_bytes, int64_t block_cache_mib, int64_t memtable_mib)
      : rb_(record_bytes), path_(dir + "/rocksdb") {
    rocksdb::Options options;
    options.create_if_missing = true;
    options.compression = rocksdb::kNoCompression;
    options.write_buffer_size = static_cast<size_t>(memtable_mib) << 20;
    options.max_write_buffer_number = 2;
    options.max_background_jobs = 2;
    options.max_open_files = -1;
    rocksdb::BlockBasedTableOptions table;
    table.block_cache = rocksdb::NewLRUCache(static_cast<size_t>(block_cache_mib) << 20);
    table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
    table.cache_index_and_filter_blocks = true;  // their memory inside the block cache's budget
    options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
    rocksdb::DB* db = nullptr;
    Check(rocksdb::DB::Open(options, path_, &db), "open");
    db_.reset(db);
    write_.disableWAL = true;
    Initialise(num_rows, rb_, [&](int64_t first, int64_t n, const char* p) {
      rocksdb::WriteBatch batch;
      for (int64_t i = 0; i < n; ++i) {
        Key(first + i, key_);
        batch.Put(rocksdb::Slice(key_, 8), rocksdb::Slice(p + i * rb_, rb_));
      }
      Check(db_->Write(write_, &batch), "initial write");
    });
    Check(db_->Flush(rocksdb::FlushOptions()), "flush");
    Check(db_->CompactRange(rocksdb::CompactRangeOptions(), nullptr, nullptr), "compact");
  }
  ~Rocks() override {
    db_.reset();
    std::string cmd = "rm -rf '" + path_ + "'";
    if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", path_.c_str());
  }
  void Write(const std::vector<int64_t>& rows, const std::vector<char>& records) override {
    rocksdb::WriteBatch batch;
    for (size_t i = 0; i < rows.size(); ++i) {
      Key(rows[i], key_);
      batch.Put(rocksdb::Slice(key_, 8), rocksdb::Slice(records.data() + i * rb_, rb_));
    }
    Check(db_->Write(write_, &batch), "write");
  }
  void Read(const std::vector<int64_t>& rows, std::vector<char>* records) override {
    const size_t n = rows.size();
    keys_.resize(n * 8);
    std::vector<rocksdb::Slice> slices(n);
    for (size_t i = 0; i < n; ++i) {
      Key(rows[i], &keys_[i * 8]);
      slices[i] = rocksdb::Slice(&keys_[i * 8], 8);
    }
    std::vector<rocksdb::PinnableSlice> values(n);
    std::vector<rocksdb::Status> statuses(n);
    db_->MultiGet(rocksdb::ReadOptions(), db_->DefaultColumnFamily(), n, slices.data(), values.data(), statuses.data(),
                  /*sorted_input=*/true);
    for (size_t i = 0; i < n; ++i) {
      Check(statuses[i], "get");
      if (static_cast<int64_t>(values[i].size()) != rb_) Die("rocksdb: a value of the wrong size");
      std::memcpy(records->data() + i * rb_, values[i].data(), rb_);
    }
  }
  int64_t DiskBytes() override {
    uint64_t live = 0;
    db_->GetIntProperty("rocksdb.total-sst-files-size", &live);
    return static_cast<int64_t>(live);
  }

 private:
  static void Key(int64_t row, char* out) {
    for (int b = 0; b < 8; ++b) out[b] = static_cast<char>(static_cast<uint64_t>(row) >> (56 - 8 * b));
  }
  static void Check(const rocksdb::Status& s, const char* what) {
    if (!s.ok()) Die(std::string("rocksdb ") + what + ": " + s.ToString());
  }
  const int64_t rb_;
  const std::string path_;
  std::unique_ptr<rocksdb::DB> db_;
  rocksdb::WriteOptions write_;
  char key_[8];
  std::vector<char> keys_;
};
#endif  // TIERED_STORE_PROBE_ROCKSDB

}  // namespace

int main(int argc, char** argv) {
  if (argc != 10 && argc != 12) Die("usage: see the comment at the top of tiered_store_probe.cc");
  const std::string engine = argv[1], dir = argv[2], ids_file = argv[3];
  const int64_t steps = std::atoll(argv[4]), per_step = std::atoll(argv[5]), num_rows = std::atoll(argv[6]);
  const int64_t rb = std::atoll(argv[7]), capacity = std::atoll(argv[8]), warmup = std::atoll(argv[9]);
  const int64_t block_cache_mib = argc == 12 ? std::atoll(argv[10]) : 8;
  const int64_t memtable_mib = argc == 12 ? std::atoll(argv[11]) : 32;
  if (steps <= warmup || per_step <= 0 || num_rows <= 0 || rb < 16 || capacity <= 0) Die("bad sizes");

  std::vector<int64_t> ids(steps * per_step);
  {
    std::ifstream f(ids_file, std::ios::binary);
    f.read(reinterpret_cast<char*>(ids.data()), static_cast<std::streamsize>(ids.size() * 8));
    if (!f) Die("could not read " + ids_file);
  }
  for (int64_t id : ids) {
    if (id < 0 || id >= num_rows) Die("an id out of range");
  }
  const std::vector<StepIo> io = Simulate(ids, steps, per_step, num_rows, capacity);
  ids = {};

  const int64_t rss_before = RssKib();
  std::unique_ptr<Store> store;
  const double t_init = Now();
  if (engine == "rowfile") {
    store = std::make_unique<RowFile>(dir, num_rows, rb);
  } else if (engine == "log") {
    store = std::make_unique<Log>(dir, num_rows, rb);
  } else if (engine == "rocksdb") {
#ifdef TIERED_STORE_PROBE_ROCKSDB
    store = std::make_unique<Rocks>(dir, num_rows, rb, block_cache_mib, memtable_mib);
#else
    Die("built without RocksDB (benchmarks/peers/setup_rocksdb.sh installs it)");
#endif
  } else {
    Die("unknown engine " + engine);
  }
  const double init_s = Now() - t_init;

  std::vector<int64_t> writes_of(num_rows, 0);  // the write count each record must carry
  std::vector<char> out, in;
  std::vector<double> step_ms;
  double cpu0 = 0, wall0 = 0;
  int64_t reads = 0, written = 0;
  for (int64_t s = 0; s < steps; ++s) {
    if (s == warmup) {
      cpu0 = CpuSeconds();
      wall0 = Now();
    }
    const StepIo& step = io[s];
    out.resize(step.writes.size() * rb);
    for (size_t i = 0; i < step.writes.size(); ++i) {
      const int64_t stamp[2] = {step.writes[i], ++writes_of[step.writes[i]]};
      std::memcpy(out.data() + i * rb, stamp, sizeof(stamp));
      std::memset(out.data() + i * rb + 16, static_cast<int>(s & 0xff), rb - 16);
    }
    in.resize(step.reads.size() * rb);
    const double t = Now();
    store->Write(step.writes, out);
    store->Read(step.reads, &in);
    const double ms = 1e3 * (Now() - t);
    if (s >= warmup) {
      step_ms.push_back(ms);
      reads += static_cast<int64_t>(step.reads.size());
      written += static_cast<int64_t>(step.writes.size());
    }
    for (size_t i = 0; i < step.reads.size(); ++i) {
      int64_t stamp[2];
      std::memcpy(stamp, in.data() + i * rb, sizeof(stamp));
      if (stamp[0] != step.reads[i] || stamp[1] != writes_of[step.reads[i]]) {
        Die(engine + ": row " + std::to_string(step.reads[i]) + " read back stale or wrong (write count " +
            std::to_string(stamp[1]) + ", expected " + std::to_string(writes_of[step.reads[i]]) + ")");
      }
    }
  }
  const double timed = static_cast<double>(steps - warmup);
  const double cpu_ms = 1e3 * (CpuSeconds() - cpu0) / timed, wall_ms = 1e3 * (Now() - wall0) / timed;
  std::vector<double> sorted = step_ms;
  std::sort(sorted.begin(), sorted.end());
  std::printf(
      "{\"engine\": \"%s\", \"timed_steps\": %lld, \"median_ms\": %.4f, \"mean_ms\": %.4f, \"p90_ms\": %.4f, "
      "\"cpu_ms_per_step\": %.4f, \"wall_ms_per_step\": %.4f, \"reads_per_step\": %.1f, \"writes_per_step\": %.1f, "
      "\"init_s\": %.2f, \"disk_bytes\": %lld, \"rss_store_mib\": %.1f}\n",
      engine.c_str(), static_cast<long long>(timed), sorted[sorted.size() / 2], wall_ms, sorted[sorted.size() * 9 / 10],
      cpu_ms, wall_ms, reads / timed, written / timed, init_s, static_cast<long long>(store->DiskBytes()),
      (RssKib() - rss_before) / 1024.0);
  return 0;
}
