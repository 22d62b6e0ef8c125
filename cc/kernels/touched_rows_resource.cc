#include "cc/kernels/touched_rows_resource.h"

#include <atomic>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/resource_mgr.h"

namespace tf_embed_ops {
namespace {

struct Registry {
  tsl::mutex mu;
  absl::flat_hash_map<const tensorflow::ResourceBase*, TouchedRowsResource*> tables TF_GUARDED_BY(mu);
  std::atomic<int64_t> size{0};  // read without the lock by the fused update's fast path
};

Registry& GetRegistry() {
  static Registry* registry = new Registry;  // never destroyed: resources may outlive static destruction order
  return *registry;
}

}  // namespace

TouchedRowsResource::TouchedRowsResource(tensorflow::ResourceBase* table, int64_t num_rows)
    : table_(table), num_rows_(num_rows), rows_(num_rows) {
  table_->Ref();
  allocated_ = rows_.ok();
}

TouchedRowsResource::~TouchedRowsResource() {
  Registry& registry = GetRegistry();
  {
    tsl::mutex_lock lock(registry.mu);
    auto it = registry.tables.find(table_);
    if (it != registry.tables.end() && it->second == this) {
      registry.tables.erase(it);
      registry.size.store(static_cast<int64_t>(registry.tables.size()));
    }
  }
  table_->Unref();
}

std::string TouchedRowsResource::DebugString() const {
  tsl::mutex_lock lock(mu_);
  return absl::StrCat("TouchedRows(", num_rows_, " rows, version ", rows_.version(), ")");
}

int64_t TouchedRowsResource::MemoryUsed() const {
  tsl::mutex_lock lock(mu_);
  return rows_.MemoryBytes();
}

absl::StatusOr<TouchedRowsResource*> TouchedRowsResource::Track(tensorflow::ResourceBase* table, int64_t num_rows) {
  Registry& registry = GetRegistry();
  tsl::mutex_lock lock(registry.mu);
  auto it = registry.tables.find(table);
  // TryRef fails for a resource whose last handle is going away: it is replaced.
  if (it != registry.tables.end() && it->second->TryRef()) {
    if (it->second->num_rows() != num_rows) {
      const int64_t had = it->second->num_rows();
      it->second->Unref();
      return absl::InvalidArgumentError(absl::StrCat("the table is tracked with ", had, " rows but now has ", num_rows,
                                                     "; a tracked table cannot change its number of rows"));
    }
    return it->second;
  }
  auto* resource = new TouchedRowsResource(table, num_rows);
  if (!resource->allocated_) {
    resource->Unref();
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate touched-row stamps for ", num_rows, " rows"));
  }
  registry.tables[table] = resource;
  registry.size.store(static_cast<int64_t>(registry.tables.size()));
  return resource;
}

namespace {

// The tracker of `table` (a new reference), or null when it is not tracked.
tensorflow::core::RefCountPtr<TouchedRowsResource> FindTracker(const tensorflow::ResourceBase* table) {
  tensorflow::core::RefCountPtr<TouchedRowsResource> resource;
  Registry& registry = GetRegistry();
  if (registry.size.load(std::memory_order_relaxed) == 0) return resource;
  tsl::mutex_lock lock(registry.mu);
  auto it = registry.tables.find(table);
  if (it != registry.tables.end() && it->second->TryAcquire()) resource.reset(it->second);
  return resource;
}

}  // namespace

// The lock is held from construction to destruction, a span the analysis cannot follow.
TrackedUpdate::TrackedUpdate(const tensorflow::ResourceBase* table) TF_NO_THREAD_SAFETY_ANALYSIS
    : resource_(FindTracker(table)) {
  if (resource_ == nullptr) return;
  resource_->mu()->lock();
  rows_ = resource_->rows();
}

TrackedUpdate::~TrackedUpdate() TF_NO_THREAD_SAFETY_ANALYSIS {
  if (resource_ != nullptr) resource_->mu()->unlock();
}

void MarkTouchedRows(const tensorflow::ResourceBase* table, const RowGradientPlan& plan, bool all_rows) {
  tensorflow::core::RefCountPtr<TouchedRowsResource> resource = FindTracker(table);
  if (resource == nullptr) return;
  tsl::mutex_lock lock(*resource->mu());
  MarkUpdatedRows(plan, all_rows, resource->rows());
}

void MarkTouchedRowList(const tensorflow::ResourceBase* table, const std::vector<int64_t>& rows) {
  tensorflow::core::RefCountPtr<TouchedRowsResource> resource = FindTracker(table);
  if (resource == nullptr) return;
  tsl::mutex_lock lock(*resource->mu());
  resource->rows()->BeginUpdate();
  resource->rows()->MarkRows(rows.data(), static_cast<int64_t>(rows.size()));
}

void MarkTouchedRowRange(const tensorflow::ResourceBase* table, int64_t first, int64_t n) {
  tensorflow::core::RefCountPtr<TouchedRowsResource> resource = FindTracker(table);
  if (resource == nullptr || n <= 0) return;
  tsl::mutex_lock lock(*resource->mu());
  TouchedRows* rows = resource->rows();
  rows->BeginUpdate();
  if (first == 0 && n >= resource->num_rows()) {
    rows->MarkAll();
    return;
  }
  for (int64_t r = first; r < first + n; ++r) rows->Mark(r);
}

}  // namespace tf_embed_ops
