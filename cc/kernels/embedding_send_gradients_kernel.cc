// The one kernel of the fused update ops (TfEmbed>SendTPUEmbeddingGradients and ...V2, TieredSend...,
// DynamicSend...), a template over where the tables live (table_source.h), in named steps:
//   Validate: the tables against the config, every feature (structure, ids or keys), its gradient's shape (and
//             values, with check_numerics), the ids per table, the learning rates, and what the source checks
//             (variables, the step); nothing sized by an input is allocated and nothing is written.
//   Plan:     per feature the id -> sample layout, per table the combiner backward + accumulation plan
//             (cc/lib/gradient_accumulation.h) over the rows as the source's walk addresses them, under the
//             tables' locks where the rows depend on them; then the rows a source must pin, pinned.
//   Check:    with check_numerics, a dry run of every table's update (the same row walk, writing nothing): a
//             per-row gradient sum that overflows, or an update that would first store a NaN or +-inf, rejects the
//             step before any table is written.  validate_only stops here.
//   Update:   per table the one row walk (cc/lib/table_update.h) over the source's rows, sharded over the intra-op
//             pool, in place (16-bit tables and slots rounded back as docs/low_precision.md says), then the
//             table's touched-row marks and end of step.
// Plan and Update fail only on a tiered table's I/O, so a rejected call changes no table and no slot.
#define EIGEN_USE_THREADS

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/kernels/dense_table_source.h"
#include "cc/kernels/dynamic_table_kernel_util.h"
#include "cc/kernels/dynamic_table_source.h"
#include "cc/kernels/embedding_kernel_util.h"
#include "cc/kernels/fused_op_signature.h"
#include "cc/kernels/table_source.h"
#include "cc/kernels/tiered_table_source.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_embed_ops {
namespace {

template <typename Source>
class SendGradientsOp : public tensorflow::OpKernel {
 public:
  explicit SendGradientsOp(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx), inputs_(FusedInputs::Lookup(0, 0)) {
    OP_REQUIRES_OK(ctx, attrs_.Init(ctx));
    int num_learning_rates = 0;
    int num_slots = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("NN", &num_learning_rates));
    if (ctx->HasAttr("S")) OP_REQUIRES_OK(ctx, ctx->GetAttr("S", &num_slots));  // the static op's slots
    OP_REQUIRES_OK(ctx, ctx->GetAttr("check_numerics", &check_numerics_));
    if (ctx->HasAttr("validate_only")) OP_REQUIRES_OK(ctx, ctx->GetAttr("validate_only", &validate_only_));
    OP_REQUIRES_OK(ctx, CheckLearningRateCount(num_learning_rates, attrs_.config));
    inputs_ = FusedInputs::Update(attrs_.num_features, num_learning_rates, attrs_.num_tables, num_slots);
    OP_REQUIRES_OK(ctx, Source::ReadAttrs(ctx, attrs_, inputs_, /*update=*/true, &source_attrs_));
    tag_tables_ = TablesPerTag(attrs_.config);
  }

  void Compute(tensorflow::OpKernelContext* ctx) override {
    const EmbeddingConfig& config = attrs_.config;
    Source source(ctx, attrs_, inputs_, source_attrs_);

    // 1. Validate.
    OP_REQUIRES_OK(ctx, source.Open(/*update=*/true));
    FusedFeatures features;
    OP_REQUIRES_OK(ctx,
                   ValidateFeatures(ctx, attrs_, inputs_, &source, /*gradients=*/true, check_numerics_, &features));
    OP_REQUIRES_OK(ctx, CheckIdsPerTable(features.ids_per_table, config, Source::kIdNoun));
    std::vector<float> learning_rates;
    OP_REQUIRES_OK(ctx, ReadLearningRates(ctx, inputs_, tag_tables_, &learning_rates));
    OP_REQUIRES_OK(ctx, source.Validate(features));

    // 2. Plan, and pin.
    WorkspacePool::Scoped ws = workspaces_.Acquire();
    ws->layouts.resize(attrs_.num_features);
    for (int f = 0; f < attrs_.num_features; ++f) {
      BuildValidatedFeatureLayout(features.batches[f], features.num_samples[f], attrs_.combiners[f], &ws->layouts[f],
                                  LayoutParts::kSampleOf);
    }
    ws->sources.resize(attrs_.num_tables);
    ws->plans.resize(attrs_.num_tables);
    OP_REQUIRES_OK(ctx, source.Plan(features, validate_only_, ws.get()));
    if (validate_only_ && !check_numerics_) return;
    OP_REQUIRES_OK(ctx, source.Pin(validate_only_));

    // 3. check_numerics: every table's update is computed once without writing (FindNonFiniteUpdate) before any
    //    is written, so a step that would introduce a NaN or +-inf anywhere changes nothing.  Recomputing is
    //    cheaper than staging the updated rows (a non-lazy optimizer would stage the whole table), and costs
    //    nothing when the check is off.
    const ShardFn shard = IntraOpShardFn(ctx);
    if (check_numerics_) {
      for (int t = 0; t < attrs_.num_tables; ++t) {
        const absl::StatusOr<NonFiniteUpdate> bad =
            source.FindNonFinite(t, TableLearningRate(config.tables[t], learning_rates), ws->plans[t], shard);
        OP_REQUIRES_OK(ctx, bad.status());
        if (!bad->found) continue;
        std::vector<const int64_t*> ids;
        std::vector<int64_t> num_ids;
        for (int f = 0; f < attrs_.num_features; ++f) {
          ids.push_back(source.RowIds(f, features));
          num_ids.push_back(features.batches[f].num_ids);
        }
        OP_REQUIRES_OK(ctx, NonFiniteUpdateError(attrs_, t, *bad, ids, num_ids, source.RowLabel(t, bad->row)));
      }
    }
    if (validate_only_) return;

    // 4. Update.
    for (int t : source.UpdateOrder()) {
      OP_REQUIRES_OK(ctx, source.Update(t, TableLearningRate(config.tables[t], learning_rates), ws->plans[t], shard));
    }
  }

 private:
  FusedEmbeddingAttrs attrs_;
  FusedInputs inputs_;
  typename Source::Attrs source_attrs_;
  WorkspacePool workspaces_;
  bool check_numerics_ = false;
  bool validate_only_ = false;                        // checks only: shared locks, nothing written
  std::vector<std::vector<std::string>> tag_tables_;  // per dynamic tag: the tables that use it
};

// The static op's two names differ only by the rounding_step input (cc/ops/embedding_ops.cc).
REGISTER_KERNEL_BUILDER(Name("TfEmbed>SendTPUEmbeddingGradients").Device(tensorflow::DEVICE_CPU),
                        SendGradientsOp<DenseTableSource>);
REGISTER_KERNEL_BUILDER(Name("TfEmbed>SendTPUEmbeddingGradientsV2").Device(tensorflow::DEVICE_CPU),
                        SendGradientsOp<DenseTableSource>);
REGISTER_KERNEL_BUILDER(Name("TfEmbed>TieredSendTPUEmbeddingGradients").Device(tensorflow::DEVICE_CPU),
                        SendGradientsOp<TieredTableSource>);
// In memory and tiered dynamic tables alike (DynamicRows).
REGISTER_KERNEL_BUILDER(Name("TfEmbed>DynamicSendTPUEmbeddingGradients").Device(tensorflow::DEVICE_CPU),
                        SendGradientsOp<DynamicTableSource>);

}  // namespace
}  // namespace tf_embed_ops
