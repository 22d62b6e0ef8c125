// A dynamic-vocabulary embedding table without TensorFlow (docs/dynamic_tables_internals.md): int64 keys mapped to rows
// that are created on first (admitted) sight, initialised from the key, and evicted by policy at step
// boundaries.  The resource ops wrap one DynamicTable per table; this class is their whole state.
//
//   keys --KeyIndex--> row index r --ChunkedArena--> weights row, one row per optimizer slot, and a packed
//   metadata record (key, last step seen, frequency count).  Row indices are dense in [0, capacity) and reused
//   after eviction; a row never moves, so the optimizer updates rows in place through plain pointers
//   (dynamic_table_update.h runs the same row pipeline as static tables).
//
// Contract for callers (the ops):
//   * Mutating calls (FindOrInsert, Evict*, EndStep, Import) need exclusive access; Find, Export, the row
//     accessors and the row update may run concurrently with each other, never with a mutating call.
//   * Every mutating call validates everything first and allocates before it writes: an error leaves the table
//     exactly as it was.
//   * FindOrInsert is deterministic: the result depends on the table's state and the batch, never on threads.
#ifndef TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_H_
#define TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cc/lib/bloom_admission.h"
#include "cc/lib/dynamic_table_arena.h"
#include "cc/lib/dynamic_table_index.h"
#include "cc/lib/dynamic_table_init.h"
#include "cc/lib/eviction_log.h"
#include "cc/lib/eviction_policy.h"
#include "cc/lib/storage_types.h"
#include "cc/lib/touched_rows.h"

namespace tf_embed_ops {

// Frequency admission: a key gets a row once it has been seen `min_count` times (every occurrence counts,
// duplicates in a batch included).  Counts of keys not yet admitted are exact, kept for at most
// `max_pending_keys` keys at once; a new key that finds that table full is not counted (counters().untracked)
// until entries leave it (admitted, or dropped after `pending_ttl_steps` steps unseen when that is > 0).
//
// Bloom admission (bloom_num_counters > 0): the exact pending counts are replaced by a counting Bloom filter
// (bloom_admission.h) of fixed size; a key is admitted when the minimum of its counters reaches min_count.
// log_refused: every key a training lookup gives no row is appended to the eviction log (LogKind::kRefused).
struct AdmissionOptions {
  int64_t min_count = 1;  // 1: admit on first sight (no pending table)
  int64_t max_pending_keys = 0;
  int64_t pending_ttl_steps = 0;   // 0: pending counts never expire
  int64_t bloom_num_counters = 0;  // > 0: Bloom admission
  int64_t bloom_num_hashes = 0;
  int64_t bloom_counter_bits = 8;
  bool log_refused = false;
};

struct DynamicTableOptions {
  std::string name;  // names the table in every error message
  int64_t dim = 0;
  // One initial value per optimizer slot (the optimizer's SlotInfo defaults or the user's); may be empty.
  std::vector<float> slot_initial_values;
  // The floats per row of each slot, in the same order: SlotWidth() of the optimizer's SlotInfo (dim, or 1 for a
  // per-row slot such as row-wise Adagrad's accumulator).  Empty: every slot is dim wide.
  std::vector<int64_t> slot_widths;
  int64_t initial_capacity = 0;   // rows allocated up front; the table grows beyond it up to max_rows
  int64_t max_rows = 0;           // hard cap: keys beyond it are refused (counters().refused_full)
  int64_t rows_per_chunk = 1024;  // a power of two
  RowInitializer initializer;
  AdmissionOptions admission;
  EvictionOptions eviction;                                       // applied by EndStep
  int64_t eviction_log_capacity = EvictionLog::kDefaultCapacity;  // entries the eviction log keeps (>= 1)
  // 16-bit storage (docs/low_precision.md): the weights' and the slots' element types, and how the optimizer
  // step rounds a 16-bit row back (stochastically, keyed by (seed, step, buffer, key), or to nearest).
  StorageType storage = StorageType::kFloat32;
  StorageType slot_storage = StorageType::kFloat32;
  Rounding rounding = Rounding::kStochastic;
  // The rows live elsewhere (a tiered table's row file, tiered_dynamic_table.h): the table keeps keys, index,
  // metadata and policies only, and its row indices address the caller's records.  The row arenas stay empty;
  // FindOrInsert reports the rows it creates (the caller writes their initial values), ExportRows leaves weights and
  // slots empty and Import ignores them (given or empty), and the calls that read row values (RowStats' norms, L2Norm
  // eviction) are the caller's: RowStats leaves norms empty and an L2Norm policy is refused.
  bool external_rows = false;
};

// Totals since creation (or the last Import).  Per-key counts are per call: a key seen three times in one
// FindOrInsert and refused counts once.
struct DynamicTableCounters {
  int64_t inserts = 0;          // rows created by FindOrInsert
  int64_t below_admission = 0;  // keys seen fewer than min_count times so far (no row yet)
  int64_t untracked = 0;        // keys not counted because the pending table was full
  int64_t refused_full = 0;     // admitted keys refused because the table held max_rows rows
  int64_t evictions = 0;        // rows removed by EndStep, Evict and EvictKeys
};

// What one FindOrInsert did (the same quantities as the counters, for this call only).
struct BatchStats {
  int64_t inserts = 0;
  int64_t below_admission = 0;
  int64_t untracked = 0;
  int64_t refused_full = 0;
};

// A table's content in key order (checkpoints): num_rows = keys.size(); weights are row-major [num_rows, dim],
// slot k is row-major [num_rows, slot_widths[k]].  Pending admission counts are included so a restored table admits
// exactly as the saved one.
struct DynamicTableContents {
  int64_t dim = 0;
  std::vector<int64_t> keys;
  std::vector<float> weights;
  std::vector<int64_t> slot_widths;
  std::vector<std::vector<float>> slots;
  std::vector<int64_t> counts;
  std::vector<int64_t> last_steps;
  std::vector<int64_t> pending_keys;  // sorted
  std::vector<int64_t> pending_counts;
  std::vector<int64_t> pending_last_steps;
};

// The state of the lifecycle policies beyond the rows (checkpoints): the Bloom filter's packed counters (empty
// without Bloom admission) and the decayed counts of decayed LFU by key (empty otherwise).
struct DynamicTablePolicyState {
  std::vector<uint8_t> bloom_counters;
  std::vector<int64_t> decayed_keys;  // sorted
  std::vector<float> decayed_counts;
};

// Per-row statistics of every live row, in row order (what a user score function sees).
struct DynamicTableRowStats {
  std::vector<int64_t> keys;
  std::vector<int64_t> counts;
  std::vector<int64_t> last_steps;
  std::vector<float> norms;  // L2 norm of the weights
};

class DynamicTable {
 public:
  static constexpr int64_t kNotAdmitted = -1;  // the row FindOrInsert / Find give a key without a row
  static constexpr int64_t kMaxDim = int64_t{1} << 20;
  static constexpr int64_t kMaxSlots = 16;
  static constexpr int64_t kMaxRowsPerChunk = int64_t{1} << 20;
  static constexpr int64_t kMaxCount = 0xffffffffLL;  // per-row counts saturate here (uint32)

  // Validates every option (naming the table and the value) before allocating anything.
  static absl::StatusOr<std::unique_ptr<DynamicTable>> Create(const DynamicTableOptions& options);

  const DynamicTableOptions& options() const { return options_; }
  const std::string& name() const { return options_.name; }
  int64_t dim() const { return options_.dim; }
  int64_t num_slots() const { return static_cast<int64_t>(slots_.size()); }
  int64_t slot_width(int64_t slot) const { return slots_[slot].width(); }  // values per row of that slot
  int64_t size() const { return size_; }
  int64_t capacity() const { return meta_.capacity(); }  // rows allocated
  // Rows [0, row_bound()) have been used: every row index the table gives out is below it (and below max_rows).
  int64_t row_bound() const { return high_water_; }
  const DynamicTableCounters& counters() const { return counters_; }
  int64_t num_pending() const { return static_cast<int64_t>(pending_.size()); }
  // Changes whenever a key gets or loses a row (insert, eviction, import): rows found at one version are still
  // the keys' rows while it stays the same (dynamic_lookup_memo.h).
  uint64_t mapping_version() const { return mapping_version_; }

  // rows[i] = the row of keys[i], or kNotAdmitted.  Changes nothing (serving lookups).
  void Find(const int64_t* keys, int64_t n, int64_t* rows) const;

  // Training lookup at `step` (>= 0): rows[i] = the row of keys[i], creating rows for admitted new keys
  // (initialised from the key), or kNotAdmitted.  Counts every occurrence (row count or pending count) and
  // stamps last_step = max(last_step, step).  Admission is decided per distinct key on its count after the
  // whole batch, so every occurrence of a key in a batch gets the same row; new keys are given rows in order of
  // first occurrence until max_rows is reached, the rest are refused.  `stats` may be null.
  // `inserted` (may be null): the rows this call created are appended, in the order they were created.
  absl::Status FindOrInsert(const int64_t* keys, int64_t n, int64_t step, int64_t* rows, BatchStats* stats = nullptr,
                            std::vector<int64_t>* inserted = nullptr);

  // Row accessors, for a row index FindOrInsert/Find returned (and not evicted since).  Weights() and Slot()
  // give float32 storage's rows (options().storage / slot_storage kFloat32); ReadRow works for any storage.
  float* Weights(int64_t row) { return static_cast<float*>(weights_.At(row)); }
  const float* Weights(int64_t row) const { return static_cast<const float*>(weights_.At(row)); }
  // A slot's row holds slot_width(slot) floats.
  float* Slot(int64_t slot, int64_t row) { return static_cast<float*>(slots_[slot].At(row)); }
  const float* Slot(int64_t slot, int64_t row) const { return static_cast<const float*>(slots_[slot].At(row)); }
  // Buffer `buffer`'s row widened to float32 (buffer_width(buffer) values).
  void ReadRow(int64_t buffer, int64_t row, float* out) const {
    (buffer == 0 ? weights_ : slots_[buffer - 1]).Read(row, out);
  }
  // The row walk's view (row_storage.h): buffer 0 is the weights, 1 + k slot k.
  StorageType buffer_type(int64_t buffer) const { return buffer == 0 ? weights_.type() : slots_[buffer - 1].type(); }
  int64_t buffer_width(int64_t buffer) const { return buffer == 0 ? dim() : slot_width(buffer - 1); }
  const void* BufferRow(int64_t buffer, int64_t row) const {
    return buffer == 0 ? weights_.At(row) : slots_[buffer - 1].At(row);
  }
  // Whether every row below row_bound() is float32 and each buffer's rows are one array from its row 0 (rows within
  // the capacity the table was created or last imported with): the row walk then addresses rows as a static table's.
  bool DenseFloat32Rows() const;
  // Buffer 0's rows as one array when every row below row_bound() lies in it (BufferRow(0, row) is then this plus
  // row * dim() elements of buffer_type(0)), else null: the lookup's gather addresses rows as a static table's.
  const void* DenseWeights() const {
    return !options_.external_rows && high_water_ > 0 && weights_.direct_rows() >= high_water_ ? weights_.At(0)
                                                                                               : nullptr;
  }
  int64_t KeyOf(int64_t row) const { return meta_.At(row)->key; }
  int64_t CountOf(int64_t row) const { return meta_.At(row)->count; }
  int64_t LastStepOf(int64_t row) const { return meta_.At(row)->last_step; }

  // Every live row index, ascending (what a non-lazy optimizer walks).
  std::vector<int64_t> LiveRows() const;

  // Applies options().eviction at the boundary after step `step`, and expires stale pending counts.  Returns
  // the number of rows evicted.
  absl::StatusOr<int64_t> EndStep(int64_t step);
  // Applies `policy` now (explicit eviction).
  absl::StatusOr<int64_t> Evict(const EvictionOptions& policy, int64_t step);
  // Removes these keys' rows (absent keys are ignored; duplicates count once).  Returns rows evicted.  Logged as
  // LogKind::kErased at the latest step the table has seen.
  int64_t EvictKeys(const int64_t* keys, int64_t n);
  // A user score's eviction round (capacity rule): scores[i] is the score of keys[i]'s row (keys that have no
  // row are ignored); the lowest-scored rows go until at most target_rows of the table's rows remain (rows not in
  // `keys` are kept and count).  Ties: older last step, then smaller key.  Validates everything (n >= 0, finite
  // scores, unique keys, target_rows in [0, max_rows], step) before it changes anything.
  absl::StatusOr<int64_t> EvictByScore(const int64_t* keys, const float* scores, int64_t n, int64_t target_rows,
                                       int64_t step);
  DynamicTableRowStats RowStats() const;

  // The eviction log (evictions, erased keys, refused admissions when asked), read under a shared lock.
  const EvictionLog& eviction_log() const { return log_; }
  // The latest step a training lookup or an eviction named (-1 before any).
  int64_t latest_step() const { return latest_step_; }

  DynamicTablePolicyState ExportPolicyState() const;
  // Restores the policy state after Import.  bloom_counters holds `num_parts` filters of this table's geometry
  // back to back (one per shard the checkpoint was saved from): with one part it is taken as is, with several
  // they are added (saturating), which never lowers a key's estimate.  Decayed counts are set for the keys that
  // have a row here (the others are ignored: another shard's).  Validates sizes and values first.
  absl::Status ImportPolicyState(const std::vector<uint8_t>& bloom_counters, int64_t num_parts,
                                 const std::vector<int64_t>& decayed_keys, const std::vector<float>& decayed_counts);

  DynamicTableContents Export() const;
  // These rows (live row indices) in key order, without the pending entries.
  DynamicTableContents ExportRows(std::vector<int64_t> rows) const;
  // Replaces the whole content (any capacity: the table grows to fit, up to max_rows).  Validates dim, the slot
  // count and widths, every size, unique keys, counts and steps before changing anything.  Resets the counters.
  absl::Status Import(const DynamicTableContents& contents);

  // Touched-row tracking (docs/tracking.md), off until enabled: then 4 more bytes per row.  Training lookups
  // mark the rows they find or insert, evictions log their keys, Import marks everything; the fused update
  // marks its rows through tracker().  False on allocation failure (tracking stays off).
  bool EnableTracking();
  TouchedRows* tracker() { return tracker_.get(); }
  const TouchedRows* tracker() const { return tracker_.get(); }
  // The pending admission entries (key ascending): what a checkpoint delta carries whole.
  void ExportPending(DynamicTableContents* c) const;

  // Bytes held by everything the table keeps: rows, slots, metadata, the index, the pending admission counts
  // (PendingBytes), the Bloom filter's counters, decayed LFU's per-row state, the eviction log's entries and the
  // touched-row tracker (stamps and its eviction log).  Container payloads only: the allocator's per-allocation
  // headers and a container's unused reserve beyond what it reports are not counted.
  int64_t MemoryBytes() const;
  // The pending admission counts' share of MemoryBytes(): the hash map's buckets and one node per pending key.
  int64_t PendingBytes() const;

 private:
  struct Pending {
    int64_t count;
    int64_t last_step;
  };
  // Decayed LFU's per-row state: the decayed count and the row's count at the previous round.
  struct Decay {
    float decayed;
    uint32_t seen;
  };
  // A row's metadata, packed into 20 bytes and kept together: the index probe reads the key, and a training
  // lookup then updates count and last step in the same cache line instead of two more random ones.  (Packed
  // members are read and written by value only: no references to them.)
  struct __attribute__((packed)) RowMeta {
    int64_t key;        // on a free row: the next free row (an intrusive free list)
    int64_t last_step;  // -1 on a free row
    uint32_t count;     // saturates at kMaxCount
  };
  static_assert(sizeof(RowMeta) == 20, "row metadata must stay within the memory budget");

  struct FreshStorage;  // an import's own arenas (dynamic_table_export.cc)

  explicit DynamicTable(const DynamicTableOptions& options, int log2_rows_per_chunk);
  auto KeyOfFn() const {
    return [this](int64_t row) { return meta_.At(row)->key; };
  }
  absl::Status ValidateStep(int64_t step, const char* what) const;
  // Room for `extra` more rows (arenas and index), allocating only; false on allocation failure.
  bool Grow(int64_t extra);
  int64_t AllocateRow();
  void InitRow(int64_t row, int64_t key, int64_t count, int64_t step);
  void RemoveRow(int64_t row);
  int64_t EvictRows(const std::vector<int64_t>& rows, int64_t step, LogKind kind);
  bool decays() const { return options_.eviction.policy == EvictionPolicy::kDecayedLfu; }
  double RowSquaredNorm(int64_t row, std::vector<float>* scratch) const;

  DynamicTableOptions options_;
  StoredRowArena weights_;
  std::vector<StoredRowArena> slots_;
  std::vector<float> init_scratch_;  // a new 16-bit row's float32 values (mutating calls are exclusive)
  ChunkedArena<RowMeta> meta_;
  KeyIndex index_;
  int64_t size_ = 0;
  int64_t high_water_ = 0;  // rows [0, high_water_) have been used
  int64_t free_head_ = -1;
  std::unordered_map<int64_t, Pending> pending_;
  DynamicTableCounters counters_;
  CountingBloomFilter bloom_;
  ChunkedArena<Decay> decay_;  // grown only when the table's own policy is decayed LFU
  EvictionLog log_;
  int64_t latest_step_ = -1;
  std::unique_ptr<TouchedRows> tracker_;  // null: tracking off
  uint64_t mapping_version_ = 0;
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_H_
