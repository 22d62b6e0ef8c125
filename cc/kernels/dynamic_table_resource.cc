#include "cc/kernels/dynamic_table_resource.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tf_embed_ops {
namespace {

std::vector<int64_t> SlotWidths(const DynamicTable& table) {
  std::vector<int64_t> widths;
  for (int64_t k = 0; k < table.num_slots(); ++k) widths.push_back(table.slot_width(k));
  return widths;
}

}  // namespace

DynamicTableResource::DynamicTableResource(std::unique_ptr<DynamicTable> table, tensorflow::DataType key_dtype,
                                           DynamicTableOptionList options)
    : name_(table->name()),
      key_dtype_(key_dtype),
      dim_(table->dim()),
      num_slots_(table->num_slots()),
      slot_widths_(SlotWidths(*table)),
      options_(std::move(options)),
      owned_(std::move(table)),
      table_(owned_.get()) {}

DynamicTableResource::DynamicTableResource(std::unique_ptr<TieredDynamicTable> tiered, tensorflow::DataType key_dtype,
                                           DynamicTableOptionList options)
    : name_(tiered->name()),
      key_dtype_(key_dtype),
      dim_(tiered->table().dim()),
      num_slots_(tiered->table().num_slots()),
      slot_widths_(SlotWidths(tiered->table())),
      options_(std::move(options)),
      tiered_(std::move(tiered)),
      table_(&tiered_->table()) {}

std::string DynamicTableResource::DebugString() const {
  tsl::tf_shared_lock lock(mu_);
  return absl::StrCat("DynamicTable '", name_, "' (", tensorflow::DataTypeString(key_dtype_), " keys, dim ", dim_, ", ",
                      table_->size(), " rows)");
}

int64_t DynamicTableResource::MemoryUsed() const {
  tsl::tf_shared_lock lock(mu_);
  return memory_bytes();
}

int64_t DynamicTableResource::memory_bytes() const {
  // A tiered table's DRAM: the keys and metadata, the cache (its records and bookkeeping) and the row file's
  // location map.
  const int64_t cache = tiered_ == nullptr ? 0
                                           : tiered_->cache().capacity() * TieredRowCache::RowBytes(tiered_->layout()) +
                                                 tiered_->cache().dram_bytes_beside_budget();
  return table_->MemoryBytes() + cache;
}

absl::Status DynamicTableResource::CheckSameOptions(const DynamicTableOptionList& requested) const {
  for (size_t i = 0; i < std::min(options_.size(), requested.size()); ++i) {
    if (options_[i] != requested[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("dynamic table '", name_, "': a table of this name already exists with ", options_[i].first,
                       " = ", options_[i].second, ", but this handle asks for ", requested[i].first, " = ",
                       requested[i].second, "; every handle of a shared table must be created with the same options"));
    }
  }
  if (options_.size() != requested.size()) {
    return absl::InternalError(absl::StrCat("dynamic table '", name_, "': option lists of different lengths"));
  }
  return absl::OkStatus();
}

void DynamicTableResource::AdvanceTo(int64_t step) {
  // A later step starts a new record; an earlier one (a replayed or concurrent older step) adds to the current.
  if (step > step_stats_.step) step_stats_ = DynamicTableStepStats{step, 0, 0, 0};
}

void DynamicTableResource::RecordLookup(int64_t step, const BatchStats& stats) {
  AdvanceTo(step);
  step_stats_.inserts += stats.inserts;
  step_stats_.refused += stats.refused_full;
}

void DynamicTableResource::RecordEvictions(int64_t step, int64_t evicted) {
  AdvanceTo(step);
  step_stats_.evictions += evicted;
}

DynamicTableLocks::DynamicTableLocks(std::vector<DynamicTableResource*> tables, bool exclusive)
    : tables_(std::move(tables)), exclusive_(exclusive) {
  std::sort(tables_.begin(), tables_.end());
  tables_.erase(std::unique(tables_.begin(), tables_.end()), tables_.end());
  for (DynamicTableResource* t : tables_) {
    if (exclusive_) {
      t->mu()->lock();
    } else {
      t->mu()->lock_shared();
    }
  }
}

DynamicTableLocks::~DynamicTableLocks() {
  for (auto it = tables_.rbegin(); it != tables_.rend(); ++it) {
    if (exclusive_) {
      (*it)->mu()->unlock();
    } else {
      (*it)->mu()->unlock_shared();
    }
  }
}

}  // namespace tf_embed_ops
