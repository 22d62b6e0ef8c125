// The row loops' two compiled copies (cc/lib/vector_isa.h) compute bitwise the same values: every optimizer
// (with every option that changes its loop) through the whole row pipeline, the forward combine with and
// without quantization, gradient accumulation, and the sparse accumulator's row adds, each run once as the
// baseline (SSE2) code and once through the AVX2 copy on the same random inputs.  Skipped where the library is
// built without the AVX2 copy (-mavx2 builds, other architectures) or the CPU lacks AVX2.
#include "cc/lib/vector_isa.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cc/lib/embedding_forward.h"
#include "cc/lib/gradient_accumulation.h"
#include "cc/lib/row_update.h"
#include "cc/lib/sparse_accumulator_rows.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace {

// Runs `fn` as the baseline code and as the AVX2 copy.
void BothIsas(const std::function<void(bool avx2)>& fn) {
#ifdef TF_EMBED_OPS_AVX2_CLONES
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "the CPU has no AVX2";
  fn(false);
  fn(true);
#else
  (void)fn;
  GTEST_SKIP() << "built without the run-time AVX2 copy";
#endif
}

// Runs `body` compiled for the ISA chosen: inlined into the AVX2 clone, or called as baseline code.
template <typename Body>
void OnIsa(bool avx2, const Body& body) {
#ifdef TF_EMBED_OPS_AVX2_CLONES
  if (avx2) {
    internal::RunAvx2(body);
    return;
  }
#endif
  (void)avx2;
  body();
}

void ExpectBitwiseEqual(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what;
}

std::vector<float> RandomFloats(std::mt19937* rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(*rng);
  return v;
}

constexpr int64_t kRows = 16;
constexpr int64_t kDim = 37;  // two AVX2 vectors of 8 floats, an SSE vector and a tail

// Every optimizer, with the options that select different loops.
std::vector<std::pair<std::string, OptimizerParams>> AllOptimizerVariants() {
  std::vector<std::pair<std::string, OptimizerParams>> v;
  v.push_back({"sgd", Sgd{}});
  v.push_back({"adagrad", Adagrad{}});
  for (bool nesterov : {false, true}) {
    for (float beta2 : {1.0f, 0.9f}) {
      for (float exponent : {2.0f, 3.0f}) {
        AdagradMomentum o;
        o.momentum = 0.7f;
        o.use_nesterov = nesterov;
        o.beta2 = beta2;
        o.exponent = exponent;
        o.epsilon = 1e-3f;
        v.push_back({"adagrad_momentum", o});
      }
    }
  }
  for (bool inside : {true, false}) {
    Adam o;
    o.use_sum_inside_sqrt = inside;
    v.push_back({"adam", o});
  }
  for (bool multiply : {false, true}) {
    for (float power : {-0.5f, -0.7f}) {
      Ftrl o;
      o.l1 = 0.01f;
      o.l2 = 0.1f;
      o.beta = 0.2f;
      o.lr_power = power;
      o.multiply_linear_by_lr = multiply;
      v.push_back({"ftrl", o});
    }
  }
  for (bool nesterov : {false, true}) {
    Momentum o;
    o.momentum = 0.9f;
    o.use_nesterov = nesterov;
    v.push_back({"momentum", o});
  }
  RmsProp rms;
  rms.rho = 0.9f;
  rms.momentum = 0.5f;
  rms.epsilon = 1e-3f;
  v.push_back({"rms_prop", rms});
  CenteredRmsProp centered;
  centered.rho = 0.9f;
  centered.momentum = 0.5f;
  centered.epsilon = 1.0f;
  v.push_back({"centered_rms_prop", centered});
  Adadelta adadelta;
  adadelta.rho = 0.95f;
  adadelta.epsilon = 1e-3f;
  v.push_back({"adadelta", adadelta});
  for (float l1 : {0.0f, 0.05f}) {
    ProximalAdagrad o;
    o.l1 = l1;
    o.l2 = 0.1f;
    v.push_back({"proximal_adagrad", o});
  }
  Lion lion;
  lion.beta1 = 0.9f;
  lion.beta2 = 0.99f;
  v.push_back({"lion", lion});
  for (bool first : {false, true}) {
    BoundedAdagrad o;
    o.update_accumulator_first = first;
    o.max_var_update = 0.01f;
    o.max_accumulator = 0.5f;
    v.push_back({"bounded_adagrad", o});
  }
  OnlineYogi online;
  online.l1 = 0.01f;
  online.l2 = 0.1f;
  online.beta2 = 0.9f;
  v.push_back({"online_yogi", online});
  for (float l1 : {0.0f, 0.05f}) {
    ProximalYogi o;
    o.l1 = l1;
    o.l2 = 0.1f;
    o.beta1 = 0.9f;
    o.beta2 = 0.99f;
    o.epsilon = 1e-3f;
    v.push_back({"proximal_yogi", o});
  }
  FrequencyEstimator frequency;
  frequency.tau = 0.1f;
  frequency.max_delta = 100.0f;
  frequency.outlier_threshold = 2.0f;
  v.push_back({"frequency_estimator", frequency});
  v.push_back({"assign", Assign{}});
  return v;
}

TEST(VectorIsaTest, EveryOptimizerRowPipelineIsBitwiseEqual) {
  for (const auto& [name, optimizer] : AllOptimizerVariants()) {
    TableOptimization o;
    o.optimizer = optimizer;
    o.gradient_clipping = {-0.8f, 0.9f};
    o.weight_decay_factor = 0.01f;
    o.multiply_weight_decay_factor_by_learning_rate = true;
    o.weight_clipping = {-1.5f, 1.25f};
    const size_t num_slots = OptimizerSlots(optimizer).size();
    std::vector<std::vector<float>> results[2];
    BothIsas([&](bool avx2) {
      std::mt19937 rng(11);
      std::vector<float> w = RandomFloats(&rng, kRows * kDim, -2.0f, 2.0f);
      std::vector<std::vector<float>> slots;
      for (size_t k = 0; k < num_slots; ++k) slots.push_back(RandomFloats(&rng, kRows * kDim, 0.01f, 1.0f));
      const std::vector<float> g = RandomFloats(&rng, kRows * kDim, -1.0f, 1.0f);
      std::visit(
          [&](const auto& opt) {
            OnIsa(avx2, [&] {
              for (int step = 0; step < 3; ++step) {
                for (int64_t r = 0; r < kRows; ++r) {
                  std::vector<float> scratch(g.begin() + r * kDim, g.begin() + (r + 1) * kDim);
                  float* slot_rows[4] = {};
                  for (size_t k = 0; k < num_slots; ++k) slot_rows[k] = slots[k].data() + r * kDim;
                  UpdateRowPipeline(opt, o, 0.05f, scratch.data(), w.data() + r * kDim, slot_rows, kDim);
                }
              }
            });
          },
          o.optimizer);
      results[avx2] = slots;
      results[avx2].push_back(w);
    });
    if (results[0].empty()) return;  // skipped
    for (size_t k = 0; k < results[0].size(); ++k) {
      ExpectBitwiseEqual(results[0][k], results[1][k], name + (k == num_slots ? " weights" : " slot"));
    }
  }
}

TEST(VectorIsaTest, ForwardCombineIsBitwiseEqual) {
  std::mt19937 rng(5);
  const std::vector<float> table = RandomFloats(&rng, 50 * kDim, -3.0f, 3.0f);
  // Ragged samples of 0-4 ids with weights, sqrtn.
  std::vector<int64_t> splits = {0}, ids;
  std::vector<float> weights;
  for (int s = 0; s < 40; ++s) {
    for (int k = 0; k < s % 5; ++k) {
      ids.push_back(static_cast<int64_t>(rng() % 50));
      weights.push_back(0.5f + static_cast<float>(k));
    }
    splits.push_back(static_cast<int64_t>(ids.size()));
  }
  FeatureBatch b;
  b.splits_or_indices = splits.data();
  b.splits_or_indices_rank = 1;
  b.splits_or_indices_rows = static_cast<int64_t>(splits.size());
  b.ids = ids.data();
  b.num_ids = static_cast<int64_t>(ids.size());
  b.weights = weights.data();
  b.num_weights = b.num_ids;
  b.sample_shape = {40};
  FeatureLayout layout;
  ASSERT_TRUE(BuildFeatureLayout(b, Combiner::kSqrtn, "f", &layout).ok());
  SimulatedQuantization q;
  q.enabled = true;
  q.lower = -2.0f;
  q.upper = 2.5f;
  q.num_buckets = 17;
  const Quantizer quantizer(q);
  for (const Quantizer* quant : {static_cast<const Quantizer*>(nullptr), &quantizer}) {
    std::vector<float> out[2];
    BothIsas([&](bool avx2) {
      out[avx2].assign(40 * kDim, 0.0f);
      OnIsa(avx2, [&] {
        internal::CombineSampleRange(layout, ids.data(), table.data(), kDim, quant, 0, 40, out[avx2].data());
      });
    });
    if (out[0].empty()) return;
    ExpectBitwiseEqual(out[0], out[1], quant ? "quantized" : "plain");
  }
}

TEST(VectorIsaTest, GradientAccumulationIsBitwiseEqual) {
  std::mt19937 rng(9);
  std::vector<int64_t> ids(300);
  for (int64_t& id : ids) id = static_cast<int64_t>(rng() % 40);
  FeatureLayout layout;
  layout.num_samples = 300;
  layout.one_id_per_sample = true;
  layout.scale = RandomFloats(&rng, 300, -1.0f, 1.0f);
  const std::vector<float> gradient = RandomFloats(&rng, 300 * kDim, -1.0f, 1.0f);
  const std::vector<GradientSource> sources = {GradientSource{ids.data(), 300, &layout, gradient.data()}};
  RowGradientPlan plan;
  plan.Build(&sources);
  std::vector<float> sums[2];
  BothIsas([&](bool avx2) {
    sums[avx2].assign(plan.num_rows() * kDim, 0.0f);
    OnIsa(avx2, [&] {
      for (int64_t u = 0; u < plan.num_rows(); ++u) plan.Accumulate(u, kDim, sums[avx2].data() + u * kDim);
    });
  });
  if (sums[0].empty()) return;
  ExpectBitwiseEqual(sums[0], sums[1], "accumulated rows");
}

TEST(VectorIsaTest, SparseAccumulatorRowAddsAreBitwiseEqual) {
  std::mt19937 rng(13);
  const std::vector<float> src = RandomFloats(&rng, 8 * kDim, -1e3f, 1e3f);
  const std::vector<float> init = RandomFloats(&rng, 8 * kDim, -1.0f, 1.0f);
  std::vector<float> dst[2];
  BothIsas([&](bool avx2) {
    dst[avx2] = init;
    std::vector<float*> d;
    std::vector<const float*> s;
    for (int k = 0; k < 8; ++k) {
      d.push_back(dst[avx2].data() + k * kDim);
      s.push_back(src.data() + ((k * 3) % 8) * kDim);
    }
    // The generic template is the plain loop; inlined into the AVX2 clone it is the vectorised copy.
    OnIsa(avx2, [&] { AddRows<float>(d.data(), s.data(), 8, kDim); });
  });
  if (dst[0].empty()) return;
  ExpectBitwiseEqual(dst[0], dst[1], "row adds");
  // And the exported float kernel (whatever ISA it picked) agrees with both.
  std::vector<float> exported = init;
  std::vector<float*> d;
  std::vector<const float*> s;
  for (int k = 0; k < 8; ++k) {
    d.push_back(exported.data() + k * kDim);
    s.push_back(src.data() + ((k * 3) % 8) * kDim);
  }
  AddRows(d.data(), s.data(), 8, kDim);
  ExpectBitwiseEqual(dst[0], exported, "exported row adds");
}

// TF_EMBED_OPS_ISA=baseline forces the baseline copy.  RowLoopIsa() reads the variable once per process, so
// this runs in a fresh process (a death test re-executing this binary).
TEST(VectorIsaTest, EnvironmentVariableForcesTheBaseline) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("TF_EMBED_OPS_ISA", "baseline", 1);
        std::exit(RowLoopIsa() == VectorIsa::kBaseline ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
#ifdef TF_EMBED_OPS_AVX2_CLONES
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) {
    EXPECT_EXIT(
        {
          unsetenv("TF_EMBED_OPS_ISA");
          std::exit(RowLoopIsa() == VectorIsa::kAvx2 ? 0 : 1);
        },
        ::testing::ExitedWithCode(0), "");
  }
#endif
}

}  // namespace
}  // namespace tf_embed_ops
