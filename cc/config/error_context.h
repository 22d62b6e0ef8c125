// How validation errors name what they are about, so every message of cc/config reads the same way:
//   table 'user' (table_id 1): ...      feature 'watched' (feature 3): ...      feature 3: ... (unnamed)
#ifndef TF_EMBED_OPS_CC_CONFIG_ERROR_CONTEXT_H_
#define TF_EMBED_OPS_CC_CONFIG_ERROR_CONTEXT_H_

#include <string>

#include "absl/strings/str_cat.h"

namespace tf_embed_ops {

inline std::string TableContext(const std::string& name, int table_id) {
  return absl::StrCat("table '", name, "' (table_id ", table_id, ")");
}

inline std::string FeatureContext(const std::string& name, int index) {
  if (name.empty()) return absl::StrCat("feature ", index);
  return absl::StrCat("feature '", name, "' (feature ", index, ")");
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_CONFIG_ERROR_CONTEXT_H_
