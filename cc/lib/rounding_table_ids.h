// The table index that keys each table's stochastic rounding (RoundingSpec::table, cc/lib/stochastic_rounding.h).
//
// An update op keys a 16-bit table's rounding bits by a table index.  By default that is the table's position in
// the op's own config; a front end that splits one embedding's tables over several ops (in-memory and tiered
// tables) passes each table the index it has in the whole embedding instead, so every table draws the bits it
// draws when all tables are in memory, whichever op updates it (docs/low_precision.md, "The random bits").
#ifndef TF_EMBED_OPS_CC_LIB_ROUNDING_TABLE_IDS_H_
#define TF_EMBED_OPS_CC_LIB_ROUNDING_TABLE_IDS_H_

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tf_embed_ops {

// The rounding index of each of `num_tables` tables from the op attr `attr_name` (`given`): the given ids, or,
// when none are given, each table's position.  Rejects a list of the wrong length, a negative id, and two tables
// given one id (they would draw the same bits in one step).  Writes `*ids` only on success.
inline absl::Status ResolveRoundingTableIds(const std::vector<int64_t>& given, int num_tables,
                                            const std::string& attr_name, std::vector<int64_t>* ids) {
  if (given.empty()) {
    std::vector<int64_t> positions(num_tables);
    for (int t = 0; t < num_tables; ++t) positions[t] = t;
    *ids = std::move(positions);
    return absl::OkStatus();
  }
  if (static_cast<int64_t>(given.size()) != num_tables) {
    return absl::InvalidArgumentError(absl::StrCat(attr_name, " has ", given.size(),
                                                   " entries; give none (each table's position in the config) or ",
                                                   "one per table (", num_tables, ")"));
  }
  // (A std container: absl's hash tables are compiled differently under the sanitizers than in TensorFlow's own
  // absl, and this header is built into the op library, where the two meet.)
  std::unordered_map<int64_t, int> first;
  for (int t = 0; t < num_tables; ++t) {
    if (given[t] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(attr_name, "[", t, "] is ", given[t], "; must be >= 0"));
    }
    auto [it, inserted] = first.emplace(given[t], t);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(attr_name, "[", t, "] is ", given[t], ", as ", attr_name, "[",
                                                     it->second, "]: each table needs its own id (two tables with ",
                                                     "one id would draw the same rounding bits)"));
    }
  }
  *ids = given;
  return absl::OkStatus();
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_ROUNDING_TABLE_IDS_H_
