// The row loops' compiled copies (cc/lib/vector_isa.h) compute bitwise the same values: every optimizer
// (with every option that changes its loop) through the whole row pipeline, the forward combine with and
// without quantization, gradient accumulation, and the sparse accumulator's row adds, each run as the baseline
// (SSE2) code, through the library's AVX2 copy, and as the same loops compiled for AVX2 with FMA and for
// AVX-512 (what a TF_EMBED_OPS_CXXFLAGS=-march=native build runs: with the project's -ffp-contract=off no
// multiply-add is fused, so they must give the same bits) on the same random inputs; the 16-bit row store in
// every copy equals its per-element definition, and the 16-bit table update equals the whole-row widen / update /
// round path written out in the test.  Skipped where the library is built without the AVX2 copy (-mavx2 builds,
// other architectures) or the CPU lacks AVX2; the FMA and AVX-512 copies run where the CPU has them.
#include "cc/lib/vector_isa.h"

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cc/lib/embedding_forward.h"
#include "cc/lib/gradient_accumulation.h"
#include "cc/lib/row_update.h"
#include "cc/lib/sparse_accumulator_rows.h"
#include "cc/lib/stochastic_rounding.h"
#include "cc/lib/storage_types.h"
#include "cc/lib/table_update.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace {

// The copies compared: the baseline and the library's AVX2 copy (vector_isa.h), and the loops compiled here for
// AVX2 with FMA and for AVX-512 (F, VL, BW, DQ), as a -march=native build would compile them.
enum class Copy { kBaseline, kAvx2, kAvx2Fma, kAvx512 };
constexpr int kNumCopies = 4;  // Copy's values, as array indices

const char* CopyName(Copy c) {
  switch (c) {
    case Copy::kAvx2:
      return "AVX2";
    case Copy::kAvx2Fma:
      return "AVX2+FMA";
    case Copy::kAvx512:
      return "AVX-512";
    case Copy::kBaseline:
      break;
  }
  return "baseline";
}

#ifdef TF_EMBED_OPS_AVX2_CLONES
template <typename Fn>
__attribute__((target("avx2,fma"), flatten)) void RunAvx2Fma(const Fn& fn) {
  fn();
}
template <typename Fn>
__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq"), flatten)) void RunAvx512(const Fn& fn) {
  fn();
}
#endif

// The copies this build has and this CPU runs, the baseline first.
std::vector<Copy> TestedCopies() {
  std::vector<Copy> copies = {Copy::kBaseline};
#ifdef TF_EMBED_OPS_AVX2_CLONES
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2")) return copies;
  copies.push_back(Copy::kAvx2);
  if (__builtin_cpu_supports("fma")) copies.push_back(Copy::kAvx2Fma);
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq")) {
    copies.push_back(Copy::kAvx512);
  }
#endif
  return copies;
}

// Runs `fn` once per tested copy, the baseline first; skips the test when there is no copy besides the baseline.
void EachCopy(const std::function<void(Copy c)>& fn) {
  const std::vector<Copy> copies = TestedCopies();
  if (copies.size() < 2) GTEST_SKIP() << "built without the run-time AVX2 copy, or the CPU has no AVX2";
  for (Copy c : copies) fn(c);
}

// Runs `body` compiled for the copy chosen: inlined into that copy, or called as baseline code.
template <typename Body>
void OnCopy(Copy c, const Body& body) {
#ifdef TF_EMBED_OPS_AVX2_CLONES
  switch (c) {
    case Copy::kAvx2:
      internal::RunAvx2(body);
      return;
    case Copy::kAvx2Fma:
      RunAvx2Fma(body);
      return;
    case Copy::kAvx512:
      RunAvx512(body);
      return;
    case Copy::kBaseline:
      break;
  }
#endif
  (void)c;
  body();
}

int Index(Copy c) { return static_cast<int>(c); }

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
  // Row-wise Adagrad's three weight-decay modes (none, L2, decoupled): its row sum of squares is a vector of
  // eight lanes, the rows here (kDim = 37) end in a tail of five.
  for (int mode = 0; mode < 3; ++mode) {
    RowWiseAdagrad o;
    o.weight_decay = mode == 0 ? 0.0f : 0.1f;
    o.decoupled_weight_decay = mode == 2;
    v.push_back({"rowwise_adagrad", o});
  }
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
    std::vector<std::vector<float>> results[kNumCopies];
    EachCopy([&](Copy isa) {
      std::mt19937 rng(11);
      std::vector<float> w = RandomFloats(&rng, kRows * kDim, -2.0f, 2.0f);
      std::vector<std::vector<float>> slots;
      for (size_t k = 0; k < num_slots; ++k) slots.push_back(RandomFloats(&rng, kRows * kDim, 0.01f, 1.0f));
      const std::vector<float> g = RandomFloats(&rng, kRows * kDim, -1.0f, 1.0f);
      std::visit(
          [&](const auto& opt) {
            OnCopy(isa, [&] {
              for (int step = 0; step < 3; ++step) {
                for (int64_t r = 0; r < kRows; ++r) {
                  std::vector<float> clipped(kDim);
                  float* slot_rows[4] = {};
                  for (size_t k = 0; k < num_slots; ++k) slot_rows[k] = slots[k].data() + r * kDim;
                  UpdateRowPipeline(opt, o, 0.05f, g.data() + r * kDim, clipped.data(), w.data() + r * kDim, slot_rows,
                                    kDim);
                }
              }
            });
          },
          o.optimizer);
      results[Index(isa)] = slots;
      results[Index(isa)].push_back(w);
    });
    if (results[0].empty()) return;  // skipped
    for (int i = 1; i < kNumCopies; ++i) {
      if (results[i].empty()) continue;
      for (size_t k = 0; k < results[0].size(); ++k) {
        ExpectBitwiseEqual(results[0][k], results[i][k],
                           name + (k == num_slots ? " weights" : " slot") + " " + CopyName(Copy(i)));
      }
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
    std::vector<float> out[kNumCopies];
    EachCopy([&](Copy isa) {
      out[Index(isa)].assign(40 * kDim, 0.0f);
      OnCopy(isa, [&] {
        internal::CombineSampleRange(layout, ids.data(), table.data(), kDim, quant, 0, 40, out[Index(isa)].data());
      });
    });
    if (out[0].empty()) return;
    for (int i = 1; i < kNumCopies; ++i) {
      if (!out[i].empty())
        ExpectBitwiseEqual(out[0], out[i], std::string(quant ? "quantized " : "plain ") + CopyName(Copy(i)));
    }
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
  std::vector<float> sums[kNumCopies];
  EachCopy([&](Copy isa) {
    sums[Index(isa)].assign(plan.num_rows() * kDim, 0.0f);
    OnCopy(isa, [&] {
      for (int64_t u = 0; u < plan.num_rows(); ++u) plan.Accumulate(u, kDim, sums[Index(isa)].data() + u * kDim);
    });
  });
  if (sums[0].empty()) return;
  for (int i = 1; i < kNumCopies; ++i) {
    if (!sums[i].empty()) ExpectBitwiseEqual(sums[0], sums[i], std::string("accumulated rows ") + CopyName(Copy(i)));
  }
}

TEST(VectorIsaTest, SparseAccumulatorRowAddsAreBitwiseEqual) {
  std::mt19937 rng(13);
  const std::vector<float> src = RandomFloats(&rng, 8 * kDim, -1e3f, 1e3f);
  const std::vector<float> init = RandomFloats(&rng, 8 * kDim, -1.0f, 1.0f);
  std::vector<float> dst[kNumCopies];
  EachCopy([&](Copy isa) {
    dst[Index(isa)] = init;
    std::vector<float*> d;
    std::vector<const float*> s;
    for (int k = 0; k < 8; ++k) {
      d.push_back(dst[Index(isa)].data() + k * kDim);
      s.push_back(src.data() + ((k * 3) % 8) * kDim);
    }
    // The generic template is the plain loop; inlined into a vector copy it is that copy's vectorised loop.
    OnCopy(isa, [&] { AddRows<float>(d.data(), s.data(), 8, kDim); });
  });
  if (dst[0].empty()) return;
  for (int i = 1; i < kNumCopies; ++i) {
    if (!dst[i].empty()) ExpectBitwiseEqual(dst[0], dst[i], std::string("row adds ") + CopyName(Copy(i)));
  }
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

// --- 16-bit rows (table_update.h's 16-bit path, stochastic_rounding.h's row store) ---------------------------

// One buffer of a small table: its storage type, row width and raw bytes.
struct TestBuffer {
  StorageType type;
  int64_t width;
  std::vector<uint8_t> bytes;
  void* Row(int64_t r) { return bytes.data() + r * width * StorageBytes(type); }
};

std::vector<TestBuffer> RandomStoredTable(std::mt19937* rng, const OptimizerParams& optimizer, StorageType table,
                                          StorageType slots, int64_t vocab, int64_t dim) {
  std::vector<TestBuffer> buffers;
  std::vector<SlotInfo> infos = OptimizerSlots(optimizer);
  for (size_t b = 0; b <= infos.size(); ++b) {
    TestBuffer t{b == 0 ? table : slots, b == 0 ? dim : SlotWidth(infos[b - 1], dim), {}};
    const std::vector<float> v =
        b == 0 ? RandomFloats(rng, vocab * t.width, -2.0f, 2.0f) : RandomFloats(rng, vocab * t.width, 0.01f, 1.0f);
    t.bytes.resize(v.size() * StorageBytes(t.type));
    for (size_t i = 0; i < v.size(); ++i) {
      if (t.type == StorageType::kFloat32) {
        std::memcpy(t.bytes.data() + 4 * i, &v[i], 4);
      } else {
        const uint16_t h =
            t.type == StorageType::kBfloat16 ? FloatToBfloat16Nearest(v[i]) : FloatToFloat16Nearest(v[i]);
        std::memcpy(t.bytes.data() + 2 * i, &h, 2);
      }
    }
    buffers.push_back(std::move(t));
  }
  return buffers;
}

// The whole-row 16-bit path, written out: widen every buffer's row, run the pipeline over the row, round each
// 16-bit row back with RoundingRowKey(spec, buffer, row) and column d's bits.  Rows in the plan's order; a
// non-lazy optimizer also walks the untouched rows with a zero gradient.
void ReferenceStoredUpdate(const TableOptimization& o, float lr, const RowGradientPlan& plan, int64_t vocab,
                           int64_t dim, const RoundingSpec& spec, std::vector<TestBuffer>* buffers) {
  std::vector<int64_t> rows;
  std::vector<int64_t> unique_of(vocab, -1);
  for (int64_t u = 0; u < plan.num_rows(); ++u) unique_of[plan.row(u)] = u;
  if (OptimizerUpdatesAllRows(o.optimizer)) {
    for (int64_t r = 0; r < vocab; ++r) rows.push_back(r);
  } else {
    for (int64_t u = 0; u < plan.num_rows(); ++u) rows.push_back(plan.row(u));
  }
  for (int64_t row : rows) {
    std::vector<float> g(dim, 0.0f);
    if (unique_of[row] >= 0) plan.Accumulate(unique_of[row], dim, g.data());
    std::vector<std::vector<float>> values;
    for (TestBuffer& t : *buffers) {
      std::vector<float> v(t.width);
      if (t.type == StorageType::kFloat32) {
        std::memcpy(v.data(), t.Row(row), 4 * t.width);
      } else {
        LoadStoredRow(t.type, static_cast<const uint16_t*>(t.Row(row)), v.data(), t.width);
      }
      values.push_back(std::move(v));
    }
    std::vector<float*> slot_rows;
    for (size_t b = 1; b < values.size(); ++b) slot_rows.push_back(values[b].data());
    slot_rows.push_back(nullptr);
    std::visit(
        [&](const auto& opt) {
          std::vector<float> clipped(dim);
          UpdateRowPipeline(opt, o, lr, g.data(), clipped.data(), values[0].data(), slot_rows.data(), dim);
        },
        o.optimizer);
    for (size_t b = 0; b < buffers->size(); ++b) {
      TestBuffer& t = (*buffers)[b];
      if (t.type == StorageType::kFloat32) {
        std::memcpy(t.Row(row), values[b].data(), 4 * t.width);
      } else {
        const uint64_t key =
            spec.mode == Rounding::kStochastic ? RoundingRowKey(spec, static_cast<int64_t>(b), row) : 0;
        StoreStoredRow(t.type, spec.mode, key, values[b].data(), static_cast<uint16_t*>(t.Row(row)), t.width);
      }
    }
  }
}

// StoreStoredRow's loops (32-bit column counters) in both copies: each element is its conversion with column d's
// bits, for widths that end in a partial vector.
TEST(VectorIsaTest, SixteenBitRowStoreIsItsPerElementDefinition) {
  std::mt19937 rng(23);
  for (int64_t dim : {1, 7, 8, 15, 37, 64, 100}) {
    const std::vector<float> src = RandomFloats(&rng, dim, -3.0f, 3.0f);
    const uint64_t key = RoundingRowKey(RoundingSpec{Rounding::kStochastic, 3, 9, 1}, 2, 12345);
    for (StorageType type : {StorageType::kBfloat16, StorageType::kFloat16}) {
      for (Rounding mode : {Rounding::kNearest, Rounding::kStochastic}) {
        std::vector<uint16_t> expected(dim);
        for (int64_t d = 0; d < dim; ++d) {
          const uint32_t bits = RoundingBits(key, static_cast<uint32_t>(d));
          if (type == StorageType::kBfloat16) {
            expected[d] =
                mode == Rounding::kNearest ? FloatToBfloat16Nearest(src[d]) : FloatToBfloat16Stochastic(src[d], bits);
          } else {
            expected[d] =
                mode == Rounding::kNearest ? FloatToFloat16Nearest(src[d]) : FloatToFloat16Stochastic(src[d], bits);
          }
        }
        EachCopy([&](Copy isa) {
          std::vector<uint16_t> dst(dim, 0);
          OnCopy(isa, [&] { StoreStoredRow(type, mode, key, src.data(), dst.data(), dim); });
          EXPECT_EQ(dst, expected) << StorageTypeName(type) << " dim " << dim << " " << CopyName(isa)
                                   << (mode == Rounding::kNearest ? " nearest" : " stochastic");
        });
      }
    }
  }
}

// Every optimizer (and non-lazy Adam), rows of odd widths, widths below one vector and not a multiple of 8,
// bfloat16 / float32 / float16 mixes, both roundings: UpdateTable (whose walk keys each row from a stream key
// computed once per call) equals the reference, written with RoundingRowKey per row and buffer, bit for bit.
TEST(VectorIsaTest, SixteenBitTableUpdateEqualsTheWholeRowReference) {
  std::vector<std::pair<std::string, OptimizerParams>> variants = AllOptimizerVariants();
  Adam non_lazy;
  non_lazy.use_non_lazy_adam = true;
  variants.push_back({"adam_non_lazy", non_lazy});
  const std::vector<std::pair<StorageType, StorageType>> mixes = {
      {StorageType::kBfloat16, StorageType::kBfloat16},
      {StorageType::kBfloat16, StorageType::kFloat32},
      {StorageType::kFloat32, StorageType::kBfloat16},
      {StorageType::kFloat16, StorageType::kFloat16},
  };
  constexpr int64_t kVocab = 24, kIds = 60;
  const ShardFn serial = [](int64_t total, int64_t, const std::function<void(int64_t, int64_t)>& fn) { fn(0, total); };
  int cases = 0;
  for (const auto& [name, optimizer] : variants) {
    for (int64_t dim : {1, 5, 8, 13, 37, 64}) {
      for (const auto& [table_type, slot_type] : mixes) {
        for (Rounding mode : {Rounding::kNearest, Rounding::kStochastic}) {
          const std::string what = name + " dim " + std::to_string(dim) + " " + StorageTypeName(table_type) + "/" +
                                   StorageTypeName(slot_type) +
                                   (mode == Rounding::kNearest ? " nearest" : " stochastic");
          std::mt19937 rng(static_cast<uint32_t>(dim * 31 + cases++));
          std::vector<int64_t> ids(kIds);
          for (int64_t& id : ids) id = static_cast<int64_t>(rng() % (kVocab - 4));  // 4 rows never touched
          FeatureLayout layout;
          layout.num_samples = kIds;
          layout.one_id_per_sample = true;
          layout.scale = RandomFloats(&rng, kIds, -1.0f, 1.0f);
          const std::vector<float> gradient = RandomFloats(&rng, kIds * dim, -1.0f, 1.0f);
          const std::vector<GradientSource> sources = {GradientSource{ids.data(), kIds, &layout, gradient.data()}};
          RowGradientPlan plan;
          plan.Build(&sources, kVocab);
          TableOptimization o;
          o.optimizer = optimizer;
          o.gradient_clipping = {-0.8f, 0.9f};
          o.weight_decay_factor = 0.01f;
          const RoundingSpec spec{mode, 17, 5, 2};
          const std::vector<TestBuffer> initial =
              RandomStoredTable(&rng, optimizer, table_type, slot_type, kVocab, dim);

          std::vector<TestBuffer> expected = initial;
          ReferenceStoredUpdate(o, 0.05f, plan, kVocab, dim, spec, &expected);

          std::vector<TestBuffer> actual = initial;
          StoredTableBuffers t;
          t.weights = StoredBuffer{actual[0].bytes.data(), actual[0].type};
          for (size_t b = 1; b < actual.size(); ++b) t.slots.push_back({actual[b].bytes.data(), actual[b].type});
          t.vocabulary_size = kVocab;
          t.dim = dim;
          t.rounding = spec;
          UpdateTable(o, 0.05f, plan, t, serial);
          for (size_t b = 0; b < actual.size(); ++b) {
            ASSERT_EQ(actual[b].bytes, expected[b].bytes) << what << ": UpdateTable, buffer " << b;
          }
        }
      }
    }
  }
}

// A float32 table walks the fast loop (the optimizer alone, rows in place) when it has no clipping or weight
// decay, and the general loop otherwise; with a summing plan or a gathering one, both give the bits of the
// whole-row reference (this file's baseline code; the walk runs the row loops' ISA).
TEST(VectorIsaTest, Float32TableUpdateEqualsTheWholeRowReference) {
  std::vector<std::pair<std::string, OptimizerParams>> variants = AllOptimizerVariants();
  Adam non_lazy;
  non_lazy.use_non_lazy_adam = true;
  variants.push_back({"adam_non_lazy", non_lazy});
  constexpr int64_t kVocab = 24, kIds = 60;
  const ShardFn serial = [](int64_t total, int64_t, const std::function<void(int64_t, int64_t)>& fn) { fn(0, total); };
  int cases = 0;
  for (const auto& [name, optimizer] : variants) {
    for (int64_t dim : {1, 5, 8, 13, 64}) {
      for (bool plain : {true, false}) {
        for (bool summed : {true, false}) {
          const std::string what = name + " dim " + std::to_string(dim) + (plain ? " plain" : " clipped") +
                                   (summed ? " summed" : " gathered");
          std::mt19937 rng(static_cast<uint32_t>(dim * 131 + cases++));
          std::vector<int64_t> ids(kIds);
          for (int64_t& id : ids) id = static_cast<int64_t>(rng() % (kVocab - 4));  // 4 rows never touched
          FeatureLayout layout;
          layout.num_samples = kIds;
          layout.one_id_per_sample = true;
          layout.scale = RandomFloats(&rng, kIds, -1.0f, 1.0f);
          const std::vector<float> gradient = RandomFloats(&rng, kIds * dim, -1.0f, 1.0f);
          const std::vector<GradientSource> sources = {GradientSource{ids.data(), kIds, &layout, gradient.data()}};
          RowGradientPlan plan;
          plan.Build(&sources, kVocab, summed ? dim : 0);
          ASSERT_EQ(plan.summed(), summed) << what;
          TableOptimization o;
          o.optimizer = optimizer;
          if (!plain) {
            o.gradient_clipping = {-0.8f, 0.9f};
            o.weight_decay_factor = 0.01f;
            o.weight_clipping = {-2.0f, 2.0f};
          }
          ASSERT_EQ(PipelineIsOptimizerOnly(o), plain) << what;
          const RoundingSpec spec{Rounding::kNearest, 17, 5, 2};
          const std::vector<TestBuffer> initial =
              RandomStoredTable(&rng, optimizer, StorageType::kFloat32, StorageType::kFloat32, kVocab, dim);

          std::vector<TestBuffer> expected = initial;
          ReferenceStoredUpdate(o, 0.05f, plan, kVocab, dim, spec, &expected);

          std::vector<TestBuffer> actual = initial;
          StoredTableBuffers t;
          t.weights = StoredBuffer{actual[0].bytes.data(), actual[0].type};
          for (size_t b = 1; b < actual.size(); ++b) t.slots.push_back({actual[b].bytes.data(), actual[b].type});
          t.vocabulary_size = kVocab;
          t.dim = dim;
          t.rounding = spec;
          UpdateTable(o, 0.05f, plan, t, serial);
          for (size_t b = 0; b < actual.size(); ++b) {
            ASSERT_EQ(actual[b].bytes, expected[b].bytes) << what << ": UpdateTable, buffer " << b;
          }
        }
      }
    }
  }
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
