// Kernels of the dynamic-table lifecycle ops: the eviction log reader, the per-row statistics and the eviction
// round of a user score, and the export/import of the policies' state (Bloom counters, decayed counts) for
// checkpoints.  Thin: resolve the handle, check ranks and sizes, lock, call cc/lib/dynamic_table.h.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/kernels/dynamic_table_kernel_util.h"
#include "cc/kernels/dynamic_table_resource.h"
#include "cc/kernels/embedding_kernel_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tf_embed_ops {
namespace {

namespace tf = ::tensorflow;

template <typename T, typename U = T>
absl::Status OutputVector(tf::OpKernelContext* ctx, int index, const std::vector<U>& values) {
  tf::Tensor* out = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(index, tf::TensorShape({static_cast<int64_t>(values.size())}), &out));
  auto flat = out->flat<T>();
  for (size_t i = 0; i < values.size(); ++i) flat(i) = static_cast<T>(values[i]);
  return absl::OkStatus();
}

template <typename T>
absl::Status OutputScalar(tf::OpKernelContext* ctx, int index, T value) {
  tf::Tensor* out = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(index, tf::TensorShape({}), &out));
  out->scalar<T>()() = value;
  return absl::OkStatus();
}

absl::Status Vector(const DynamicTableResource& table, const tf::Tensor& t, const char* op, const char* what) {
  if (t.dims() == 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("dynamic table '", table.name(), "': ", op, ": ", what,
                                                 " must have rank 1, got shape ", t.shape().DebugString()));
}

class DynamicTableReadLogOp : public DynamicTableOp {
 public:
  explicit DynamicTableReadLogOp(tf::OpKernelConstruction* ctx) : DynamicTableOp(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_entries", &max_entries_));
  }

  void ComputeOn(tf::OpKernelContext* ctx, DynamicTableResource* table) override {
    const tf::Tensor& cursor = ctx->input(1);
    OP_REQUIRES(ctx, tf::TensorShapeUtils::IsScalar(cursor.shape()),
                absl::InvalidArgumentError(absl::StrCat("dynamic table '", table->name(),
                                                        "': ReadLog: cursor must be a scalar, got shape ",
                                                        cursor.shape().DebugString())));
    std::vector<int64_t> keys, steps;
    std::vector<LogKind> kinds;
    EvictionLog::ReadResult r;
    {
      tsl::tf_shared_lock lock(*table->mu());
      r = table->reader().eviction_log().Read(cursor.scalar<int64_t>()(), max_entries_, &keys, &steps, &kinds);
    }
    OP_REQUIRES_OK(ctx, OutputVector<int64_t>(ctx, 0, keys));
    OP_REQUIRES_OK(ctx, OutputVector<int64_t>(ctx, 1, steps));
    OP_REQUIRES_OK(ctx, OutputVector<int32_t>(ctx, 2, kinds));
    OP_REQUIRES_OK(ctx, OutputScalar<int64_t>(ctx, 3, r.next_cursor));
    OP_REQUIRES_OK(ctx, OutputScalar<bool>(ctx, 4, r.resync));
    OP_REQUIRES_OK(ctx, OutputScalar<int64_t>(ctx, 5, r.dropped));
  }

 private:
  int64_t max_entries_ = -1;
};

class DynamicTableRowStatsOp : public DynamicTableOp {
 public:
  using DynamicTableOp::DynamicTableOp;

  void ComputeOn(tf::OpKernelContext* ctx, DynamicTableResource* table) override {
    DynamicTableRowStats st;
    {
      tsl::tf_shared_lock lock(*table->mu());
      if (TieredDynamicTable* tiered = table->tiered(); tiered != nullptr) {
        absl::StatusOr<DynamicTableRowStats> read = tiered->RowStats();  // norms from the row file, in blocks
        OP_REQUIRES_OK(ctx, read.status());
        st = *std::move(read);
      } else {
        st = table->reader().RowStats();
      }
    }
    OP_REQUIRES_OK(ctx, OutputVector<int64_t>(ctx, 0, st.keys));
    OP_REQUIRES_OK(ctx, OutputVector<int64_t>(ctx, 1, st.counts));
    OP_REQUIRES_OK(ctx, OutputVector<int64_t>(ctx, 2, st.last_steps));
    OP_REQUIRES_OK(ctx, OutputVector<float>(ctx, 3, st.norms));
  }
};

class DynamicTableEvictByScoreOp : public DynamicTableOp {
 public:
  explicit DynamicTableEvictByScoreOp(tf::OpKernelConstruction* ctx) : DynamicTableOp(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_rows", &max_rows_));
  }

  void ComputeOn(tf::OpKernelContext* ctx, DynamicTableResource* table) override {
    const tf::Tensor& keys = ctx->input(1);
    const tf::Tensor& scores = ctx->input(2);
    OP_REQUIRES_OK(ctx, Vector(*table, keys, "EvictByScore", "keys"));
    OP_REQUIRES_OK(ctx, Vector(*table, scores, "EvictByScore", "scores"));
    OP_REQUIRES(
        ctx, keys.NumElements() == scores.NumElements(),
        absl::InvalidArgumentError(absl::StrCat(
            "dynamic table '", table->name(), "': EvictByScore: the score function returned ", scores.NumElements(),
            " scores for ", keys.NumElements(), " rows (one per row); nothing was evicted")));
    int64_t step = 0;
    OP_REQUIRES_OK(ctx, Named(ReadStep(ctx->input(3), &step), absl::StrCat("dynamic table '", table->name(), "'")));
    tsl::mutex_lock lock(*table->mu());
    absl::StatusOr<int64_t> evicted = table->table()->EvictByScore(
        keys.flat<int64_t>().data(), scores.flat<float>().data(), keys.NumElements(), max_rows_, step);
    OP_REQUIRES_OK(ctx, evicted.status());
    table->RecordEvictions(step, *evicted);
    OP_REQUIRES_OK(ctx, OutputScalar<int64_t>(ctx, 0, *evicted));
  }

 private:
  int64_t max_rows_ = 0;
};

class DynamicTableExportPolicyStateOp : public DynamicTableOp {
 public:
  using DynamicTableOp::DynamicTableOp;

  void ComputeOn(tf::OpKernelContext* ctx, DynamicTableResource* table) override {
    DynamicTablePolicyState st;
    {
      tsl::tf_shared_lock lock(*table->mu());
      st = table->reader().ExportPolicyState();
    }
    OP_REQUIRES_OK(ctx, OutputVector<uint8_t>(ctx, 0, st.bloom_counters));
    OP_REQUIRES_OK(ctx, OutputVector<int64_t>(ctx, 1, st.decayed_keys));
    OP_REQUIRES_OK(ctx, OutputVector<float>(ctx, 2, st.decayed_counts));
  }
};

class DynamicTableImportPolicyStateOp : public DynamicTableOp {
 public:
  using DynamicTableOp::DynamicTableOp;

  void ComputeOn(tf::OpKernelContext* ctx, DynamicTableResource* table) override {
    const tf::Tensor& bloom = ctx->input(1);
    OP_REQUIRES(ctx, bloom.dims() == 2,
                absl::InvalidArgumentError(absl::StrCat("dynamic table '", table->name(),
                                                        "': ImportPolicyState: bloom_counters must be [parts, "
                                                        "bytes], got shape ",
                                                        bloom.shape().DebugString())));
    OP_REQUIRES_OK(ctx, Vector(*table, ctx->input(2), "ImportPolicyState", "decayed_keys"));
    OP_REQUIRES_OK(ctx, Vector(*table, ctx->input(3), "ImportPolicyState", "decayed_counts"));
    const auto b = bloom.flat<uint8_t>();
    const auto k = ctx->input(2).flat<int64_t>();
    const auto c = ctx->input(3).flat<float>();
    const std::vector<uint8_t> counters(b.data(), b.data() + b.size());
    const std::vector<int64_t> keys(k.data(), k.data() + k.size());
    const std::vector<float> counts(c.data(), c.data() + c.size());
    // An empty [0, 0] means "no filter state" whatever the parts.
    const int64_t parts = counters.empty() ? 1 : bloom.dim_size(0);
    tsl::mutex_lock lock(*table->mu());
    OP_REQUIRES_OK(ctx, table->table()->ImportPolicyState(counters, parts, keys, counts));
  }
};

#define REGISTER(name, kernel) REGISTER_KERNEL_BUILDER(Name("TfEmbed>" name).Device(tf::DEVICE_CPU), kernel)
REGISTER("DynamicTableReadLog", DynamicTableReadLogOp);
REGISTER("DynamicTableRowStats", DynamicTableRowStatsOp);
REGISTER("DynamicTableEvictByScore", DynamicTableEvictByScoreOp);
REGISTER("DynamicTableExportPolicyState", DynamicTableExportPolicyStateOp);
REGISTER("DynamicTableImportPolicyState", DynamicTableImportPolicyStateOp);
#undef REGISTER

}  // namespace
}  // namespace tf_embed_ops
