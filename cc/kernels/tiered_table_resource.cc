#include "cc/kernels/tiered_table_resource.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cc/kernels/embedding_kernel_util.h"
#include "tsl/platform/logging.h"

namespace tf_embed_ops {

TieredTableResource::TieredTableResource(std::unique_ptr<TieredRowCache> cache, std::string attrs)
    : cache_(std::move(cache)), attrs_(std::move(attrs)) {}

TieredTableResource::~TieredTableResource() {
  const absl::Status s = cache_->Flush();
  if (!s.ok()) LOG(ERROR) << "tiered table '" << name() << "': dirty rows were lost at destruction: " << s;
}

std::string TieredTableResource::DebugString() const {
  const TieredCacheStats stats = cache_->stats();
  return absl::StrCat("TieredTable '", name(), "' (", layout().DebugString(), ", row file '", cache_->path(), "', ",
                      stats.resident_rows, " of ", stats.capacity_rows, " cache rows resident)");
}

int64_t TieredTableResource::MemoryUsed() const {
  return cache_->capacity() * TieredRowCache::RowBytes(cache_->layout()) + cache_->dram_bytes_beside_budget();
}

absl::Status TieredTableResource::CheckSameAttrs(const std::string& attrs) const {
  if (attrs == attrs_) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("tiered table '", name(), "': a table of this name already exists with ", attrs_,
                   ", but this handle asks for ", attrs, "; every handle of a shared table must give the same attrs"));
}

absl::Status LookupTieredTable(tensorflow::OpKernelContext* ctx, int input, const std::string& what,
                               TieredTableRef* out) {
  if (ctx->input_dtype(input) != tensorflow::DT_RESOURCE) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": expected a tiered table handle"));
  }
  return Named(tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, input), out), what);
}

TieredTableLocks::TieredTableLocks(const std::vector<TieredTableRef>& tables, bool exclusive) : exclusive_(exclusive) {
  for (const TieredTableRef& t : tables) held_.push_back(t->mu());
  std::sort(held_.begin(), held_.end());
  held_.erase(std::unique(held_.begin(), held_.end()), held_.end());
  for (tsl::mutex* mu : held_) exclusive_ ? mu->lock() : mu->lock_shared();
}

TieredTableLocks::~TieredTableLocks() {
  for (auto it = held_.rbegin(); it != held_.rend(); ++it) exclusive_ ? (*it)->unlock() : (*it)->unlock_shared();
}

}  // namespace tf_embed_ops
