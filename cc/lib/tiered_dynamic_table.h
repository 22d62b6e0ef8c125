// A dynamic table whose rows live in a row file behind the DRAM row cache (docs/tiered_dynamic_tables.md): the keys,
// the key index, every key's metadata (count, last step, admission and eviction state) stay in DRAM in a DynamicTable
// exactly as for an in-memory dynamic table; only the row contents (weights and optimizer slots, in their storage
// types) move to the records of a TieredRowFile, read and written through a TieredRowCache. The DynamicTable runs with
// external_rows: its row index r is the record index r of the file, allocated, freed by eviction and reused through the
// table's own free list.  The file grows in large steps as the table's rows do.
//
// So everything the in-memory table decides (which keys get rows and which rows, admission, eviction, the
// optimizer step through the one row walk of table_update.h, 16-bit stochastic rounding keyed by the key) is the
// same code on the same state, and a tiered dynamic table trains bitwise like the in-memory one.
//
// Contract for callers (the ops), as DynamicTable's: mutating calls (FindOrInsert, Update, EndStep, Import,
// WriteRows) need exclusive access; ReadRows, PinRows and the const accessors may run concurrently with each other.
// Every call validates its input before it changes anything; a refused call leaves keys, rows, slots and counters
// as they were.  I/O errors (a full disk, a device error, a corrupted record) are statuses naming the table, the
// row (and its key where known) and the path; the cache stays consistent (tiered_row_cache.h).
#ifndef TF_EMBED_OPS_CC_LIB_TIERED_DYNAMIC_TABLE_H_
#define TF_EMBED_OPS_CC_LIB_TIERED_DYNAMIC_TABLE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cc/lib/dynamic_table.h"
#include "cc/lib/embedding_config.h"
#include "cc/lib/gradient_accumulation.h"
#include "cc/lib/shard.h"
#include "cc/lib/stochastic_rounding.h"
#include "cc/lib/table_update.h"
#include "cc/lib/tiered_row_cache.h"
#include "cc/lib/tiered_row_file.h"

namespace tf_embed_ops {

struct TieredDynamicOptions {
  std::string path;         // the row file (created: an existing file is refused)
  int64_t cache_bytes = 0;  // the DRAM budget of the cache (records + TieredRowCache::kSlotOverheadBytes per row)
  // The file grows by at least this many rows at a time (and by at least half its size), so growth is rare.
  int64_t min_growth_rows = 65536;
};

class TieredDynamicTable {
 public:
  // Validates the options (DynamicTable::Create's checks, the cache budget: at least one row), then creates the
  // row file with room for options.initial_capacity rows.  options.external_rows is set here.
  static absl::StatusOr<std::unique_ptr<TieredDynamicTable>> Create(DynamicTableOptions options,
                                                                    const TieredDynamicOptions& tiered,
                                                                    RowFileIo io = RowFileIo::Posix());

  // Removes the row file: without the keys, which live in memory, its records mean nothing (a new table, or a
  // restarted process, restores a checkpoint into a new file).
  ~TieredDynamicTable();
  TieredDynamicTable(const TieredDynamicTable&) = delete;
  TieredDynamicTable& operator=(const TieredDynamicTable&) = delete;

  // The cache rows `cache_bytes` holds for these options (0: not one).
  static int64_t CapacityFor(int64_t cache_bytes, const DynamicTableOptions& options);
  // The record layout of these options' rows (num_rows = rows).
  static TieredRowLayout LayoutFor(const DynamicTableOptions& options, int64_t rows);

  DynamicTable& table() { return *table_; }
  const DynamicTable& table() const { return *table_; }
  TieredRowCache& cache() { return *cache_; }
  const TieredRowCache& cache() const { return *cache_; }
  const TieredRowLayout& layout() const { return cache_->layout(); }
  const std::string& name() const { return table_->name(); }

  // DynamicTable::FindOrInsert, then the rows of the keys it admitted are created in the cache (initialised from
  // the key and the slots' initial values, as the in-memory table initialises them) and left dirty.  Refused
  // before anything changes: a batch whose distinct keys do not fit in the cache, a file that cannot grow (a
  // full disk), DynamicTable's own refusals.  An I/O error while writing the new rows is reported with the advice
  // to restore the last checkpoint (the keys were inserted).
  absl::Status FindOrInsert(const int64_t* keys, int64_t n, int64_t step, int64_t* rows, BatchStats* stats = nullptr);
  // FindOrInsert's checks and file growth alone (no key, row or counter changes): a caller with several tables
  // runs it on all of them before the first FindOrInsert, so a refusal changes no table.
  absl::Status Prepare(const int64_t* keys, int64_t n);

  // Pins the records of `rows` (any order, duplicates and DynamicTable::kNotAdmitted allowed; the distinct
  // admitted ones must fit in the cache): pin->rows are the distinct rows ascending.  Release with
  // cache().Release(pin, false).  TieredRowStorage(layout(), *pin, false) reaches them.
  absl::Status PinRows(const int64_t* rows, int64_t n, TieredPin* pin);

  // One optimizer step (dynamic_table_update.h's, over the cache): lazy optimizers update the plan's rows pinned
  // at once; optimizers that update every row walk the live rows in windows of the cache's capacity.  The plan is
  // over row indices, without kNotAdmitted.  Errors: the cache's (a step larger than the cache, I/O).
  absl::Status Update(const TableOptimization& o, float lr, const RowGradientPlan& plan, const RoundingSpec& rounding,
                      const ShardFn& shard);
  // Its numerics check; writes no row.
  absl::StatusOr<NonFiniteUpdate> FindNonFinite(const TableOptimization& o, float lr, const RowGradientPlan& plan,
                                                const RoundingSpec& rounding, const ShardFn& shard);

  // The buffers of `rows` (live rows, any order) widened to float32: out[b] receives n rows of
  // layout().widths[b] values.  Reads through the cache (dirty rows included) without filling it.
  absl::Status ReadRows(const std::vector<int64_t>& rows, const std::vector<float*>& out);
  // Writes rows (live rows, any order) from float32 buffers (16-bit storage rounds to nearest): for restores.
  absl::Status WriteRows(const std::vector<int64_t>& rows, const std::vector<const float*>& values);

  // ReadRows / WriteRows by key, for the streamed checkpoint (one chunk of keys at a time, in the export's key
  // order): `keys` as the table stores them (a string table's fingerprints).  Every key must have a row (and, to
  // write, appear once); InvalidArgument naming the first that has none, before anything is read or written.
  absl::Status ReadRowsOfKeys(const int64_t* keys, int64_t n, const std::vector<float*>& out);
  absl::Status WriteRowsOfKeys(const int64_t* keys, int64_t n, const std::vector<const float*>& values);

  // DynamicTable::Import; the rows' values come in `c` (weights and slots, as an in-memory table's Import takes
  // them) or, when c.weights is empty, later through WriteRows (a streamed restore: rows [0, n) in c's key order).
  // Everything is validated before anything changes; the file grows first.
  absl::Status Import(const DynamicTableContents& c);
  // DynamicTable::ExportRows of every live row with the rows' values read here, and the pending entries.
  absl::StatusOr<DynamicTableContents> Export();
  // DynamicTable::RowStats with the norms computed from the rows' records.
  absl::StatusOr<DynamicTableRowStats> RowStats();

  // "key K (row R)": what errors name.
  std::string RowLabel(int64_t row) const;

 private:
  TieredDynamicTable(std::unique_ptr<DynamicTable> table, std::unique_ptr<TieredRowCache> cache,
                     int64_t min_growth_rows);
  // The rows of `keys` (each must have one) into `rows`.
  absl::Status RowsOfKeys(const int64_t* keys, int64_t n, std::vector<int64_t>* rows) const;
  // The file holds at least `rows` records (grown in large steps, at most max_rows).
  absl::Status EnsureRows(int64_t rows);
  // The records of `rows` (ascending, distinct) into `records` (record_bytes each, in that order).
  absl::Status ReadRecordsOf(const std::vector<int64_t>& rows, char* records);
  // Adds "(key K)" to a status naming "row R" of this table.
  absl::Status WithKeys(const absl::Status& s, const std::vector<int64_t>& rows) const;

  std::unique_ptr<DynamicTable> table_;
  std::unique_ptr<TieredRowCache> cache_;
  int64_t min_growth_rows_;
  std::pair<uint64_t, uint64_t> file_id_{0, 0};  // (device, inode) of the row file: what the destructor removes
  std::vector<std::vector<float>> init_rows_;    // a new row's buffers: [0] from the key, slots their initial value
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_TIERED_DYNAMIC_TABLE_H_
