// Kernels of the touched-row tracking ops (cc/ops/touched_rows_ops.cc, docs/tracking.md).
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/kernels/dynamic_table_kernel_util.h"
#include "cc/kernels/dynamic_table_resource.h"
#include "cc/kernels/tiered_table_resource.h"
#include "cc/kernels/touched_rows_resource.h"
#include "cc/lib/tiered_dynamic_table.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace tf_embed_ops {
namespace {

namespace tf = ::tensorflow;

template <typename T>
absl::Status OutputVector(tf::OpKernelContext* ctx, int index, const std::vector<T>& values) {
  tf::Tensor* out = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(index, tf::TensorShape({static_cast<int64_t>(values.size())}), &out));
  std::copy_n(values.data(), values.size(), out->flat<T>().data());
  return absl::OkStatus();
}

absl::Status OutputMatrix(tf::OpKernelContext* ctx, int index, const std::vector<float>& values, int64_t rows,
                          int64_t cols) {
  tf::Tensor* out = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(index, tf::TensorShape({rows, cols}), &out));
  std::copy_n(values.data(), values.size(), out->flat<float>().data());
  return absl::OkStatus();
}

template <typename T>
void OutputScalar(tf::OpKernelContext* ctx, int index, T value) {
  tf::Tensor* out = nullptr;
  OP_REQUIRES_OK(ctx, ctx->allocate_output(index, tf::TensorShape({}), &out));
  out->scalar<T>()() = value;
}

absl::Status ReadScalar(tf::OpKernelContext* ctx, int input, const char* what, int64_t* value) {
  const tf::Tensor& t = ctx->input(input);
  if (!tf::TensorShapeUtils::IsScalar(t.shape())) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be an int64 scalar, got shape ", t.shape().DebugString()));
  }
  *value = t.scalar<int64_t>()();
  return absl::OkStatus();
}

class TouchedRowsTrackOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(tf::OpKernelContext* ctx) override {
    const tf::ResourceHandle& handle_in = tf::HandleFromInput(ctx, 0);
    absl::StatusOr<TouchedRowsResource*> tracker;
    if (handle_in.ValidateType<TieredTableResource>().ok()) {
      // A tiered table: its fused update and its row writes mark the rows (docs/tracking.md).
      TieredTableRef table;
      OP_REQUIRES_OK(ctx, LookupTieredTable(ctx, 0, "table", &table));
      tracker = TouchedRowsResource::Track(table.get(), table->num_rows());
    } else {
      tf::core::RefCountPtr<tf::Var> var;
      OP_REQUIRES_OK(ctx, tf::LookupResource(ctx, handle_in, &var));
      int64_t rows = 0;
      {
        tf::tf_shared_lock lock(*var->mu());
        OP_REQUIRES(ctx, var->is_initialized && var->tensor()->dims() == 2,
                    absl::InvalidArgumentError(absl::StrCat(
                        "TouchedRowsTrack: the table variable must be initialised and of rank 2, got shape ",
                        var->tensor()->shape().DebugString())));
        rows = var->tensor()->dim_size(0);
      }
      tracker = TouchedRowsResource::Track(var.get(), rows);
    }
    OP_REQUIRES_OK(ctx, tracker.status());
    tf::Tensor* handle = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({}), &handle));
    handle->scalar<tf::ResourceHandle>()() =
        tf::ResourceHandle::MakeRefCountingHandle<TouchedRowsResource>(*tracker, ctx->device()->name());
  }
};

class TouchedRowsSinceOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<TouchedRowsResource> tracker;
    OP_REQUIRES_OK(ctx, tf::LookupResource(ctx, tf::HandleFromInput(ctx, 0), &tracker));
    int64_t id = 0, since = 0;
    OP_REQUIRES_OK(ctx, ReadScalar(ctx, 1, "tracker_id", &id));
    OP_REQUIRES_OK(ctx, ReadScalar(ctx, 2, "since", &since));
    TouchedRows::Changes changes;
    int64_t tracker_id = 0;
    {
      tsl::mutex_lock lock(*tracker->mu());
      tracker_id = tracker->rows()->id();
      changes = tracker->rows()->Since(id == tracker_id ? since : -1, tracker->num_rows());
    }
    OutputScalar<int64_t>(ctx, 0, tracker_id);
    OutputScalar<int64_t>(ctx, 1, changes.version);
    OutputScalar<bool>(ctx, 2, changes.full);
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 3, changes.rows));
  }
};

class TouchedRowsMarkAllOp : public tf::OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(tf::OpKernelContext* ctx) override {
    tf::core::RefCountPtr<TouchedRowsResource> tracker;
    OP_REQUIRES_OK(ctx, tf::LookupResource(ctx, tf::HandleFromInput(ctx, 0), &tracker));
    tsl::mutex_lock lock(*tracker->mu());
    tracker->rows()->BeginUpdate();
    tracker->rows()->MarkAll();
  }
};

// A tiered dynamic table's exported rows (keys and metadata, in key order) given their values: weights and slots
// read by key through the cache.
absl::Status ReadTieredValues(TieredDynamicTable* tiered, DynamicTableContents* c) {
  const int64_t n = static_cast<int64_t>(c->keys.size());
  c->weights.assign(n * c->dim, 0.0f);
  std::vector<float*> out = {c->weights.data()};
  for (size_t k = 0; k < c->slots.size(); ++k) {
    c->slots[k].assign(n * c->slot_widths[k], 0.0f);
    out.push_back(c->slots[k].data());
  }
  return tiered->ReadRowsOfKeys(c->keys.data(), n, out);
}

class DynamicTableChangedSinceOp : public tf::OpKernel {
 public:
  explicit DynamicTableChangedSinceOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_slots", &num_slots_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("mark_all", &mark_all_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("version_only", &version_only_));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    DynamicTableRef table;
    OP_REQUIRES_OK(ctx, LookupDynamicTable(ctx, 0, "table", &table));
    OP_REQUIRES(ctx, num_slots_ == table->num_slots(),
                absl::InvalidArgumentError(absl::StrCat("dynamic table '", table->name(), "': num_slots = ", num_slots_,
                                                        " but the table has ", table->num_slots(), " slots")));
    int64_t id = 0, since = 0;
    OP_REQUIRES_OK(ctx, ReadScalar(ctx, 1, "tracker_id", &id));
    OP_REQUIRES_OK(ctx, ReadScalar(ctx, 2, "since", &since));
    // A tiered table keeps its rows in the tier: its DynamicTable (external rows) exports keys and metadata only,
    // and the changed rows' values are read through the cache (without filling it).  A full answer carries no
    // values (they would be the whole table): the caller reads them by key, chunk by chunk
    // (DynamicTableTieredReadRows).
    TieredDynamicTable* tiered = table->tiered();
    TouchedRows::Changes changes;
    DynamicTableContents c;
    std::vector<int64_t> evicted;
    int64_t tracker_id = 0;
    {
      tsl::mutex_lock lock(*table->mu());
      DynamicTable* t = table->table();
      OP_REQUIRES(ctx, t->EnableTracking(),
                  absl::ResourceExhaustedError(
                      absl::StrCat("dynamic table '", table->name(), "': cannot allocate touched-row stamps")));
      TouchedRows* touched = t->tracker();
      if (mark_all_) {
        touched->BeginUpdate();
        touched->MarkAll();
      }
      tracker_id = touched->id();
      if (version_only_) {
        changes.version = touched->CurrentVersion();
        c.dim = t->dim();
        for (int64_t k = 0; k < t->num_slots(); ++k) c.slot_widths.push_back(t->slot_width(k));
        c.slots.resize(t->num_slots());
      } else {
        changes = touched->Since(id == tracker_id ? since : -1, touched->capacity());
      }
      if (version_only_) {
        // Nothing else to read.
      } else if (changes.full) {
        c = t->ExportRows(t->LiveRows());
      } else {
        // Rows marked but free now were evicted since (they are in the log): keep live rows only.
        std::vector<int64_t> live;
        std::vector<int64_t> probe(1);
        for (const int64_t r : changes.rows) {
          const int64_t key = t->KeyOf(r);
          t->Find(&key, 1, probe.data());
          if (probe[0] == r) live.push_back(r);
        }
        c = t->ExportRows(std::move(live));
        if (tiered != nullptr) OP_REQUIRES_OK(ctx, ReadTieredValues(tiered, &c));
        std::sort(changes.evicted.begin(), changes.evicted.end());
        changes.evicted.erase(std::unique(changes.evicted.begin(), changes.evicted.end()), changes.evicted.end());
        std::vector<int64_t> rows(changes.evicted.size());
        t->Find(changes.evicted.data(), static_cast<int64_t>(changes.evicted.size()), rows.data());
        for (size_t i = 0; i < rows.size(); ++i) {
          if (rows[i] == DynamicTable::kNotAdmitted) evicted.push_back(changes.evicted[i]);
        }
      }
      if (!version_only_) t->ExportPending(&c);
    }
    const int64_t n = static_cast<int64_t>(c.keys.size());
    OutputScalar<int64_t>(ctx, 0, tracker_id);
    OutputScalar<int64_t>(ctx, 1, changes.version);
    OutputScalar<bool>(ctx, 2, changes.full);
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 3, evicted));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, 4, c.keys));
    // A tiered table's full answer: keys and metadata, no values ([0, width]).
    const int64_t with_values = tiered != nullptr && changes.full ? 0 : n;
    OP_REQUIRES_OK(ctx, OutputMatrix(ctx, 5, c.weights, with_values, c.dim));
    for (int k = 0; k < num_slots_; ++k) {
      OP_REQUIRES_OK(ctx, OutputMatrix(ctx, 6 + k, c.slots[k], with_values, c.slot_widths[k]));
    }
    const int rest = 6 + num_slots_;
    OP_REQUIRES_OK(ctx, OutputVector(ctx, rest, c.counts));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, rest + 1, c.last_steps));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, rest + 2, c.pending_keys));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, rest + 3, c.pending_counts));
    OP_REQUIRES_OK(ctx, OutputVector(ctx, rest + 4, c.pending_last_steps));
  }

 private:
  int num_slots_ = 0;
  bool mark_all_ = false;
  bool version_only_ = false;
};

REGISTER_KERNEL_BUILDER(Name("TfEmbed>TouchedRowsTrack").Device(tf::DEVICE_CPU), TouchedRowsTrackOp);
REGISTER_KERNEL_BUILDER(Name("TfEmbed>TouchedRowsSince").Device(tf::DEVICE_CPU), TouchedRowsSinceOp);
REGISTER_KERNEL_BUILDER(Name("TfEmbed>TouchedRowsMarkAll").Device(tf::DEVICE_CPU), TouchedRowsMarkAllOp);
REGISTER_KERNEL_BUILDER(Name("TfEmbed>DynamicTableChangedSince").Device(tf::DEVICE_CPU), DynamicTableChangedSinceOp);

}  // namespace
}  // namespace tf_embed_ops
