// Helpers the parts of DynamicTable (dynamic_table.cc, dynamic_table_options.cc, dynamic_table_eviction.cc,
// dynamic_table_export.cc) share: the error that names the table, and the eviction-policy checks run both at
// creation and by an explicit Evict.  Internal to cc/lib.
#ifndef TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_ERRORS_H_
#define TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_ERRORS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cc/lib/eviction_policy.h"

namespace tf_embed_ops {
namespace dynamic_table_internal {

inline absl::Status Invalid(const std::string& table, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("dynamic table '", table, "': ", what));
}

// An allocation the call needed failed (nothing was written).
inline absl::Status Exhausted(const std::string& table, const std::string& what) {
  return absl::ResourceExhaustedError(absl::StrCat("dynamic table '", table, "': ", what));
}

// `p` is a valid eviction policy for a table of at most max_rows rows; `what` names the caller in the message.
absl::Status ValidatePolicy(const std::string& name, int64_t max_rows, const EvictionOptions& p, const char* what);

// L2Norm reads every row's weights, which a table with external rows does not hold.
absl::Status L2NormOfExternalRows(const std::string& name, const char* what);

}  // namespace dynamic_table_internal
}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_ERRORS_H_
