#include "cc/lib/tiered_dynamic_table.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cc/lib/eviction_policy.h"
#include "cc/lib/optimizers/registry.h"
#include "cc/lib/tiered_row_storage.h"

namespace tf_embed_ops {
namespace {

// The row walk's view (row_storage.h) of a dynamic table's pinned records: rows are reached through the pinned
// records' map, the walk rows (non-lazy optimizers) are a window of live rows, and 16-bit stochastic rounding is
// keyed by the row's KEY, as ArenaRowStorage keys it, so the bits are the in-memory table's.
class DynamicRecordStorage {
 public:
  // `walk`: the window of live rows a non-lazy optimizer walks (null: a lazy step, no walk rows).
  DynamicRecordStorage(TieredRowStorage records, const DynamicTable& table, const std::vector<int64_t>* walk)
      : records_(std::move(records)), table_(table), walk_(walk) {}

  int64_t num_buffers() const { return records_.num_buffers(); }
  StorageType type(size_t b) const { return records_.type(b); }
  int64_t width(size_t b) const { return records_.width(b); }
  void* Row(size_t b, int64_t row) const { return records_.Row(b, row); }
  int64_t num_walk_rows() const { return walk_ == nullptr ? 0 : static_cast<int64_t>(walk_->size()); }
  int64_t walk_row(int64_t i) const { return (*walk_)[i]; }
  uint64_t rounding_id(int64_t row) const { return static_cast<uint64_t>(table_.KeyOf(row)); }

 private:
  TieredRowStorage records_;
  const DynamicTable& table_;
  const std::vector<int64_t>* walk_;
};

// fn(storage) over the rows the optimizer reads: the plan's rows pinned at once (lazy), or the live rows in
// windows of the cache's capacity, ascending (UpdatesAllRows: the in-memory walk's order; rows are independent,
// so windows give the same numbers).  `dirty`: the rows are released dirty.  Stops when fn returns true.
template <typename Fn>
absl::Status ForEachPinnedWindow(const TableOptimization& o, const RowGradientPlan& plan, const DynamicTable& table,
                                 TieredRowCache* cache, bool dirty, const Fn& fn) {
  const std::string what = absl::StrCat("dynamic table '", table.name(), "'");
  TieredPin pin;
  if (!OptimizerUpdatesAllRows(o.optimizer)) {
    if (const absl::Status s = AcquirePlanRows(plan, cache, what, &pin); !s.ok()) return s;
    fn(DynamicRecordStorage(TieredRowStorage(cache->layout(), pin, /*window=*/false), table, nullptr));
    cache->Release(&pin, dirty);
    return absl::OkStatus();
  }
  const std::vector<int64_t> live = table.LiveRows();
  const size_t step = static_cast<size_t>(cache->capacity());
  for (size_t first = 0; first < live.size(); first += step) {
    const std::vector<int64_t> window(live.begin() + first, live.begin() + std::min(live.size(), first + step));
    if (const absl::Status s = cache->Acquire(window, &pin); !s.ok()) {
      if (first == 0 || !dirty) return s;
      return absl::Status(s.code(), absl::StrCat(s.message(), " (", first, " of the ", live.size(), " rows of ", what,
                                                 " were updated by this step already: restore the table from the "
                                                 "last checkpoint)"));
    }
    const bool stop =
        fn(DynamicRecordStorage(TieredRowStorage(cache->layout(), pin, /*window=*/false), table, &window));
    cache->Release(&pin, dirty);
    if (stop) break;
  }
  return absl::OkStatus();
}

// Runs of consecutive rows in `rows` (ascending): fn(begin, end) for each maximal run of indices [begin, end).
template <typename Fn>
absl::Status ForEachRowRun(const std::vector<int64_t>& rows, const Fn& fn) {
  for (size_t begin = 0, end = 0; begin < rows.size(); begin = end) {
    for (end = begin + 1; end < rows.size() && rows[end] == rows[end - 1] + 1;) ++end;
    if (const absl::Status s = fn(begin, end); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Positions 0..n-1 ordered by rows[i] (ties keep their order).
std::vector<size_t> OrderByRow(const std::vector<int64_t>& rows) {
  std::vector<size_t> order(rows.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&rows](size_t a, size_t b) { return rows[a] < rows[b]; });
  return order;
}

}  // namespace

int64_t TieredDynamicTable::CapacityFor(int64_t cache_bytes, const DynamicTableOptions& options) {
  if (cache_bytes <= 0) return 0;
  const int64_t per_row = TieredRowCache::RowBytes(LayoutFor(options, 1));
  return std::min({options.max_rows, TieredRowCache::kMaxCapacity, cache_bytes / per_row});
}

TieredRowLayout TieredDynamicTable::LayoutFor(const DynamicTableOptions& options, int64_t rows) {
  TieredRowLayout layout;
  layout.num_rows = rows;
  layout.types.push_back(options.storage);
  layout.widths.push_back(options.dim);
  for (size_t s = 0; s < options.slot_initial_values.size(); ++s) {
    layout.types.push_back(options.slot_storage);
    layout.widths.push_back(options.slot_widths.empty() ? options.dim : options.slot_widths[s]);
  }
  return layout;
}

absl::StatusOr<std::unique_ptr<TieredDynamicTable>> TieredDynamicTable::Create(DynamicTableOptions options,
                                                                               const TieredDynamicOptions& tiered,
                                                                               RowFileIo io) {
  options.external_rows = true;
  absl::StatusOr<std::unique_ptr<DynamicTable>> table = DynamicTable::Create(options);
  if (!table.ok()) return table.status();
  const int64_t capacity = CapacityFor(tiered.cache_bytes, options);
  if (capacity < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dynamic table '", options.name, "': cache_bytes = ", tiered.cache_bytes, " holds no row; a cached row takes ",
        TieredRowCache::RowBytes(LayoutFor(options, 1)), " bytes (its record and the cache's bookkeeping)"));
  }
  if (tiered.min_growth_rows < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("dynamic table '", options.name, "': min_growth_rows must be >= 1, got ", tiered.min_growth_rows));
  }
  const int64_t rows = std::min((*table)->capacity(), options.max_rows);
  absl::StatusOr<std::unique_ptr<TieredRowFile>> file =
      TieredRowFile::Create(tiered.path, options.name, LayoutFor(options, rows), io);
  if (file.status().code() == absl::StatusCode::kAlreadyExists) {
    return absl::AlreadyExistsError(absl::StrCat(
        file.status().message(), "; a dynamic table cannot reopen a row file (its keys live in memory): use mode ",
        "'overwrite' and restore the last checkpoint"));
  }
  if (!file.ok()) return file.status();
  struct stat st;
  if (::stat(tiered.path.c_str(), &st) != 0) {
    return absl::InternalError(absl::StrCat("dynamic table '", options.name, "': cannot stat its new row file '",
                                            tiered.path, "': ", std::strerror(errno)));
  }
  auto cache = std::make_unique<TieredRowCache>(*std::move(file), capacity);
  auto out = std::unique_ptr<TieredDynamicTable>(
      new TieredDynamicTable(*std::move(table), std::move(cache), tiered.min_growth_rows));
  out->file_id_ = {st.st_dev, st.st_ino};
  return out;
}

TieredDynamicTable::TieredDynamicTable(std::unique_ptr<DynamicTable> table, std::unique_ptr<TieredRowCache> cache,
                                       int64_t min_growth_rows)
    : table_(std::move(table)), cache_(std::move(cache)), min_growth_rows_(min_growth_rows) {
  const TieredRowLayout& l = cache_->layout();
  init_rows_.resize(l.num_buffers());
  init_rows_[0].resize(l.widths[0]);
  for (int64_t b = 1; b < l.num_buffers(); ++b) {
    init_rows_[b].assign(l.widths[b], table_->options().slot_initial_values[b - 1]);
  }
}

TieredDynamicTable::~TieredDynamicTable() {
  const std::string path = cache_->path();
  cache_.reset();  // closes the file (dirty rows are not written back: the file goes)
  // Only if the path still names this table's file (a table created later with mode 'overwrite' may own it now).
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && st.st_dev == file_id_.first && st.st_ino == file_id_.second) {
    ::unlink(path.c_str());
  }
}

std::string TieredDynamicTable::RowLabel(int64_t row) const {
  if (row >= 0 && row < table_->row_bound() && table_->LastStepOf(row) >= 0) {
    return absl::StrCat("key ", table_->KeyOf(row), " (row ", row, ")");
  }
  return absl::StrCat("row ", row, " (no key: a free row)");
}

absl::Status TieredDynamicTable::WithKeys(const absl::Status& s, const std::vector<int64_t>& rows) const {
  if (s.ok()) return s;
  // The file's errors name "row R"; add R's key when R is one of the call's rows.
  const std::string message(s.message());
  size_t at = message.find("row ");
  while (at != std::string::npos && !(at + 4 < message.size() && std::isdigit(message[at + 4]))) {
    at = message.find("row ", at + 4);  // ("row file '...'" comes first)
  }
  if (at == std::string::npos) return s;
  const int64_t row = std::strtoll(message.c_str() + at + 4, nullptr, 10);
  if (!std::binary_search(rows.begin(), rows.end(), row)) return s;
  return absl::Status(s.code(), absl::StrCat(message, " [", RowLabel(row), "]"));
}

absl::Status TieredDynamicTable::EnsureRows(int64_t rows) {
  const int64_t max_rows = table_->options().max_rows;
  rows = std::min(rows, max_rows);
  const int64_t have = cache_->num_rows();
  if (rows <= have) return absl::OkStatus();
  const int64_t target = std::min(max_rows, std::max(rows, have + std::max(have / 2, min_growth_rows_)));
  return cache_->Grow(target);
}

absl::Status TieredDynamicTable::Prepare(const int64_t* keys, int64_t n) {
  if (n < 0) return absl::OkStatus();  // FindOrInsert refuses it
  // The batch's rows must fit in the cache together, and the file must have a record for every row the batch can
  // create (each new key takes a free row or the next one).
  std::vector<int64_t> distinct(keys, keys + n);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  const int64_t num_distinct = static_cast<int64_t>(distinct.size());
  if (num_distinct > cache_->capacity()) {
    return cache_->TooManyRows(num_distinct, absl::StrCat("dynamic table '", name(), "': a training lookup"));
  }
  return EnsureRows(table_->row_bound() + num_distinct);
}

absl::Status TieredDynamicTable::FindOrInsert(const int64_t* keys, int64_t n, int64_t step, int64_t* rows,
                                              BatchStats* stats) {
  if (n < 0 || step < 0) return table_->FindOrInsert(keys, n, step, rows, stats);  // refused there, unchanged
  // 1. Checks and growth (no table state changes).
  if (const absl::Status s = Prepare(keys, n); !s.ok()) return s;
  // 2. The keys.
  std::vector<int64_t> inserted;
  if (const absl::Status s = table_->FindOrInsert(keys, n, step, rows, stats, &inserted); !s.ok()) return s;
  if (inserted.empty()) return absl::OkStatus();
  // 3. The new rows' records, made resident without reading the file (they are written whole here) and dirty.
  std::sort(inserted.begin(), inserted.end());
  TieredPin pin;
  if (const absl::Status s = cache_->Acquire(inserted, &pin, /*read=*/false); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(WithKeys(s, inserted).message(), " (while creating the rows of ",
                                               inserted.size(), " new keys of dynamic table '", name(),
                                               "': restore the table from the last checkpoint)"));
  }
  const TieredRowLayout& l = cache_->layout();
  std::vector<const float*> buffers(l.num_buffers());
  for (int64_t b = 0; b < l.num_buffers(); ++b) buffers[b] = init_rows_[b].data();
  for (size_t i = 0; i < pin.rows.size(); ++i) {
    // As the in-memory table: the weights from the key in float32, every buffer rounded to nearest when 16-bit.
    table_->options().initializer.FillRow(table_->KeyOf(pin.rows[i]), init_rows_[0].data(), l.widths[0]);
    EncodeRecord(l, buffers.data(), pin.records[i]);
  }
  cache_->Release(&pin, /*dirty=*/true);
  return absl::OkStatus();
}

absl::Status TieredDynamicTable::PinRows(const int64_t* rows, int64_t n, TieredPin* pin) {
  *pin = TieredPin();
  std::vector<int64_t> distinct;
  distinct.reserve(std::max<int64_t>(n, 0));
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] != DynamicTable::kNotAdmitted) distinct.push_back(rows[i]);
  }
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  if (static_cast<int64_t>(distinct.size()) > cache_->capacity()) {
    return cache_->TooManyRows(static_cast<int64_t>(distinct.size()), absl::StrCat("dynamic table '", name(), "'"));
  }
  return WithKeys(cache_->Acquire(distinct, pin), distinct);
}

absl::Status TieredDynamicTable::Update(const TableOptimization& o, float lr, const RowGradientPlan& plan,
                                        const RoundingSpec& rounding, const ShardFn& shard) {
  const int64_t dim = table_->dim();
  return ForEachPinnedWindow(o, plan, *table_, cache_.get(), /*dirty=*/true, [&](const DynamicRecordStorage& rows) {
    UpdateRows(o, lr, plan, rows, dim, rounding, shard);
    return false;
  });
}

absl::StatusOr<NonFiniteUpdate> TieredDynamicTable::FindNonFinite(const TableOptimization& o, float lr,
                                                                  const RowGradientPlan& plan,
                                                                  const RoundingSpec& rounding, const ShardFn& shard) {
  const int64_t dim = table_->dim();
  NonFiniteUpdate found;
  const absl::Status s =
      ForEachPinnedWindow(o, plan, *table_, cache_.get(), /*dirty=*/false, [&](const DynamicRecordStorage& rows) {
        found = FindNonFiniteUpdate(o, lr, plan, rows, dim, rounding, shard);
        return found.found;  // windows ascend: the first found is the smallest row
      });
  if (!s.ok()) return s;
  return found;
}

absl::Status TieredDynamicTable::ReadRecordsOf(const std::vector<int64_t>& rows, char* records) {
  const int64_t bytes = cache_->record_bytes();
  return WithKeys(ForEachRowRun(rows,
                                [&](size_t begin, size_t end) {
                                  return cache_->ReadRecords(rows[begin], static_cast<int64_t>(end - begin),
                                                             records + static_cast<int64_t>(begin) * bytes);
                                }),
                  rows);
}

absl::Status TieredDynamicTable::ReadRows(const std::vector<int64_t>& rows, const std::vector<float*>& out) {
  const TieredRowLayout& l = cache_->layout();
  if (static_cast<int64_t>(out.size()) != l.num_buffers()) {
    return absl::InvalidArgumentError(absl::StrCat("dynamic table '", name(), "': ReadRows needs ", l.num_buffers(),
                                                   " output buffers, got ", out.size()));
  }
  for (const int64_t row : rows) {
    if (row < 0 || row >= table_->row_bound() || table_->LastStepOf(row) < 0) {
      return absl::InvalidArgumentError(absl::StrCat("dynamic table '", name(), "': row ", row, " is not a live row"));
    }
  }
  const std::vector<size_t> order = OrderByRow(rows);
  std::vector<int64_t> sorted(rows.size());
  for (size_t i = 0; i < order.size(); ++i) sorted[i] = rows[order[i]];
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  std::vector<char> records(sorted.size() * cache_->record_bytes());
  if (const absl::Status s = ReadRecordsOf(sorted, records.data()); !s.ok()) return s;
  std::vector<float*> dst(l.num_buffers());
  size_t at = 0;  // sorted[at] is the row of order[i]
  for (size_t i = 0; i < order.size(); ++i) {
    while (sorted[at] != rows[order[i]]) ++at;
    for (int64_t b = 0; b < l.num_buffers(); ++b) dst[b] = out[b] + static_cast<int64_t>(order[i]) * l.widths[b];
    DecodeRecord(l, records.data() + at * cache_->record_bytes(), dst.data());
  }
  return absl::OkStatus();
}

absl::Status TieredDynamicTable::WriteRows(const std::vector<int64_t>& rows, const std::vector<const float*>& values) {
  const TieredRowLayout& l = cache_->layout();
  if (static_cast<int64_t>(values.size()) != l.num_buffers()) {
    return absl::InvalidArgumentError(absl::StrCat("dynamic table '", name(), "': WriteRows needs ", l.num_buffers(),
                                                   " buffers (the weights and each slot), got ", values.size()));
  }
  const std::vector<size_t> order = OrderByRow(rows);
  for (size_t i = 0; i < order.size(); ++i) {
    const int64_t row = rows[order[i]];
    if (row < 0 || row >= table_->row_bound() || table_->LastStepOf(row) < 0) {
      return absl::InvalidArgumentError(absl::StrCat("dynamic table '", name(), "': row ", row, " is not a live row"));
    }
    if (i > 0 && row == rows[order[i - 1]]) {
      return absl::InvalidArgumentError(absl::StrCat("dynamic table '", name(), "': row ", row, " is written twice"));
    }
  }
  const int64_t bytes = cache_->record_bytes();
  std::vector<char> records(rows.size() * bytes);
  std::vector<int64_t> sorted(rows.size());
  std::vector<const float*> src(l.num_buffers());
  for (size_t i = 0; i < order.size(); ++i) {
    sorted[i] = rows[order[i]];
    for (int64_t b = 0; b < l.num_buffers(); ++b) src[b] = values[b] + static_cast<int64_t>(order[i]) * l.widths[b];
    EncodeRecord(l, src.data(), records.data() + i * bytes);
  }
  return WithKeys(ForEachRowRun(sorted,
                                [&](size_t begin, size_t end) {
                                  return cache_->WriteRecords(sorted[begin], static_cast<int64_t>(end - begin),
                                                              records.data() + static_cast<int64_t>(begin) * bytes);
                                }),
                  sorted);
}

absl::Status TieredDynamicTable::RowsOfKeys(const int64_t* keys, int64_t n, std::vector<int64_t>* rows) const {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("dynamic table '", name(), "': ", n, " keys"));
  rows->resize(n);
  table_->Find(keys, n, rows->data());
  for (int64_t i = 0; i < n; ++i) {
    if ((*rows)[i] == DynamicTable::kNotAdmitted) {
      return absl::InvalidArgumentError(absl::StrCat("dynamic table '", name(), "': key ", keys[i], " (number ", i,
                                                     " of ", n, ") has no row; nothing was read or written"));
    }
  }
  return absl::OkStatus();
}

absl::Status TieredDynamicTable::ReadRowsOfKeys(const int64_t* keys, int64_t n, const std::vector<float*>& out) {
  std::vector<int64_t> rows;
  if (const absl::Status s = RowsOfKeys(keys, n, &rows); !s.ok()) return s;
  return ReadRows(rows, out);
}

absl::Status TieredDynamicTable::WriteRowsOfKeys(const int64_t* keys, int64_t n,
                                                 const std::vector<const float*>& values) {
  std::vector<int64_t> rows;
  if (const absl::Status s = RowsOfKeys(keys, n, &rows); !s.ok()) return s;
  return WriteRows(rows, values);  // checks the buffer count and that no row is written twice first
}

absl::Status TieredDynamicTable::Import(const DynamicTableContents& c) {
  // DynamicTable::Import checks everything, the row values' sizes included, before it changes anything; the file
  // grows first (a full disk refuses the import with the table unchanged).
  const int64_t n = static_cast<int64_t>(c.keys.size());
  if (n > table_->options().max_rows) return table_->Import(c);  // refused there
  if (const absl::Status s = EnsureRows(n); !s.ok()) return s;
  if (const absl::Status s = table_->Import(c); !s.ok()) return s;
  if (c.weights.empty() || n == 0) return absl::OkStatus();
  // Import gave key i row i.
  std::vector<int64_t> rows(n);
  for (int64_t i = 0; i < n; ++i) rows[i] = i;
  std::vector<const float*> values{c.weights.data()};
  for (const std::vector<float>& slot : c.slots) values.push_back(slot.data());
  return WriteRows(rows, values);
}

absl::StatusOr<DynamicTableContents> TieredDynamicTable::Export() {
  DynamicTableContents c = table_->Export();
  const int64_t n = static_cast<int64_t>(c.keys.size());
  std::vector<int64_t> rows(n);
  table_->Find(c.keys.data(), n, rows.data());
  c.weights.resize(n * c.dim);
  std::vector<float*> out{c.weights.data()};
  for (size_t s = 0; s < c.slots.size(); ++s) {
    c.slots[s].resize(n * c.slot_widths[s]);
    out.push_back(c.slots[s].data());
  }
  if (const absl::Status s = ReadRows(rows, out); !s.ok()) return s;
  return c;
}

absl::StatusOr<DynamicTableRowStats> TieredDynamicTable::RowStats() {
  DynamicTableRowStats st = table_->RowStats();  // in row order, without norms
  const std::vector<int64_t> live = table_->LiveRows();
  const TieredRowLayout& l = cache_->layout();
  const int64_t dim = table_->dim();
  // One block of rows at a time, so the memory stays small whatever the table's size.
  constexpr size_t kBlock = 4096;
  std::vector<std::vector<float>> buffers(l.num_buffers());
  std::vector<float*> out(l.num_buffers());
  st.norms.reserve(live.size());
  for (size_t first = 0; first < live.size(); first += kBlock) {
    const std::vector<int64_t> block(live.begin() + first, live.begin() + std::min(live.size(), first + kBlock));
    for (int64_t b = 0; b < l.num_buffers(); ++b) {
      buffers[b].resize(block.size() * l.widths[b]);
      out[b] = buffers[b].data();
    }
    if (const absl::Status s = ReadRows(block, out); !s.ok()) return s;
    for (size_t i = 0; i < block.size(); ++i) {
      // As DynamicTable::RowSquaredNorm: the stored row widened exactly, summed in double.
      st.norms.push_back(static_cast<float>(std::sqrt(SquaredNorm(buffers[0].data() + i * dim, dim))));
    }
  }
  return st;
}

}  // namespace tf_embed_ops
