// The touched-row marks of an update whose rows were written in more than one walk (docs/tracking.md): a tiered
// table's cache windows.  After the walks, one store per de-duplicated row of the plan, or O(1) when the
// optimizer wrote every row (non-lazy Adam).  A single walk marks its rows itself (table_update.h's `touched`).
#ifndef TF_EMBED_OPS_CC_LIB_TOUCHED_ROWS_UPDATE_H_
#define TF_EMBED_OPS_CC_LIB_TOUCHED_ROWS_UPDATE_H_

#include <cstdint>

#include "cc/lib/dynamic_table_update.h"  // UpdatesAllRows(TableOptimization), written once there
#include "cc/lib/embedding_config.h"
#include "cc/lib/gradient_accumulation.h"
#include "cc/lib/prefetch.h"
#include "cc/lib/touched_rows.h"

namespace tf_embed_ops {

inline void MarkUpdatedRows(const RowGradientPlan& plan, bool all_rows, TouchedRows* touched) {
  touched->BeginUpdate();
  if (all_rows) {
    touched->MarkAll();
    return;
  }
  // One store per row, each to a random line of the stamps (4 bytes a row): the lines kAhead rows ahead
  // are requested first so the misses overlap instead of queueing behind each store.
  constexpr int64_t kAhead = 4 * kPrefetchDistance;
  const int64_t n = plan.num_rows();
  for (int64_t u = 0; u < n; ++u) {
    if (u + kAhead < n) PrefetchLine(touched->StampAddress(plan.row(u + kAhead)));
    touched->Mark(plan.row(u));
  }
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_TOUCHED_ROWS_UPDATE_H_
