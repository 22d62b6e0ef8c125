// Kernel of TfEmbed>EmbeddingActivations: validate every feature against the config and the table variables,
// then gather and combine each feature's samples (cc/lib/embedding_forward.h) in parallel over samples.
// Tables may be float32, bfloat16 or float16 variables (docs/low_precision.md); activations are always float32.
#define EIGEN_USE_THREADS

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/kernels/embedding_kernel_util.h"
#include "cc/lib/embedding_forward.h"
#include "cc/lib/huge_pages.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/kernels/training_op_helpers.h"

namespace tf_embed_ops {
namespace {

using CPUDevice = Eigen::ThreadPoolDevice;

class EmbeddingActivationsOp : public tensorflow::OpKernel {
 public:
  explicit EmbeddingActivationsOp(tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Init(ctx));
  }

  void Compute(tensorflow::OpKernelContext* ctx) override {
    const int n = attrs_.num_features;
    const EmbeddingConfig& config = attrs_.config;
    // Inputs: splits[N], ids[N], weights[N], sample_shapes[N], tables[T].
    const int first_table = 4 * n;

    // 1. Validate every feature completely (structure, then ids) before anything is sized by its inputs.
    std::vector<FeatureBatch> batches(n);
    std::vector<int64_t> num_samples(n);
    std::vector<tensorflow::TensorShape> output_shapes(n);
    for (int f = 0; f < n; ++f) {
      const std::string label = attrs_.FeatureLabel(f);
      const TableSpec& table = config.tables[config.features[f].table_id];
      OP_REQUIRES_OK(ctx, ReadFeatureBatch(ctx, 0, n, f, label, &batches[f]));
      OP_REQUIRES_OK(ctx, ValidateFeatureBatch(batches[f], label, &num_samples[f]));
      OP_REQUIRES_OK(ctx, ValidateIds(batches[f].ids, batches[f].num_ids, table.vocabulary_size, label, table.name));
      OP_REQUIRES_OK(ctx, ActivationShape(batches[f], table, label, &output_shapes[f]));
    }

    std::vector<int> table_inputs;
    std::vector<StorageType> storage(attrs_.num_tables);
    for (int t = 0; t < attrs_.num_tables; ++t) {
      tensorflow::Var* var = nullptr;
      OP_REQUIRES_OK(ctx, CheckVariableDtype(ctx, first_table + t, absl::StrCat("table '", config.tables[t].name, "'"),
                                             &var, &storage[t]));
      EnsureSparseAccess(ctx, var, storage[t]);
      var->Unref();
      table_inputs.push_back(first_table + t);
    }
    // Shared locks in address order (the exclusive ones of SendTPUEmbeddingGradients use the same order).
    auto locks = tensorflow::MaybeLockVariableInputMutexesInOrder<CPUDevice, float>(ctx, /*do_lock=*/false,
                                                                                    /*sparse=*/true, table_inputs);
    OP_REQUIRES_OK(ctx, ctx->status());
    std::vector<tensorflow::Tensor> tables(attrs_.num_tables);
    for (int t = 0; t < attrs_.num_tables; ++t) {
      const std::string what = absl::StrCat("table '", config.tables[t].name, "'");
      OP_REQUIRES_OK(ctx, Named(tensorflow::GetInputTensorFromVariable<CPUDevice, float>(ctx, first_table + t, true,
                                                                                         true, &tables[t]),
                                what));
      OP_REQUIRES_OK(ctx, CheckTableShape(tables[t], config.tables[t], what));
      AdviseHugePages(tables[t].tensor_data().data(), tables[t].TotalBytes());  // random rows: cc/lib/huge_pages.h
    }

    // 2. Allocate (the sizes are validated now), lay out each feature and combine its samples.
    WorkspacePool::Scoped workspace = workspaces_.Acquire();
    std::vector<FeatureLayout>& layouts = workspace->layouts;
    layouts.resize(n);
    std::vector<tensorflow::Tensor*> outputs(n);
    for (int f = 0; f < n; ++f) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(f, output_shapes[f], &outputs[f]));
      BuildValidatedFeatureLayout(batches[f], num_samples[f], attrs_.combiners[f], &layouts[f]);
    }
    const ShardFn shard = IntraOpShardFn(ctx);
    for (int f = 0; f < n; ++f) {
      const int t = config.features[f].table_id;
      const TableSpec& table = config.tables[t];
      tensorflow::Tensor* out = outputs[f];
      const SimulatedQuantization& q = table.optimization.simulated_quantization;
      std::unique_ptr<Quantizer> quantizer = q.enabled ? std::make_unique<Quantizer>(q) : nullptr;
      float* dst = out->flat<float>().data();
      const FeatureLayout& layout = layouts[f];
      const int64_t* ids = batches[f].ids;
      const int64_t dim = table.dimension;
      const int64_t ids_per_sample = layout.num_samples ? batches[f].num_ids / layout.num_samples + 1 : 1;
      if (storage[t] == StorageType::kFloat32) {
        const float* weights = tables[t].flat<float>().data();
        shard(layout.num_samples, ids_per_sample * dim * 3, [&](int64_t begin, int64_t end) {
          CombineSamples(layout, ids, weights, dim, quantizer.get(), begin, end, dst);
        });
      } else {
        // 16-bit rows, widened to fp32 as they are read (Eigen::bfloat16 / Eigen::half are their bits).
        const uint16_t* bits = reinterpret_cast<const uint16_t*>(tables[t].tensor_data().data());
        shard(layout.num_samples, ids_per_sample * dim * 3, [&](int64_t begin, int64_t end) {
          CombineSamples(layout, ids, storage[t], bits, dim, quantizer.get(), begin, end, dst);
        });
      }
    }
  }

 private:
  FusedEmbeddingAttrs attrs_;
  WorkspacePool workspaces_;
};

REGISTER_KERNEL_BUILDER(Name("TfEmbed>EmbeddingActivations").Device(tensorflow::DEVICE_CPU), EmbeddingActivationsOp);

}  // namespace
}  // namespace tf_embed_ops
