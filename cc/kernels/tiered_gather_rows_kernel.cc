// Kernel of TfEmbed>TieredTableGatherRows (cc/ops/tiered_gather_rows_ops.cc): the rows a touched-row delta
// names, read as runs of consecutive ids with TieredRowCache::ReadRecords (the cache is not filled).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/kernels/tiered_table_resource.h"
#include "cc/lib/tiered_row_cache.h"
#include "cc/lib/tiered_row_file.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tf_embed_ops {
namespace {

namespace tf = ::tensorflow;

// Rows decoded per ReadRecords call at most: bounds the staging buffer, whatever the run's length.
constexpr int64_t kMaxRunRows = 4096;

class TieredTableGatherRowsOp : public tf::OpKernel {
 public:
  explicit TieredTableGatherRowsOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("S", &num_slots_));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    TieredTableRef table;
    OP_REQUIRES_OK(ctx, LookupTieredTable(ctx, 0, "table", &table));
    const std::string what = absl::StrCat("tiered table '", table->name(), "'");
    OP_REQUIRES(ctx, num_slots_ == table->num_slots(),
                absl::InvalidArgumentError(absl::StrCat(what, " has ", table->num_slots(), " slots but the op gives ",
                                                        num_slots_, " slot tensors")));
    const tf::Tensor& rows_in = ctx->input(1);
    OP_REQUIRES(ctx, rows_in.dims() == 1,
                absl::InvalidArgumentError(
                    absl::StrCat(what, ": rows must be a vector, got shape ", rows_in.shape().DebugString())));
    const auto rows = rows_in.flat<int64_t>();
    const int64_t n = rows.size();
    // Every id before anything is read or allocated for the rows.
    for (int64_t i = 0; i < n; ++i) {
      OP_REQUIRES(ctx, rows(i) >= 0 && rows(i) < table->num_rows(),
                  absl::InvalidArgumentError(
                      absl::StrCat(what, ": rows[", i, "] = ", rows(i), " is outside [0, ", table->num_rows(), ")")));
    }
    const TieredRowLayout& layout = table->layout();
    std::vector<tf::Tensor*> outputs(layout.num_buffers());
    for (int64_t b = 0; b < layout.num_buffers(); ++b) {
      OP_REQUIRES_OK(ctx,
                     ctx->allocate_output(static_cast<int>(b), tf::TensorShape({n, layout.widths[b]}), &outputs[b]));
    }
    const int64_t record_bytes = layout.record_bytes();
    std::unique_ptr<char[]> records(new char[std::min<int64_t>(std::max<int64_t>(n, 1), kMaxRunRows) * record_bytes]);
    std::vector<float*> buffers(layout.num_buffers());
    // Shared: concurrent updates of the rows (which hold the lock exclusively) finish first.
    tf::tf_shared_lock lock(*table->mu());
    for (int64_t i = 0; i < n;) {
      int64_t run = 1;
      while (i + run < n && run < kMaxRunRows && rows(i + run) == rows(i) + run) ++run;
      OP_REQUIRES_OK(ctx, table->cache()->ReadRecords(rows(i), run, records.get()));
      for (int64_t j = 0; j < run; ++j) {
        for (int64_t b = 0; b < layout.num_buffers(); ++b) {
          buffers[b] = outputs[b]->flat<float>().data() + (i + j) * layout.widths[b];
        }
        DecodeRecord(layout, records.get() + j * record_bytes, buffers.data());
      }
      i += run;
    }
  }

 private:
  int num_slots_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("TfEmbed>TieredTableGatherRows").Device(tf::DEVICE_CPU), TieredTableGatherRowsOp);

}  // namespace
}  // namespace tf_embed_ops
