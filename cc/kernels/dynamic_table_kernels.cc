// Kernels of the dynamic-table resource ops (handle, find, lookup, stats, export, import, evict); the fused
// lookup and update are the one activations and send-gradients kernels over dynamic_table_source.h.  Thin:
// resolve the handle, validate the inputs, lock the table (shared to read, exclusive to change it), call
// cc/lib/dynamic_table.h, which validates its own arguments before it changes anything.
#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cc/kernels/dynamic_table_kernel_util.h"
#include "cc/kernels/dynamic_table_resource.h"
#include "cc/kernels/embedding_kernel_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tf_embed_ops {
namespace {

namespace tf = ::tensorflow;

absl::Status BadAttr(const std::string& table, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("dynamic table '", table, "': ", what));
}

absl::StatusOr<EvictionPolicy> ParsePolicy(const std::string& name) {
  if (name == "none") return EvictionPolicy::kNone;
  if (name == "lru") return EvictionPolicy::kLru;
  if (name == "lfu") return EvictionPolicy::kLfu;
  if (name == "ttl") return EvictionPolicy::kTtl;
  if (name == "l2_norm") return EvictionPolicy::kL2Norm;
  if (name == "decayed_lfu") return EvictionPolicy::kDecayedLfu;
  if (name == "count_and_age") return EvictionPolicy::kCountAndAge;
  return absl::InvalidArgumentError(absl::StrCat("unknown eviction policy '", name, "'"));
}

// The handle op's attrs as table options, plus their text form (what a second handle must repeat).  Value
// ranges are DynamicTable::Create's to check; this checks what only the attrs know (initializer_params' length).
absl::Status ReadTableOptions(tf::OpKernelConstruction* ctx, DynamicTableOptions* o, tf::DataType* key_dtype,
                              DynamicTableOptionList* list) {
  std::string initializer, eviction;
  std::vector<float> params;
  int64_t seed = 0;
  TF_RETURN_IF_ERROR(ctx->GetAttr("table_name", &o->name));
  TF_RETURN_IF_ERROR(ctx->GetAttr("dim", &o->dim));
  TF_RETURN_IF_ERROR(ctx->GetAttr("key_dtype", key_dtype));
  TF_RETURN_IF_ERROR(ctx->GetAttr("slot_initial_values", &o->slot_initial_values));
  TF_RETURN_IF_ERROR(ctx->GetAttr("slot_widths", &o->slot_widths));
  TF_RETURN_IF_ERROR(ctx->GetAttr("initial_capacity", &o->initial_capacity));
  TF_RETURN_IF_ERROR(ctx->GetAttr("max_rows", &o->max_rows));
  TF_RETURN_IF_ERROR(ctx->GetAttr("rows_per_chunk", &o->rows_per_chunk));
  TF_RETURN_IF_ERROR(ctx->GetAttr("initializer", &initializer));
  TF_RETURN_IF_ERROR(ctx->GetAttr("initializer_params", &params));
  TF_RETURN_IF_ERROR(ctx->GetAttr("seed", &seed));
  TF_RETURN_IF_ERROR(ctx->GetAttr("admission_min_count", &o->admission.min_count));
  TF_RETURN_IF_ERROR(ctx->GetAttr("max_pending_keys", &o->admission.max_pending_keys));
  TF_RETURN_IF_ERROR(ctx->GetAttr("pending_ttl_steps", &o->admission.pending_ttl_steps));
  TF_RETURN_IF_ERROR(ctx->GetAttr("eviction", &eviction));
  TF_RETURN_IF_ERROR(ctx->GetAttr("eviction_max_rows", &o->eviction.target_rows));
  TF_RETURN_IF_ERROR(ctx->GetAttr("eviction_ttl_steps", &o->eviction.ttl_steps));
  float min_norm = 0.0f, decay = 1.0f;
  TF_RETURN_IF_ERROR(ctx->GetAttr("eviction_min_norm", &min_norm));
  TF_RETURN_IF_ERROR(ctx->GetAttr("eviction_decay", &decay));
  o->eviction.min_norm = min_norm;
  o->eviction.decay = decay;
  TF_RETURN_IF_ERROR(ctx->GetAttr("eviction_min_count", &o->eviction.min_count));
  TF_RETURN_IF_ERROR(ctx->GetAttr("bloom_num_counters", &o->admission.bloom_num_counters));
  TF_RETURN_IF_ERROR(ctx->GetAttr("bloom_num_hashes", &o->admission.bloom_num_hashes));
  TF_RETURN_IF_ERROR(ctx->GetAttr("bloom_counter_bits", &o->admission.bloom_counter_bits));
  TF_RETURN_IF_ERROR(ctx->GetAttr("log_refused", &o->admission.log_refused));
  TF_RETURN_IF_ERROR(ctx->GetAttr("eviction_log_capacity", &o->eviction_log_capacity));
  std::string storage, slot_storage, rounding;
  TF_RETURN_IF_ERROR(ctx->GetAttr("storage_dtype", &storage));
  TF_RETURN_IF_ERROR(ctx->GetAttr("slot_storage_dtype", &slot_storage));
  TF_RETURN_IF_ERROR(ctx->GetAttr("rounding", &rounding));
  // The attrs' allowed values are exactly these names (cc/ops/dynamic_table_ops.cc).
  auto storage_type = [](const std::string& name) {
    return name == "bfloat16"  ? StorageType::kBfloat16
           : name == "float16" ? StorageType::kFloat16
                               : StorageType::kFloat32;
  };
  o->storage = storage_type(storage);
  o->slot_storage = storage_type(slot_storage);
  o->rounding = rounding == "nearest" ? Rounding::kNearest : Rounding::kStochastic;

  RowInitializer& init = o->initializer;
  init.seed = static_cast<uint64_t>(seed);
  size_t expected_params = 0;
  if (initializer == "zeros") {
    init.kind = RowInitializerKind::kZeros;
  } else if (initializer == "constant") {
    init.kind = RowInitializerKind::kConstant;
    expected_params = 1;
  } else if (initializer == "uniform") {
    init.kind = RowInitializerKind::kUniform;
    expected_params = 2;
  } else if (initializer == "normal" || initializer == "truncated_normal") {
    init.kind = initializer == "normal" ? RowInitializerKind::kNormal : RowInitializerKind::kTruncatedNormal;
    expected_params = 2;
  } else {
    return BadAttr(o->name, absl::StrCat("unknown initializer '", initializer, "'"));
  }
  if (params.size() != expected_params) {
    return BadAttr(o->name, absl::StrCat("initializer '", initializer, "' takes ", expected_params,
                                         " initializer_params ([] zeros, [value] constant, [minval, maxval] uniform, "
                                         "[mean, stddev] normal / truncated_normal), got ",
                                         params.size()));
  }
  if (init.kind == RowInitializerKind::kConstant) init.value = params[0];
  if (init.kind == RowInitializerKind::kUniform) std::tie(init.minval, init.maxval) = std::tie(params[0], params[1]);
  if (init.kind == RowInitializerKind::kNormal || init.kind == RowInitializerKind::kTruncatedNormal) {
    std::tie(init.mean, init.stddev) = std::tie(params[0], params[1]);
  }
  absl::StatusOr<EvictionPolicy> policy = ParsePolicy(eviction);
  if (!policy.ok()) return BadAttr(o->name, std::string(policy.status().message()));
  o->eviction.policy = *policy;

  *list = {
      {"dim", absl::StrCat(o->dim)},
      {"key_dtype", tf::DataTypeString(*key_dtype)},
      {"slot_initial_values", absl::StrCat("[", absl::StrJoin(o->slot_initial_values, ", "), "]")},
      {"slot_widths", absl::StrCat("[", absl::StrJoin(o->slot_widths, ", "), "]")},
      {"initial_capacity", absl::StrCat(o->initial_capacity)},
      {"max_rows", absl::StrCat(o->max_rows)},
      {"rows_per_chunk", absl::StrCat(o->rows_per_chunk)},
      {"initializer", initializer},
      {"initializer_params", absl::StrCat("[", absl::StrJoin(params, ", "), "]")},
      {"seed", absl::StrCat(seed)},
      {"admission_min_count", absl::StrCat(o->admission.min_count)},
      {"max_pending_keys", absl::StrCat(o->admission.max_pending_keys)},
      {"pending_ttl_steps", absl::StrCat(o->admission.pending_ttl_steps)},
      {"eviction", eviction},
      {"eviction_max_rows", absl::StrCat(o->eviction.target_rows)},
      {"eviction_ttl_steps", absl::StrCat(o->eviction.ttl_steps)},
      {"eviction_min_norm", absl::StrCat(min_norm)},
      {"eviction_decay", absl::StrCat(decay)},
      {"eviction_min_count", absl::StrCat(o->eviction.min_count)},
      {"bloom_num_counters", absl::StrCat(o->admission.bloom_num_counters)},
      {"bloom_num_hashes", absl::StrCat(o->admission.bloom_num_hashes)},
      {"bloom_counter_bits", absl::StrCat(o->admission.bloom_counter_bits)},
      {"log_refused", o->admission.log_refused ? "true" : "false"},
      {"eviction_log_capacity", absl::StrCat(o->eviction_log_capacity)},
      {"storage_dtype", storage},
      {"slot_storage_dtype", slot_storage},
      {"rounding", rounding},
      {"table_name", o->name},
  };
  return absl::OkStatus();
}

// Looks up or creates the table on every run (cheap: one resource-manager lookup), so a table destroyed with
// DestroyResourceOp is created afresh by the next run instead of leaving a dangling handle.
class DynamicTableHandleOp : public tf::OpKernel {
 public:
  explicit DynamicTableHandleOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadTableOptions(ctx, &options_, &key_dtype_, &option_list_));
    // A tiered table (docs/tiered_tables.md): its rows in the row file tiered_path behind a DRAM cache.
    OP_REQUIRES_OK(ctx, ctx->GetAttr("tiered_path", &tiered_.path));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("tiered_cache_bytes", &tiered_.cache_bytes));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("tiered_mode", &tiered_mode_));
    if (!tiered_.path.empty()) {
      option_list_.insert(option_list_.end(), {{"tiered_path", tiered_.path},
                                               {"tiered_cache_bytes", absl::StrCat(tiered_.cache_bytes)},
                                               {"tiered_mode", tiered_mode_}});
    }
  }

  ~DynamicTableHandleOp() override {
    if (cinfo_set_ && cinfo_.resource_is_private_to_kernel()) {
      // Ignore NotFound: it may have been destroyed through a handle already.
      cinfo_.resource_manager()->Delete<DynamicTableResource>(cinfo_.container(), cinfo_.name()).IgnoreError();
    }
  }

  void Compute(tf::OpKernelContext* ctx) override {
    tf::mutex_lock lock(mu_);
    if (!cinfo_set_) {
      OP_REQUIRES_OK(ctx, cinfo_.Init(ctx->resource_manager(), def(), /*use_node_name_as_default=*/true));
      cinfo_set_ = true;
    }
    DynamicTableResource* table = nullptr;
    OP_REQUIRES_OK(ctx, ctx->resource_manager()->LookupOrCreate<DynamicTableResource>(
                            cinfo_.container(), cinfo_.name(), &table, [this](DynamicTableResource** out) {
                              if (!tiered_.path.empty()) return CreateTiered(out);
                              absl::StatusOr<std::unique_ptr<DynamicTable>> created = DynamicTable::Create(options_);
                              if (!created.ok()) return created.status();
                              *out = new DynamicTableResource(*std::move(created), key_dtype_, option_list_);
                              return absl::OkStatus();
                            }));
    tf::core::ScopedUnref unref(table);
    OP_REQUIRES_OK(ctx, table->CheckSameOptions(option_list_));
    tf::Tensor* handle = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({}), &handle));
    handle->scalar<tf::ResourceHandle>()() =
        tf::MakeResourceHandle<DynamicTableResource>(ctx, cinfo_.container(), cinfo_.name());
  }

 private:
  absl::Status CreateTiered(DynamicTableResource** out) const {
    // "overwrite": a restarted job's file (of a killed process) goes; the job then restores its checkpoint.
    if (tiered_mode_ == "overwrite" && ::unlink(tiered_.path.c_str()) != 0 && errno != ENOENT) {
      return absl::InternalError(absl::StrCat("dynamic table '", options_.name, "': cannot remove row file '",
                                              tiered_.path, "' (mode 'overwrite'): ", std::strerror(errno)));
    }
    absl::StatusOr<std::unique_ptr<TieredDynamicTable>> created = TieredDynamicTable::Create(options_, tiered_);
    if (!created.ok()) return created.status();
    *out = new DynamicTableResource(*std::move(created), key_dtype_, option_list_);
    return absl::OkStatus();
  }

  DynamicTableOptions options_;
  TieredDynamicOptions tiered_;
  std::string tiered_mode_;
  tf::DataType key_dtype_ = tf::DT_INT64;
  DynamicTableOptionList option_list_;
  tf::mutex mu_;
  tf::ContainerInfo cinfo_ TF_GUARDED_BY(mu_);
  bool cinfo_set_ TF_GUARDED_BY(mu_) = false;
};

// Find and Lookup: keys -> rows under the shared lock.
class DynamicTableFindOp : public tf::OpKernel {
 public:
  explicit DynamicTableFindOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(tf::OpKernelContext* ctx) override {
    TableAndKeys k;
    OP_REQUIRES_OK(ctx, LookupTableAndKeys(ctx, &k));
    tf::Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({k.n}), &rows));
    tsl::tf_shared_lock lock(*k.table->mu());
    k.table->reader().Find(k.keys, k.n, rows->flat<int64_t>().data());
  }
};

// A tiered table's weights of `rows` (zeros for a key without a row) as float32 [n, dim], read through its cache
// in blocks that fit it.
absl::Status ReadTieredWeights(TieredDynamicTable* tiered, const std::vector<int64_t>& rows, float* out) {
  const TieredRowLayout& layout = tiered->layout();
  const int64_t dim = layout.widths[0];
  std::vector<int64_t> live;
  std::vector<int64_t> at;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] == DynamicTable::kNotAdmitted) {
      std::fill_n(out + i * dim, dim, 0.0f);
    } else {
      live.push_back(rows[i]);
      at.push_back(static_cast<int64_t>(i));
    }
  }
  std::vector<std::vector<float>> buffers(layout.num_buffers());
  std::vector<float*> pointers(layout.num_buffers());
  constexpr size_t kBlock = 4096;
  for (size_t first = 0; first < live.size(); first += kBlock) {
    const size_t end = std::min(live.size(), first + kBlock);
    const std::vector<int64_t> block(live.begin() + first, live.begin() + end);
    for (int64_t b = 0; b < layout.num_buffers(); ++b) {
      buffers[b].resize(block.size() * layout.widths[b]);
      pointers[b] = buffers[b].data();
    }
    TF_RETURN_IF_ERROR(tiered->ReadRows(block, pointers));
    for (size_t i = first; i < end; ++i) {
      std::copy_n(buffers[0].data() + (i - first) * dim, dim, out + at[i] * dim);
    }
  }
  return absl::OkStatus();
}

class DynamicTableLookupOp : public tf::OpKernel {
 public:
  explicit DynamicTableLookupOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(tf::OpKernelContext* ctx) override {
    TableAndKeys k;
    OP_REQUIRES_OK(ctx, LookupTableAndKeys(ctx, &k));
    const int64_t n = k.n;
    const int64_t dim = k.table->dim();
    tf::Tensor* values = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({n, dim}), &values));
    std::vector<int64_t> rows(n);
    float* out = values->flat<float>().data();
    tsl::tf_shared_lock lock(*k.table->mu());
    const DynamicTable& t = k.table->reader();
    t.Find(k.keys, n, rows.data());
    if (TieredDynamicTable* tiered = k.table->tiered(); tiered != nullptr) {
      OP_REQUIRES_OK(ctx, ReadTieredWeights(tiered, rows, out));
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      if (rows[i] == DynamicTable::kNotAdmitted) {
        std::fill_n(out + i * dim, dim, 0.0f);
      } else {
        t.ReadRow(0, rows[i], out + i * dim);  // float32 activations for any storage
      }
    }
  }
};

class DynamicTableStatsOp : public DynamicTableOp {
 public:
  using DynamicTableOp::DynamicTableOp;

  void ComputeOn(tf::OpKernelContext* ctx, DynamicTableResource* table) override {
    std::vector<int64_t> values;
    {
      tsl::tf_shared_lock lock(*table->mu());
      const DynamicTable& t = table->reader();
      const DynamicTableCounters& c = t.counters();
      const DynamicTableStepStats last = table->step_stats();
      values = {t.size(),       t.capacity(), table->memory_bytes(), c.inserts,    c.below_admission, c.untracked,
                c.refused_full, c.evictions,  last.inserts,          last.refused, last.evictions};
    }
    for (size_t i = 0; i < values.size(); ++i) {
      tf::Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(static_cast<int>(i), tf::TensorShape({}), &out));
      out->scalar<int64_t>()() = values[i];
    }
  }
};

// Export and import refuse a num_slots that is not the table's before they read or write anything.
constexpr char kNothingChanged[] = "; nothing was changed";

// Copies a vector into a new output tensor of `shape`.
template <typename T>
absl::Status Output(tf::OpKernelContext* ctx, int index, const tf::TensorShape& shape, const std::vector<T>& values,
                    int64_t offset = 0) {
  tf::Tensor* out = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(index, shape, &out));
  std::copy_n(values.data() + offset, shape.num_elements(), out->flat<T>().data());
  return absl::OkStatus();
}

class DynamicTableExportOp : public DynamicTableSlotsKernel {
 public:
  using DynamicTableSlotsKernel::DynamicTableSlotsKernel;

  void Compute(tf::OpKernelContext* ctx) override {
    DynamicTableRef table;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, "Export", kNothingChanged, &table));
    DynamicTableContents c;
    {
      tsl::tf_shared_lock lock(*table->mu());
      if (TieredDynamicTable* tiered = table->tiered(); tiered != nullptr) {
        absl::StatusOr<DynamicTableContents> exported = tiered->Export();  // the rows read from the row file
        OP_REQUIRES_OK(ctx, exported.status());
        c = *std::move(exported);
      } else {
        c = table->reader().Export();
      }
    }
    const int64_t n = static_cast<int64_t>(c.keys.size());
    const int64_t p = static_cast<int64_t>(c.pending_keys.size());
    const int s = static_cast<int>(c.slots.size());
    OP_REQUIRES_OK(ctx, Output(ctx, 0, tf::TensorShape({n}), c.keys));
    OP_REQUIRES_OK(ctx, Output(ctx, 1, tf::TensorShape({n, c.dim}), c.weights));
    for (int k = 0; k < s; ++k) {
      OP_REQUIRES_OK(ctx, Output(ctx, 2 + k, tf::TensorShape({n, c.slot_widths[k]}), c.slots[k]));
    }
    OP_REQUIRES_OK(ctx, Output(ctx, 2 + s, tf::TensorShape({n}), c.counts));
    OP_REQUIRES_OK(ctx, Output(ctx, 3 + s, tf::TensorShape({n}), c.last_steps));
    OP_REQUIRES_OK(ctx, Output(ctx, 4 + s, tf::TensorShape({p}), c.pending_keys));
    OP_REQUIRES_OK(ctx, Output(ctx, 5 + s, tf::TensorShape({p}), c.pending_counts));
    OP_REQUIRES_OK(ctx, Output(ctx, 6 + s, tf::TensorShape({p}), c.pending_last_steps));
  }
};

template <typename T>
std::vector<T> ToVector(const tf::Tensor& t) {
  const auto flat = t.flat<T>();
  return std::vector<T>(flat.data(), flat.data() + flat.size());
}

class DynamicTableImportOp : public DynamicTableSlotsKernel {
 public:
  using DynamicTableSlotsKernel::DynamicTableSlotsKernel;

  void Compute(tf::OpKernelContext* ctx) override {
    DynamicTableRef table;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, "Import", kNothingChanged, &table));
    DynamicTableContents c;
    OP_REQUIRES_OK(ctx, ReadContents(ctx, *table, num_slots(), &c));
    tsl::mutex_lock lock(*table->mu());
    TieredDynamicTable* tiered = table->tiered();
    OP_REQUIRES_OK(ctx, tiered != nullptr ? tiered->Import(c) : table->table()->Import(c));
    table->ResetStepStats();
  }

 private:
  // The ranks and the shapes that relate the tensors to each other; the table checks dim, slot count, sizes,
  // unique keys, counts and steps.
  static absl::Status ReadContents(tf::OpKernelContext* ctx, const DynamicTableResource& table, int num_slots,
                                   DynamicTableContents* c) {
    const int num_inputs = 7 + num_slots;
    for (int i = 0; i < num_inputs; ++i) {
      const bool is_slot = i >= 2 && i < 2 + num_slots;
      const int rank = i == 1 || is_slot ? 2 : 1;
      const tf::Tensor& t = ctx->input(1 + i);
      if (t.dims() != rank) {
        static const char* const kRest[] = {"counts", "last_steps", "pending_keys", "pending_counts",
                                            "pending_last_steps"};
        const std::string what = i == 0    ? "keys"
                                 : i == 1  ? "weights"
                                 : is_slot ? absl::StrCat("slots[", i - 2, "]")
                                           : kRest[i - 2 - num_slots];
        return absl::InvalidArgumentError(absl::StrCat("dynamic table '", table.name(), "': Import: ", what,
                                                       " must have rank ", rank, ", got shape ",
                                                       t.shape().DebugString()));
      }
    }
    const tf::Tensor& keys = ctx->input(1);
    const tf::Tensor& weights = ctx->input(2);
    const int64_t n = keys.dim_size(0);
    for (int k = -1; k < num_slots; ++k) {
      const tf::Tensor& t = k < 0 ? weights : ctx->input(3 + k);
      if (t.dim_size(0) != n) {
        return absl::InvalidArgumentError(
            absl::StrCat("dynamic table '", table.name(), "': Import: keys ", keys.shape().DebugString(), " and ",
                         k < 0 ? std::string("weights") : absl::StrCat("slots[", k, "]"), " ", t.shape().DebugString(),
                         " do not agree (expected [n], [n, dim], and [n, width] per slot)"));
      }
    }
    c->dim = weights.dim_size(1);
    c->keys = ToVector<int64_t>(keys);
    c->weights = ToVector<float>(weights);
    for (int k = 0; k < num_slots; ++k) {
      c->slot_widths.push_back(ctx->input(3 + k).dim_size(1));
      c->slots.push_back(ToVector<float>(ctx->input(3 + k)));
    }
    const int rest = 3 + num_slots;
    c->counts = ToVector<int64_t>(ctx->input(rest));
    c->last_steps = ToVector<int64_t>(ctx->input(rest + 1));
    c->pending_keys = ToVector<int64_t>(ctx->input(rest + 2));
    c->pending_counts = ToVector<int64_t>(ctx->input(rest + 3));
    c->pending_last_steps = ToVector<int64_t>(ctx->input(rest + 4));
    return absl::OkStatus();
  }
};

class DynamicTableEvictOp : public DynamicTableOp {
 public:
  explicit DynamicTableEvictOp(tf::OpKernelConstruction* ctx) : DynamicTableOp(ctx) {
    std::string policy;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("policy", &policy));
    absl::StatusOr<EvictionPolicy> parsed = ParsePolicy(policy);
    OP_REQUIRES_OK(ctx, parsed.status());
    policy_.policy = *parsed;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_rows", &policy_.target_rows));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("ttl_steps", &policy_.ttl_steps));
    float min_norm = 0.0f, decay = 1.0f;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("min_norm", &min_norm));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("decay", &decay));
    policy_.min_norm = min_norm;
    policy_.decay = decay;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("min_count", &policy_.min_count));
  }

  void ComputeOn(tf::OpKernelContext* ctx, DynamicTableResource* table) override {
    int64_t step = 0;
    OP_REQUIRES_OK(ctx, Named(ReadStep(ctx->input(1), &step), absl::StrCat("dynamic table '", table->name(), "'")));
    tf::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({}), &out));
    tsl::mutex_lock lock(*table->mu());
    absl::StatusOr<int64_t> evicted = table->table()->Evict(policy_, step);
    OP_REQUIRES_OK(ctx, evicted.status());
    table->RecordEvictions(step, *evicted);
    out->scalar<int64_t>()() = *evicted;
  }

 private:
  EvictionOptions policy_;
};

class DynamicTableEvictKeysOp : public tf::OpKernel {
 public:
  explicit DynamicTableEvictKeysOp(tf::OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(tf::OpKernelContext* ctx) override {
    TableAndKeys k;
    OP_REQUIRES_OK(ctx, LookupTableAndKeys(ctx, &k));
    tf::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({}), &out));
    tsl::mutex_lock lock(*k.table->mu());
    out->scalar<int64_t>()() = k.table->table()->EvictKeys(k.keys, k.n);
  }
};

// A tiered table's row-cache counters, in TieredCacheStats order (as TfEmbed>TieredTableStats).
class DynamicTableTieredStatsOp : public DynamicTableOp {
 public:
  using DynamicTableOp::DynamicTableOp;

  void ComputeOn(tf::OpKernelContext* ctx, DynamicTableResource* table) override {
    const TieredDynamicTable* tiered = table->tiered();
    OP_REQUIRES(ctx, tiered != nullptr,
                absl::InvalidArgumentError(absl::StrCat("dynamic table '", table->name(),
                                                        "' is kept in memory (storage=None): it has no row cache")));
    const std::array<int64_t, TieredCacheStats::kNumFields> stats = table->tiered()->cache().stats().AsArray();
    tf::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({TieredCacheStats::kNumFields}), &out));
    std::copy(stats.begin(), stats.end(), out->flat<int64_t>().data());
  }
};

#define REGISTER(name, kernel) REGISTER_KERNEL_BUILDER(Name("TfEmbed>" name).Device(tf::DEVICE_CPU), kernel)
REGISTER("DynamicTableHandle", DynamicTableHandleOp);
REGISTER("DynamicTableFind", DynamicTableFindOp);
REGISTER("DynamicTableLookup", DynamicTableLookupOp);
REGISTER("DynamicTableStats", DynamicTableStatsOp);
REGISTER("DynamicTableExport", DynamicTableExportOp);
REGISTER("DynamicTableImport", DynamicTableImportOp);
REGISTER("DynamicTableEvict", DynamicTableEvictOp);
REGISTER("DynamicTableEvictKeys", DynamicTableEvictKeysOp);
REGISTER("DynamicTableTieredStats", DynamicTableTieredStatsOp);
#undef REGISTER

}  // namespace
}  // namespace tf_embed_ops
