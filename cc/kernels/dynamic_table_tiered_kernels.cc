// Kernels of a tiered dynamic table's streamed checkpoint (docs/tiered_dynamic_tables.md, "Checkpoints"): the keys and
// metadata exported and imported without the rows, the rows read and written one chunk of keys at a time.  Thin:
// resolve the handle, check ranks and sizes, lock, call cc/lib/tiered_dynamic_table.h (which validates the keys
// before it reads or writes a row).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/kernels/dynamic_table_kernel_util.h"
#include "cc/kernels/dynamic_table_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tf_embed_ops {
namespace {

namespace tf = ::tensorflow;

// The table of input 0 and its tiered core, or InvalidArgument naming the op for a table kept in memory.
absl::Status LookupTiered(tf::OpKernelContext* ctx, const char* op, DynamicTableRef* table,
                          TieredDynamicTable** tiered) {
  TF_RETURN_IF_ERROR(LookupDynamicTable(ctx, 0, "table", table));
  *tiered = (*table)->tiered();
  if (*tiered != nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("dynamic table '", (*table)->name(), "': ", op,
                                                 " takes a tiered table (storage=te.Tiered); this one is kept in "
                                                 "memory"));
}

absl::Status OutputVector(tf::OpKernelContext* ctx, int index, const std::vector<int64_t>& values) {
  tf::Tensor* out = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(index, tf::TensorShape({static_cast<int64_t>(values.size())}), &out));
  std::copy(values.begin(), values.end(), out->flat<int64_t>().data());
  return absl::OkStatus();
}

std::vector<int64_t> ToVector(const tf::Tensor& t) {
  const auto flat = t.flat<int64_t>();
  return std::vector<int64_t>(flat.data(), flat.data() + flat.size());
}

class DynamicTableTieredExportKeysOp : public tf::OpKernel {
 public:
  explicit DynamicTableTieredExportKeysOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(tf::OpKernelContext* ctx) override {
    DynamicTableRef table;
    TieredDynamicTable* tiered = nullptr;
    OP_REQUIRES_OK(ctx, LookupTiered(ctx, "TieredExportKeys", &table, &tiered));
    DynamicTableContents c;
    {
      tsl::tf_shared_lock lock(*table->mu());
      c = table->reader().Export();  // external rows: the keys and metadata only
    }
    const std::vector<int64_t>* outputs[] = {&c.keys,         &c.counts,         &c.last_steps,
                                             &c.pending_keys, &c.pending_counts, &c.pending_last_steps};
    for (int i = 0; i < 6; ++i) OP_REQUIRES_OK(ctx, OutputVector(ctx, i, *outputs[i]));
  }
};

class DynamicTableTieredImportKeysOp : public tf::OpKernel {
 public:
  explicit DynamicTableTieredImportKeysOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(tf::OpKernelContext* ctx) override {
    DynamicTableRef table;
    TieredDynamicTable* tiered = nullptr;
    OP_REQUIRES_OK(ctx, LookupTiered(ctx, "TieredImportKeys", &table, &tiered));
    static const char* const kNames[] = {"keys",         "counts",         "last_steps",
                                         "pending_keys", "pending_counts", "pending_last_steps"};
    for (int i = 0; i < 6; ++i) {
      OP_REQUIRES(ctx, ctx->input(1 + i).dims() == 1,
                  absl::InvalidArgumentError(
                      absl::StrCat("dynamic table '", table->name(), "': TieredImportKeys: ", kNames[i],
                                   " must have rank 1, got shape ", ctx->input(1 + i).shape().DebugString())));
    }
    DynamicTableContents c;
    c.dim = table->dim();
    for (int64_t s = 0; s < table->num_slots(); ++s) c.slot_widths.push_back(table->slot_width(s));
    c.slots.resize(table->num_slots());  // empty: the rows come later (TieredWriteRows)
    c.keys = ToVector(ctx->input(1));
    c.counts = ToVector(ctx->input(2));
    c.last_steps = ToVector(ctx->input(3));
    c.pending_keys = ToVector(ctx->input(4));
    c.pending_counts = ToVector(ctx->input(5));
    c.pending_last_steps = ToVector(ctx->input(6));
    tsl::mutex_lock lock(*table->mu());
    OP_REQUIRES_OK(ctx, tiered->Import(c));
    table->ResetStepStats();
  }
};

// The rows of a tiered table by key (TieredReadRows, TieredWriteRows): the table of input 0, tiered, with num_slots
// slots.
class TieredRowsOfKeysOp : public DynamicTableSlotsKernel {
 public:
  using DynamicTableSlotsKernel::DynamicTableSlotsKernel;

 protected:
  absl::Status LookupTieredWithSlots(tf::OpKernelContext* ctx, const char* op, DynamicTableRef* table,
                                     TieredDynamicTable** tiered) const {
    TF_RETURN_IF_ERROR(LookupTiered(ctx, op, table, tiered));
    return CheckNumSlots(**table, num_slots(), op);
  }
};

class DynamicTableTieredReadRowsOp : public TieredRowsOfKeysOp {
 public:
  using TieredRowsOfKeysOp::TieredRowsOfKeysOp;

  void Compute(tf::OpKernelContext* ctx) override {
    DynamicTableRef table;
    TieredDynamicTable* tiered = nullptr;
    OP_REQUIRES_OK(ctx, LookupTieredWithSlots(ctx, "TieredReadRows", &table, &tiered));
    const tf::Tensor& keys = ctx->input(1);
    OP_REQUIRES(ctx, keys.dims() == 1,
                absl::InvalidArgumentError(absl::StrCat("dynamic table '", table->name(),
                                                        "': TieredReadRows: keys must have rank 1, got shape ",
                                                        keys.shape().DebugString())));
    const int64_t n = keys.dim_size(0);
    std::vector<float*> out;
    for (int b = 0; b <= num_slots(); ++b) {
      const int64_t width = b == 0 ? table->dim() : table->slot_width(b - 1);
      tf::Tensor* t = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(b, tf::TensorShape({n, width}), &t));
      out.push_back(t->flat<float>().data());
    }
    tsl::tf_shared_lock lock(*table->mu());
    OP_REQUIRES_OK(ctx, tiered->ReadRowsOfKeys(keys.flat<int64_t>().data(), n, out));
  }
};

class DynamicTableTieredWriteRowsOp : public TieredRowsOfKeysOp {
 public:
  using TieredRowsOfKeysOp::TieredRowsOfKeysOp;

  void Compute(tf::OpKernelContext* ctx) override {
    DynamicTableRef table;
    TieredDynamicTable* tiered = nullptr;
    OP_REQUIRES_OK(ctx, LookupTieredWithSlots(ctx, "TieredWriteRows", &table, &tiered));
    const tf::Tensor& keys = ctx->input(1);
    const int64_t n = keys.dims() == 1 ? keys.dim_size(0) : -1;
    std::vector<const float*> values;
    for (int b = 0; b <= num_slots(); ++b) {
      const tf::Tensor& t = ctx->input(2 + b);
      const int64_t width = b == 0 ? table->dim() : table->slot_width(b - 1);
      const bool ok = n >= 0 && t.dims() == 2 && t.dim_size(0) == n && t.dim_size(1) == width;
      OP_REQUIRES(
          ctx, ok,
          absl::InvalidArgumentError(absl::StrCat(
              "dynamic table '", table->name(), "': TieredWriteRows: keys ", keys.shape().DebugString(), " and ",
              b == 0 ? std::string("weights") : absl::StrCat("slots[", b - 1, "]"), " ", t.shape().DebugString(),
              " do not agree (expected [n] keys and [n, ", width, "] values); nothing was written")));
      values.push_back(t.flat<float>().data());
    }
    tsl::mutex_lock lock(*table->mu());
    OP_REQUIRES_OK(ctx, tiered->WriteRowsOfKeys(keys.flat<int64_t>().data(), n, values));
  }
};

#define REGISTER(name, kernel) REGISTER_KERNEL_BUILDER(Name("TfEmbed>" name).Device(tf::DEVICE_CPU), kernel)
REGISTER("DynamicTableTieredExportKeys", DynamicTableTieredExportKeysOp);
REGISTER("DynamicTableTieredImportKeys", DynamicTableTieredImportKeysOp);
REGISTER("DynamicTableTieredReadRows", DynamicTableTieredReadRowsOp);
REGISTER("DynamicTableTieredWriteRows", DynamicTableTieredWriteRowsOp);
#undef REGISTER

}  // namespace
}  // namespace tf_embed_ops
