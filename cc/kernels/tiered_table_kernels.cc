// Kernels of the tiered-table resource ops (handle, write and read rows, prefetch, flush, stats); the fused lookup
// and update are embedding_activations_kernel.cc and embedding_send_gradients_kernel.cc (TieredTableSource).  Thin:
// resolve the handle, validate every input, lock the table (shared to read, exclusive to change rows), call the cache
// (cc/lib/tiered_row_cache.h).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cc/kernels/fused_op_signature.h"
#include "cc/kernels/tiered_table_resource.h"
#include "cc/kernels/touched_rows_resource.h"
#include "cc/lib/tiered_row_cache.h"
#include "cc/lib/tiered_row_file.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tf_embed_ops {
namespace {

namespace tf = ::tensorflow;

// Looks up the table on every run (one resource-manager lookup), so a destroyed table is made afresh by the
// next run (mode 'open' reopens its file) instead of leaving a dangling handle.
class TieredTableHandleOp : public tf::OpKernel {
 public:
  explicit TieredTableHandleOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::vector<int64_t> slot_widths;
    std::vector<std::string> types;
    int64_t dim = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_name", &name_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("path", &path_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_rows", &layout_.num_rows));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("slot_widths", &slot_widths));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("storage_types", &types));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("cache_bytes", &cache_bytes_));
    std::string mode;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("mode", &mode));
    create_ = mode == "create";
    const std::string what = absl::StrCat("tiered table '", name_, "'");
    OP_REQUIRES(ctx, !path_.empty(), absl::InvalidArgumentError(absl::StrCat(what, ": path is empty")));
    OP_REQUIRES(
        ctx, slot_widths.empty() || slot_widths.size() + 1 == types.size(),
        absl::InvalidArgumentError(absl::StrCat(what, ": ", slot_widths.size(), " slot_widths but ", types.size(),
                                                " storage_types (one per buffer: the table, then ",
                                                "each slot); give one width per slot, or none")));
    for (size_t b = 0; b < types.size(); ++b) {
      const absl::StatusOr<StorageType> type = StorageTypeOfName(types[b]);
      OP_REQUIRES(
          ctx, type.ok(),
          absl::InvalidArgumentError(absl::StrCat(what, ": storage_types[", b, "] is ", type.status().message())));
      layout_.types.push_back(*type);
    }
    layout_.widths.assign(types.size(), dim);
    std::copy(slot_widths.begin(), slot_widths.end(), layout_.widths.begin() + std::min<size_t>(1, types.size()));
    OP_REQUIRES_OK(ctx, layout_.Validate(what));
    capacity_ = TieredRowCache::CapacityFor(cache_bytes_, layout_);
    OP_REQUIRES(
        ctx, capacity_ >= 1,
        absl::InvalidArgumentError(absl::StrCat(what, ": cache_bytes ", cache_bytes_, " holds no row; a row takes ",
                                                TieredRowCache::RowBytes(layout_), " bytes")));
    attrs_ =
        absl::StrCat("path '", path_, "', ", layout_.DebugString(), ", cache_bytes ", cache_bytes_, ", mode ", mode);
  }

  ~TieredTableHandleOp() override {
    if (cinfo_set_ && cinfo_.resource_is_private_to_kernel()) {
      // Ignore NotFound: it may have been destroyed through a handle already.
      cinfo_.resource_manager()->Delete<TieredTableResource>(cinfo_.container(), cinfo_.name()).IgnoreError();
    }
  }

  void Compute(tf::OpKernelContext* ctx) override {
    tf::mutex_lock lock(mu_);
    if (!cinfo_set_) {
      OP_REQUIRES_OK(ctx, cinfo_.Init(ctx->resource_manager(), def(), /*use_node_name_as_default=*/true));
      cinfo_set_ = true;
    }
    TieredTableResource* table = nullptr;
    OP_REQUIRES_OK(ctx, ctx->resource_manager()->LookupOrCreate<TieredTableResource>(
                            cinfo_.container(), cinfo_.name(), &table, [this](TieredTableResource** out) {
                              absl::StatusOr<std::unique_ptr<TieredRowFile>> file =
                                  create_ ? TieredRowFile::Create(path_, name_, layout_)
                                          : TieredRowFile::Open(path_, name_, layout_);
                              if (!file.ok()) return file.status();
                              TieredRowCache::Options options;
                              options.background_writeback = true;  // measured faster: docs/tiered_tables.md
                              *out = new TieredTableResource(
                                  std::make_unique<TieredRowCache>(*std::move(file), capacity_, options), attrs_);
                              return absl::OkStatus();
                            }));
    tf::core::ScopedUnref unref(table);
    OP_REQUIRES_OK(ctx, table->CheckSameAttrs(attrs_));
    tf::Tensor* handle = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({}), &handle));
    handle->scalar<tf::ResourceHandle>()() =
        tf::MakeResourceHandle<TieredTableResource>(ctx, cinfo_.container(), cinfo_.name());
  }

 private:
  std::string name_, path_, attrs_;
  TieredRowLayout layout_;
  int64_t cache_bytes_ = 0;
  int64_t capacity_ = 0;
  bool create_ = false;
  tf::mutex mu_;
  tf::ContainerInfo cinfo_ TF_GUARDED_BY(mu_);
  bool cinfo_set_ TF_GUARDED_BY(mu_) = false;
};

// An op on one table (input 0): Compute resolves it and runs ComputeOn with "tiered table 'x'" for errors.
class TieredTableOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(tf::OpKernelContext* ctx) final {
    TieredTableRef table;
    OP_REQUIRES_OK(ctx, LookupTieredTable(ctx, 0, "table", &table));
    ComputeOn(ctx, table.get(), absl::StrCat("tiered table '", table->name(), "'"));
  }

 protected:
  virtual void ComputeOn(tf::OpKernelContext* ctx, TieredTableResource* table, const std::string& what) = 0;
};

// An int64 scalar input.
absl::Status ScalarInput(tf::OpKernelContext* ctx, int input, const std::string& name, int64_t* out) {
  const tf::Tensor& t = ctx->input(input);
  if (!tf::TensorShapeUtils::IsScalar(t.shape())) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must be a scalar, got shape ", t.shape().DebugString()));
  }
  *out = t.scalar<int64_t>()();
  return absl::OkStatus();
}

// [first, first + n) inside the table.
absl::Status CheckRowRange(const TieredTableResource& table, const std::string& what, int64_t first, int64_t n) {
  if (first < 0 || n < 0 || first > table.num_rows() - n) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": rows [", first, ", ", first, " + ", n,
                                                   ") are outside the table's [0, ", table.num_rows(), ")"));
  }
  return absl::OkStatus();
}

// WriteRows and ReadRows: attr S (the slot count), inputs table and first_row.
class TieredRowsOp : public TieredTableOp {
 public:
  explicit TieredRowsOp(tf::OpKernelConstruction* ctx) : TieredTableOp(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("S", &num_slots_));
  }

 protected:
  // The table must have S slots; first_row.
  absl::Status SlotsAndFirstRow(tf::OpKernelContext* ctx, const TieredTableResource& table, const std::string& what,
                                int64_t* first) const {
    if (num_slots_ != table.num_slots()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " has ", table.num_slots(), " slots but the op gives ", num_slots_, " slot tensors"));
    }
    return ScalarInput(ctx, 1, absl::StrCat(what, ": first_row"), first);
  }

  int num_slots_ = 0;
};

class TieredTableWriteRowsOp : public TieredRowsOp {
 public:
  using TieredRowsOp::TieredRowsOp;

 protected:
  void ComputeOn(tf::OpKernelContext* ctx, TieredTableResource* table, const std::string& what) override {
    int64_t first = 0;
    OP_REQUIRES_OK(ctx, SlotsAndFirstRow(ctx, *table, what, &first));
    const TieredRowLayout& layout = table->layout();
    const tf::Tensor& values = ctx->input(2);
    OP_REQUIRES(ctx, values.dims() == 2 && values.dim_size(1) == table->dim(),
                absl::InvalidArgumentError(absl::StrCat(what, ": values must be [n, ", table->dim(), "], got shape ",
                                                        values.shape().DebugString())));
    const int64_t n = values.dim_size(0);
    OP_REQUIRES_OK(ctx, CheckRowRange(*table, what, first, n));
    for (int k = 0; k < num_slots_; ++k) {
      const tf::Tensor& slot = ctx->input(3 + k);
      OP_REQUIRES(
          ctx, slot.dims() == 2 && slot.dim_size(0) == n && slot.dim_size(1) == table->slot_width(k),
          absl::InvalidArgumentError(absl::StrCat(what, ": slots[", k, "] must be [", n, ", ", table->slot_width(k),
                                                  "], got shape ", slot.shape().DebugString())));
    }
    // Validated: encode every record, then write them under the exclusive lock.
    const int64_t record_bytes = layout.record_bytes();
    std::unique_ptr<char[]> records(new char[std::max<int64_t>(1, n * record_bytes)]);
    std::vector<const float*> buffers(layout.num_buffers());
    for (int64_t i = 0; i < n; ++i) {
      buffers[0] = values.flat<float>().data() + i * table->dim();
      for (int k = 0; k < num_slots_; ++k) {
        buffers[1 + k] = ctx->input(3 + k).flat<float>().data() + i * table->slot_width(k);
      }
      EncodeRecord(layout, buffers.data(), records.get() + i * record_bytes);
    }
    tf::mutex_lock lock(*table->mu());
    const absl::Status written = table->cache()->WriteRecords(first, n, records.get());
    // Touched-row tracking (a restore, docs/tracking.md): the range is marked even when the write failed part
    // way (some rows may hold their new value).
    MarkTouchedRowRange(table, first, n);
    OP_REQUIRES_OK(ctx, written);
  }
};

// A completed restore (chunk by chunk through WriteRows, which marks each chunk's rows): every tracker reads full.
class TieredTableMarkAllTouchedOp : public TieredTableOp {
 public:
  using TieredTableOp::TieredTableOp;

 protected:
  void ComputeOn(tf::OpKernelContext* ctx, TieredTableResource* table, const std::string& what) override {
    tf::mutex_lock lock(*table->mu());  // as WriteRows marks: after any update in flight
    MarkTouchedRowRange(table, 0, table->num_rows());
  }
};

class TieredTableReadRowsOp : public TieredRowsOp {
 public:
  using TieredRowsOp::TieredRowsOp;

 protected:
  void ComputeOn(tf::OpKernelContext* ctx, TieredTableResource* table, const std::string& what) override {
    int64_t first = 0, n = 0;
    OP_REQUIRES_OK(ctx, SlotsAndFirstRow(ctx, *table, what, &first));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 2, absl::StrCat(what, ": num_rows"), &n));
    OP_REQUIRES_OK(ctx, CheckRowRange(*table, what, first, n));
    const TieredRowLayout& layout = table->layout();
    std::vector<float*> buffers(layout.num_buffers());
    std::vector<tf::Tensor*> outputs(layout.num_buffers());
    for (int64_t b = 0; b < layout.num_buffers(); ++b) {
      OP_REQUIRES_OK(ctx,
                     ctx->allocate_output(static_cast<int>(b), tf::TensorShape({n, layout.widths[b]}), &outputs[b]));
    }
    const int64_t record_bytes = layout.record_bytes();
    std::unique_ptr<char[]> records(new char[std::max<int64_t>(1, n * record_bytes)]);
    {
      tf::tf_shared_lock lock(*table->mu());
      OP_REQUIRES_OK(ctx, table->cache()->ReadRecords(first, n, records.get()));
    }
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t b = 0; b < layout.num_buffers(); ++b) {
        buffers[b] = outputs[b]->flat<float>().data() + i * layout.widths[b];
      }
      DecodeRecord(layout, records.get() + i * record_bytes, buffers.data());
    }
  }
};

class TieredTablePrefetchOp : public TieredTableOp {
 public:
  using TieredTableOp::TieredTableOp;

 protected:
  void ComputeOn(tf::OpKernelContext* ctx, TieredTableResource* table, const std::string& what) override {
    const auto ids = ctx->input(1).flat<int64_t>();
    for (int64_t i = 0; i < ids.size(); ++i) {
      OP_REQUIRES(ctx, ids(i) >= 0 && ids(i) < table->num_rows(),
                  absl::InvalidArgumentError(absl::StrCat(what, ": ids[", i, "] (flat position) = ", ids(i),
                                                          " is outside [0, ", table->num_rows(), ")")));
    }
    std::vector<int64_t> rows(ids.data(), ids.data() + ids.size());  // (made distinct on the cache's thread)
    // No table lock: the cache only moves unpinned rows (see tiered_table_resource.h).  The reads run on the
    // cache's prefetch thread; the op returns at once.
    OP_REQUIRES_OK(ctx, table->cache()->StartPrefetch(std::move(rows)));
  }
};

class TieredTableFlushOp : public TieredTableOp {
 public:
  using TieredTableOp::TieredTableOp;

 protected:
  void ComputeOn(tf::OpKernelContext* ctx, TieredTableResource* table, const std::string& what) override {
    tf::mutex_lock lock(*table->mu());
    OP_REQUIRES_OK(ctx, table->cache()->Flush());
  }
};

class TieredTableStatsOp : public TieredTableOp {
 public:
  using TieredTableOp::TieredTableOp;

 protected:
  void ComputeOn(tf::OpKernelContext* ctx, TieredTableResource* table, const std::string& what) override {
    const auto stats = table->cache()->stats().AsArray();
    tf::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({static_cast<int64_t>(stats.size())}), &out));
    std::copy(stats.begin(), stats.end(), out->flat<int64_t>().data());
  }
};

REGISTER_KERNEL_BUILDER(Name("TfEmbed>TieredTableHandle").Device(tf::DEVICE_CPU), TieredTableHandleOp);
REGISTER_KERNEL_BUILDER(Name("TfEmbed>TieredTableWriteRows").Device(tf::DEVICE_CPU), TieredTableWriteRowsOp);
REGISTER_KERNEL_BUILDER(Name("TfEmbed>TieredTableMarkAllTouched").Device(tf::DEVICE_CPU), TieredTableMarkAllTouchedOp);
REGISTER_KERNEL_BUILDER(Name("TfEmbed>TieredTableReadRows").Device(tf::DEVICE_CPU), TieredTableReadRowsOp);
REGISTER_KERNEL_BUILDER(Name("TfEmbed>TieredTablePrefetch").Device(tf::DEVICE_CPU), TieredTablePrefetchOp);
REGISTER_KERNEL_BUILDER(Name("TfEmbed>TieredTableFlush").Device(tf::DEVICE_CPU), TieredTableFlushOp);
REGISTER_KERNEL_BUILDER(Name("TfEmbed>TieredTableStats").Device(tf::DEVICE_CPU), TieredTableStatsOp);

}  // namespace
}  // namespace tf_embed_ops
