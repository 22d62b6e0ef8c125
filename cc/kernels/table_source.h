// Where a fused op's tables live, as its one lookup kernel and its one update kernel see them
// (embedding_activations_kernel.cc, embedding_send_gradients_kernel.cc).  As FBGEMM generates its in-memory and
// SSD embedding ops from one template, each kernel is written once, as a template over a table source; the op
// registrations stay per kind of table (TfEmbed>EmbeddingActivations, TieredEmbeddingActivations,
// DynamicEmbeddingActivations, and the send ops alike) but share one signature (fused_op_signature.h) and one
// kernel body.  The sources:
//   DenseTableSource    TensorFlow variables [vocabulary_size, dim] (dense_table_source.h)
//   TieredTableSource   tiered tables: rows in a row file behind a DRAM cache (tiered_table_source.h)
//   DynamicTableSource  dynamic tables, in memory or tiered (dynamic_table_source.h: the one place that asks)
//
// A source is a class with these members (a compile-time interface), made once per call; the kernels call them
// in this order, so what may refuse the call runs before the first write (TableSourceBase, below, holds the
// call's context and the members most sources share):
//
//   struct Attrs;  static absl::Status ReadAttrs(ctx, const FusedEmbeddingAttrs&, Attrs*);  the kernel's
//       constructor: the attrs of this kind of table only (the shared ones are read by the kernel)
//   Source(ctx, const FusedEmbeddingAttrs&, const FusedInputs&, const Attrs&);
//   static constexpr const char* kIdNoun;           what the ids are called in errors ("ids", "keys")
//   absl::Status Open(bool update);                 the table handles resolved and checked against the config,
//                                                   and the step input where the op has one
//   absl::Status ReadIds(int f, label, FeatureBatch*);         the feature's ids (a dynamic table's keys)
//   absl::Status CheckIds(int f, label, const FeatureBatch&);  after ValidateFeatureBatch: ids in range
// The lookup:
//   absl::Status PrepareLookup(const FusedFeatures&);  every remaining check (dtypes, shapes, cache capacity)
//   absl::Status ReadRows(const FusedFeatures&);       the rows found, inserted or made resident and pinned
//   template <typename Fn> void WithRows(int t, int f, const Fn& fn) const;  fn(type, row_address) where
//       row_address(i) is the address of the weights row id i of feature f (of table t) reads, `type` elements
// The update:
//   absl::Status Validate(const FusedFeatures&);       the remaining checks before any lock (variables, step)
//   absl::Status Plan(const FusedFeatures&, bool validate_only, EmbeddingWorkspace*);  each table's accumulation plan
//   (BuildPlan) absl::Status Pin(bool validate_only);              the rows made resident and pinned before any is
//   written absl::StatusOr<NonFiniteUpdate> FindNonFinite(int t, float lr, const RowGradientPlan&, const ShardFn&);
//   const int64_t* RowIds(int f, const FusedFeatures&) const;  feature f's ids as table rows (for errors)
//   std::string RowLabel(int t, int64_t row) const;    "row 7", "key 42 (row 3)"
//   std::vector<int> UpdateOrder() const;              the tables in the order they are written
//   absl::Status Update(int t, float lr, const RowGradientPlan&, const ShardFn&);  the walk, then the
//       table's touched-row marks and end of step; fails only on I/O
#ifndef TF_EMBED_OPS_CC_KERNELS_TABLE_SOURCE_H_
#define TF_EMBED_OPS_CC_KERNELS_TABLE_SOURCE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cc/kernels/embedding_kernel_util.h"
#include "cc/kernels/fused_op_signature.h"
#include "cc/kernels/intra_op_shard.h"
#include "cc/lib/feature_layout.h"
#include "cc/lib/gradient_accumulation.h"
#include "cc/lib/optimizers/registry.h"
#include "cc/lib/table_update.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tf_embed_ops {

// Every feature's inputs as the kernels validated them.
struct FusedFeatures {
  std::vector<FeatureBatch> batches;                 // per feature; ids as the source reads them
  std::vector<int64_t> num_samples;                  // per feature
  std::vector<tensorflow::TensorShape> activations;  // per feature: its activation's (and gradient's) shape
  std::vector<int64_t> ids_per_table;                // per table: its features' ids in all
};

// What every source holds, and the members most share (a source declares its own to differ).
class TableSourceBase {
 public:
  TableSourceBase(tensorflow::OpKernelContext* ctx, const FusedEmbeddingAttrs& attrs, const FusedInputs& inputs)
      : ctx_(ctx), attrs_(attrs), inputs_(inputs) {}

  // Ids are int64 rows: ReadFeatureBatch read them, and they must be in [0, vocabulary_size).
  absl::Status ReadIds(int, const std::string&, FeatureBatch*) { return absl::OkStatus(); }
  absl::Status CheckIds(int f, const std::string& label, const FeatureBatch& batch) const {
    const TableSpec& table = attrs_.config.tables[attrs_.config.features[f].table_id];
    return ValidateIds(batch.ids, batch.num_ids, table.vocabulary_size, label, table.name);
  }
  absl::Status Validate(const FusedFeatures&) { return absl::OkStatus(); }
  absl::Status Pin(bool) { return absl::OkStatus(); }
  std::string RowLabel(int, int64_t row) const { return absl::StrCat("row ", row); }
  // Table order.
  std::vector<int> UpdateOrder() const {
    std::vector<int> order(attrs_.num_tables);
    for (int t = 0; t < attrs_.num_tables; ++t) order[t] = t;
    return order;
  }

 protected:
  tensorflow::OpKernelContext* const ctx_;
  const FusedEmbeddingAttrs& attrs_;
  const FusedInputs inputs_;
};

// Table t's features' ids, concatenated in feature order (the order a table's rows are looked up in).
inline std::vector<int64_t> TableIds(const FusedEmbeddingAttrs& attrs, const FusedFeatures& features, int t) {
  std::vector<int64_t> ids;
  ids.reserve(features.ids_per_table[t]);
  for (int f = 0; f < attrs.num_features; ++f) {
    const FeatureBatch& batch = features.batches[f];
    if (attrs.config.features[f].table_id == t) ids.insert(ids.end(), batch.ids, batch.ids + batch.num_ids);
  }
  return ids;
}

// Where each feature's ids start among its table's (TableIds).
inline std::vector<int64_t> FirstIdInTable(const FusedEmbeddingAttrs& attrs, const FusedFeatures& features) {
  std::vector<int64_t> first(attrs.num_features), next(attrs.num_tables, 0);
  for (int f = 0; f < attrs.num_features; ++f) {
    int64_t& n = next[attrs.config.features[f].table_id];
    first[f] = n;
    n += features.batches[f].num_ids;
  }
  return first;
}

// Every feature read (ids through the source: Source::ReadIds, CheckIds) and validated, with its activation's
// shape and, for an update (`gradients`), its gradient's shape (and values, with check_numerics).
template <typename Source>
absl::Status ValidateFeatures(tensorflow::OpKernelContext* ctx, const FusedEmbeddingAttrs& attrs,
                              const FusedInputs& inputs, Source* source, bool gradients, bool check_numerics,
                              FusedFeatures* out) {
  const int n = attrs.num_features;
  out->batches.assign(n, FeatureBatch());
  out->num_samples.assign(n, 0);
  out->activations.assign(n, tensorflow::TensorShape());
  out->ids_per_table.assign(attrs.num_tables, 0);
  for (int f = 0; f < n; ++f) {
    const std::string label = attrs.FeatureLabel(f);
    const int t = attrs.config.features[f].table_id;
    const TableSpec& spec = attrs.config.tables[t];
    FeatureBatch& batch = out->batches[f];
    TF_RETURN_IF_ERROR(ReadFeatureBatch(ctx, inputs, f, label, &batch));
    TF_RETURN_IF_ERROR(source->ReadIds(f, label, &batch));
    TF_RETURN_IF_ERROR(ValidateFeatureBatch(batch, label, &out->num_samples[f]));
    TF_RETURN_IF_ERROR(source->CheckIds(f, label, batch));
    TF_RETURN_IF_ERROR(ActivationShape(batch, spec, label, &out->activations[f]));
    if (gradients) {
      TF_RETURN_IF_ERROR(CheckFeatureGradient(ctx->input(inputs.gradient(f)), f, out->activations[f], label, spec.name,
                                              check_numerics));
    }
    out->ids_per_table[t] += batch.num_ids;
  }
  return absl::OkStatus();
}

// Table t's accumulation plan in ws->plans[t] over its features' gradients (inputs[f]), ids_of(f) being feature
// f's ids as the row walk addresses rows, and rows in [0, num_rows) (0: not known).  When the table's walk will
// run on the calling thread alone (its cost bounded by the step's ids), the plan sums the rows' gradients as it
// builds (RowGradientPlan::Build's sum_dim): the same sums, read in input order instead of gathered by the walk.
template <typename IdsOf>
void BuildPlan(tensorflow::OpKernelContext* ctx, const FusedEmbeddingAttrs& attrs, const FusedInputs& inputs,
               const FusedFeatures& features, int t, const IdsOf& ids_of, int64_t num_rows, EmbeddingWorkspace* ws) {
  std::vector<GradientSource>& sources = ws->sources[t];
  sources.clear();
  for (int f = 0; f < attrs.num_features; ++f) {
    if (attrs.config.features[f].table_id != t) continue;
    sources.push_back(GradientSource{ids_of(f), features.batches[f].num_ids, &ws->layouts[f],
                                     ctx->input(inputs.gradient(f)).flat<float>().data()});
  }
  const TableSpec& table = attrs.config.tables[t];
  const int64_t walk_cost = RowWalkCost(table.dimension, SchemaFor(table.optimization.optimizer).slots.size);
  const bool one_thread = IntraOpBlocks(ctx, features.ids_per_table[t], walk_cost) <= 1;
  ws->plans[t].Build(&sources, num_rows, one_thread ? table.dimension : 0);
}

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_KERNELS_TABLE_SOURCE_H_
