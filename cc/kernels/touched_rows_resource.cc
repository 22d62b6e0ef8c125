#include "cc/kernels/touched_rows_resource.h"

#include <atomic>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/resource_mgr.h"

namespace tf_embed_ops {
namespace {

struct Registry {
  tsl::mutex mu;
  absl::flat_hash_map<const tensorflow::Var*, TouchedRowsResource*> tables TF_GUARDED_BY(mu);
  std::atomic<int64_t> size{0};  // read without the lock by the fused update's fast path
};

Registry& GetRegistry() {
  static Registry* registry = new Registry;  // never destroyed: resources may outlive static destruction order
  return *registry;
}

}  // namespace

TouchedRowsResource::TouchedRowsResource(tensorflow::Var* var, int64_t num_rows)
    : var_(var), num_rows_(num_rows), rows_(num_rows) {
  var_->Ref();
  allocated_ = rows_.ok();
}

TouchedRowsResource::~TouchedRowsResource() {
  Registry& registry = GetRegistry();
  {
    tsl::mutex_lock lock(registry.mu);
    auto it = registry.tables.find(var_);
    if (it != registry.tables.end() && it->second == this) {
      registry.tables.erase(it);
      registry.size.store(static_cast<int64_t>(registry.tables.size()));
    }
  }
  var_->Unref();
}

std::string TouchedRowsResource::DebugString() const {
  tsl::mutex_lock lock(mu_);
  return absl::StrCat("TouchedRows(", num_rows_, " rows, version ", rows_.version(), ")");
}

int64_t TouchedRowsResource::MemoryUsed() const {
  tsl::mutex_lock lock(mu_);
  return rows_.MemoryBytes();
}

absl::StatusOr<TouchedRowsResource*> TouchedRowsResource::Track(tensorflow::Var* var, int64_t num_rows) {
  Registry& registry = GetRegistry();
  tsl::mutex_lock lock(registry.mu);
  auto it = registry.tables.find(var);
  // TryRef fails for a resource whose last handle is going away: it is replaced.
  if (it != registry.tables.end() && it->second->TryRef()) {
    if (it->second->num_rows() != num_rows) {
      const int64_t had = it->second->num_rows();
      it->second->Unref();
      return absl::InvalidArgumentError(absl::StrCat("the variable is tracked with ", had, " rows but now has ",
                                                     num_rows, "; a tracked table cannot change its number of rows"));
    }
    return it->second;
  }
  auto* resource = new TouchedRowsResource(var, num_rows);
  if (!resource->allocated_) {
    resource->Unref();
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate touched-row stamps for ", num_rows, " rows"));
  }
  registry.tables[var] = resource;
  registry.size.store(static_cast<int64_t>(registry.tables.size()));
  return resource;
}

void MarkTouchedRows(const tensorflow::Var* var, const RowGradientPlan& plan, bool all_rows) {
  Registry& registry = GetRegistry();
  if (registry.size.load(std::memory_order_relaxed) == 0) return;
  tensorflow::core::RefCountPtr<TouchedRowsResource> resource;
  {
    tsl::mutex_lock lock(registry.mu);
    auto it = registry.tables.find(var);
    if (it == registry.tables.end() || !it->second->TryAcquire()) return;
    resource.reset(it->second);
  }
  tsl::mutex_lock lock(*resource->mu());
  MarkUpdatedRows(plan, all_rows, resource->rows());
}

}  // namespace tf_embed_ops
