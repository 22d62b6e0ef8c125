// The per-row training pipeline of cc/lib (docs/semantics.md, "The training step, row by row"): the forward
// combine (embedding_forward.h, simulated_quantization.h), gradient accumulation (gradient_accumulation.h),
// clipping / weight decay / weight clipping around the optimizer (row_update.h), and lazy versus non-lazy table
// updates with any sharding (table_update.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "cc/lib/embedding_forward.h"
#include "cc/lib/feature_layout.h"
#include "cc/lib/gradient_accumulation.h"
#include "cc/lib/row_update.h"
#include "cc/lib/simulated_quantization.h"
#include "cc/lib/table_update.h"
#include "cc/lib/tests/feature_test_util.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace {

using testing_util::DenseFeature;
using testing_util::Feature;
using testing_util::RaggedFeature;

constexpr float kInf = std::numeric_limits<float>::infinity();

// --- row_update.h: the pipeline around the optimizer --------------------------------------------------------

TableOptimization Sgd() {
  TableOptimization o;
  o.optimizer = tf_embed_ops::Sgd{};
  return o;
}

template <typename Optimizer>
void RunPipeline(const Optimizer& optimizer, const TableOptimization& o, float lr, std::vector<float> g,
                 std::vector<float>* w, std::vector<std::vector<float>>* slots = nullptr) {
  std::vector<float*> slot_ptrs;
  if (slots != nullptr) {
    for (auto& s : *slots) slot_ptrs.push_back(s.data());
  }
  const std::vector<float> given = g;
  std::vector<float> clipped(g.size());
  UpdateRowPipeline(optimizer, o, lr, g.data(), clipped.data(), w->data(), slot_ptrs.data(),
                    static_cast<int64_t>(w->size()));
  EXPECT_EQ(g, given);  // the gradient is only read (a summing plan's own row)
}

TEST(RowPipelineTest, GradientIsClippedBeforeTheOptimizer) {
  TableOptimization o = Sgd();
  o.gradient_clipping = {-1.0f, 2.0f};
  std::vector<float> w = {1.0f, 1.0f, 1.0f};
  RunPipeline(tf_embed_ops::Sgd{}, o, 0.5f, {3.0f, -3.0f, 0.5f}, &w);
  EXPECT_EQ(w, (std::vector<float>{0.0f, 1.5f, 0.75f}));
  // The optimizer's state sees the clipped gradient too: Adagrad's accumulator grows by 1^2, not 5^2.
  o.optimizer = Adagrad{};
  std::vector<float> w1 = {0.0f};
  std::vector<std::vector<float>> a = {{0.1f}};
  RunPipeline(Adagrad{}, o, 0.5f, {-5.0f}, &w1, &a);
  EXPECT_FLOAT_EQ(a[0][0], 1.1f);
  EXPECT_FLOAT_EQ(w1[0], 0.5f / std::sqrt(1.1f));
}

TEST(RowPipelineTest, OneSidedGradientClipping) {
  TableOptimization o = Sgd();
  o.gradient_clipping = {-kInf, 0.25f};
  std::vector<float> w = {0.0f, 0.0f};
  RunPipeline(tf_embed_ops::Sgd{}, o, 1.0f, {-8.0f, 8.0f}, &w);
  EXPECT_EQ(w, (std::vector<float>{8.0f, -0.25f}));
}

TEST(RowPipelineTest, WeightDecayIsDecoupledAndComesBeforeTheStep) {
  TableOptimization o = Sgd();
  o.weight_decay_factor = 0.1f;
  std::vector<float> w = {2.0f, -4.0f};
  RunPipeline(tf_embed_ops::Sgd{}, o, 0.5f, {1.0f, 1.0f}, &w);
  // w * (1 - 0.1) - 0.5 * 1   (decay after the step would give 1.35 and -4.05)
  EXPECT_FLOAT_EQ(w[0], 1.3f);
  EXPECT_FLOAT_EQ(w[1], -4.1f);
}

TEST(RowPipelineTest, WeightDecayMultipliedByTheLearningRate) {
  TableOptimization o = Sgd();
  o.weight_decay_factor = 0.1f;
  o.multiply_weight_decay_factor_by_learning_rate = true;
  std::vector<float> w = {2.0f, -4.0f};
  RunPipeline(tf_embed_ops::Sgd{}, o, 0.5f, {1.0f, 1.0f}, &w);
  // decay 0.1 * 0.5 = 0.05:  w * 0.95 - 0.5
  EXPECT_FLOAT_EQ(w[0], 1.4f);
  EXPECT_FLOAT_EQ(w[1], -4.3f);
}

TEST(RowPipelineTest, WeightsAreClippedAfterTheUpdate) {
  TableOptimization o = Sgd();
  o.weight_clipping = {-1.0f, 1.0f};
  std::vector<float> w = {0.9f, -0.9f, 5.0f};
  RunPipeline(tf_embed_ops::Sgd{}, o, 0.5f, {-1.0f, 1.0f, 0.0f}, &w);
  // 1.4 and -1.4 are clipped; 5.0 with a zero gradient is clipped too (the row was visited).
  EXPECT_EQ(w, (std::vector<float>{1.0f, -1.0f, 1.0f}));
  o.weight_clipping = {0.0f, kInf};
  w = {0.25f, 3.0f};
  RunPipeline(tf_embed_ops::Sgd{}, o, 1.0f, {1.0f, -100.0f}, &w);
  EXPECT_EQ(w, (std::vector<float>{0.0f, 103.0f}));
}

// For every optimizer: the pipeline is exactly clip(g) -> decay(w) -> the optimizer's own row update -> clip(w),
// written out step by step here (bitwise).  The optimizers' own updates are checked in optimizers_test.cc.
TEST(RowPipelineTest, EveryOptimizerRunsBetweenTheClippingAndDecaySteps) {
  Ftrl ftrl;
  ftrl.l1 = 0.01f;
  Lion lion;
  lion.beta1 = 0.5f;
  lion.beta2 = 0.9f;
  RmsProp rms;
  rms.rho = 0.9f;
  rms.epsilon = 0.1f;
  CenteredRmsProp centered;
  centered.rho = 0.9f;
  centered.epsilon = 1.0f;
  Adadelta adadelta;
  adadelta.rho = 0.9f;
  adadelta.epsilon = 0.1f;
  OnlineYogi online;
  online.beta2 = 0.9f;
  ProximalYogi proximal;
  proximal.beta1 = 0.9f;
  proximal.beta2 = 0.9f;
  proximal.epsilon = 0.1f;
  FrequencyEstimator frequency;
  frequency.tau = 0.5f;
  frequency.max_delta = 10.0f;
  frequency.outlier_threshold = 2.0f;
  RowWiseAdagrad rowwise;
  rowwise.weight_decay = 0.1f;
  const std::vector<OptimizerParams> optimizers = {
      tf_embed_ops::Sgd{}, Adagrad{}, AdagradMomentum{}, Adam{}, ftrl,     Momentum{}, rms,      centered, adadelta,
      ProximalAdagrad{},   lion,      BoundedAdagrad{},  online, proximal, frequency,  Assign{}, rowwise};
  ASSERT_EQ(optimizers.size(), std::variant_size_v<OptimizerParams>);
  TableOptimization o;
  o.gradient_clipping = {-0.5f, 0.25f};
  o.weight_decay_factor = 0.2f;
  o.multiply_weight_decay_factor_by_learning_rate = true;
  o.weight_clipping = {-0.6f, 0.55f};
  const float lr = 0.5f;
  const std::vector<float> g0 = {0.75f, -0.1f, -2.0f, 0.2f};
  const std::vector<float> w0 = {0.5f, -0.5f, 0.58f, -0.7f};
  for (const OptimizerParams& params : optimizers) {
    std::visit(
        [&](const auto& optimizer) {
          const size_t num_slots = optimizer.kSlots.size();
          std::vector<std::vector<float>> slots(num_slots, std::vector<float>(4, 0.3f));
          std::vector<float> w = w0;
          RunPipeline(optimizer, o, lr, g0, &w, &slots);

          std::vector<std::vector<float>> expected_slots(num_slots, std::vector<float>(4, 0.3f));
          std::vector<float*> slot_ptrs;
          for (auto& s : expected_slots) slot_ptrs.push_back(s.data());
          std::vector<float> g = g0, expected = w0;
          for (float& x : g) x = std::min(std::max(x, -0.5f), 0.25f);
          for (float& x : expected) x -= (0.2f * lr) * x;
          optimizer.UpdateRow(lr, g.data(), expected.data(), slot_ptrs.data(), 4);
          for (float& x : expected) x = std::min(std::max(x, -0.6f), 0.55f);

          EXPECT_EQ(w, expected) << OptimizerName(params);
          EXPECT_EQ(slots, expected_slots) << OptimizerName(params);
        },
        params);
  }
}

TEST(RowPipelineTest, InactiveOptionsLeaveThePlainUpdate) {
  EXPECT_FALSE(ClipLimits{}.IsActive());
  EXPECT_TRUE((ClipLimits{-kInf, 3.0f}.IsActive()));
  std::vector<float> w = {1.0f};
  RunPipeline(tf_embed_ops::Sgd{}, Sgd(), 0.25f, {1e30f}, &w);
  EXPECT_FLOAT_EQ(w[0], 1.0f - 0.25e30f);
}

// --- gradient_accumulation.h: the accumulation plan ----------------------------------------------------------

std::vector<GradientSource> Sources(const std::vector<Feature>& features) {
  std::vector<GradientSource> sources;
  for (const Feature& f : features) {
    sources.push_back(GradientSource{f.ids.data(), static_cast<int64_t>(f.ids.size()), &f.layout, f.gradient.data()});
  }
  return sources;
}

std::vector<float> Accumulated(const RowGradientPlan& plan, int64_t u, int64_t dim) {
  std::vector<float> g(dim, -1.0f);  // garbage: Accumulate must overwrite it
  plan.Accumulate(u, dim, g.data());
  return g;
}

TEST(RowGradientPlanTest, SumsEveryContributionOfEveryFeaturePerRow) {
  // Feature 0 (ragged, mean, weights): sample 0 = {id 4 (w 1), id 0 (w 3)}, sample 1 = {id 4 (w 2)}.
  // Feature 1 (dense): ids 0, 7.
  std::vector<Feature> features;
  features.push_back(
      RaggedFeature({0, 2, 3}, {4, 0, 4}, {1.0f, 3.0f, 2.0f}, Combiner::kMean, {4.0f, 8.0f, /**/ 1.0f, -1.0f}));
  features.push_back(DenseFeature({0, 7}, {0.5f, 0.5f, /**/ 2.0f, 3.0f}));
  const std::vector<GradientSource> sources = Sources(features);
  RowGradientPlan plan;
  plan.Build(&sources);
  ASSERT_EQ(plan.num_rows(), 3);
  // Unique rows in first-occurrence order, and their contribution counts.
  EXPECT_EQ(plan.row(0), 4);
  EXPECT_EQ(plan.row(1), 0);
  EXPECT_EQ(plan.row(2), 7);
  EXPECT_EQ(plan.contributions(0), 0);
  EXPECT_EQ(plan.contributions(1), 2);
  EXPECT_EQ(plan.contributions(2), 4);
  EXPECT_EQ(plan.contributions(3), 5);
  // Row 4: 1/4 * [4, 8] + 2/2 * [1, -1];  row 0: 3/4 * [4, 8] + [0.5, 0.5];  row 7: [2, 3].
  EXPECT_EQ(Accumulated(plan, 0, 2), (std::vector<float>{2.0f, 1.0f}));
  EXPECT_EQ(Accumulated(plan, 1, 2), (std::vector<float>{3.5f, 6.5f}));
  EXPECT_EQ(Accumulated(plan, 2, 2), (std::vector<float>{2.0f, 3.0f}));
  EXPECT_EQ(plan.OrderByRow(), (std::vector<int64_t>{1, 0, 2}));
}

TEST(RowGradientPlanTest, AZeroNormSampleContributesNothing) {
  std::vector<Feature> features;
  features.push_back(RaggedFeature({0, 2}, {3, 3}, {1.0f, -1.0f}, Combiner::kMean, {5.0f}));
  const std::vector<GradientSource> sources = Sources(features);
  RowGradientPlan plan;
  plan.Build(&sources);
  ASSERT_EQ(plan.num_rows(), 1);
  EXPECT_EQ(Accumulated(plan, 0, 1), (std::vector<float>{0.0f}));
}

// Many ids whose hashes crowd together (multiples of a large power of two), against a std::map count.
TEST(RowGradientPlanTest, CollidingIdsAndAReusedPlan) {
  std::mt19937_64 rng(7);
  RowGradientPlan plan;
  for (int64_t num_ids : {5000, 40, 0, 700}) {
    std::vector<int64_t> ids(num_ids);
    for (int64_t& id : ids) id = static_cast<int64_t>(rng() % 300) << 33;
    std::vector<float> gradient(num_ids);
    for (int64_t i = 0; i < num_ids; ++i) gradient[i] = static_cast<float>(i % 17);
    std::vector<Feature> features;
    features.push_back(DenseFeature(ids, gradient));
    const std::vector<GradientSource> sources = Sources(features);
    plan.Build(&sources);
    std::map<int64_t, std::pair<int64_t, float>> expected;  // row -> (count, sum in input order)
    for (int64_t i = 0; i < num_ids; ++i) {
      expected[ids[i]].first += 1;
      expected[ids[i]].second += gradient[i];
    }
    ASSERT_EQ(plan.num_rows(), static_cast<int64_t>(expected.size()));
    const std::vector<int64_t> order = plan.OrderByRow();
    int64_t k = 0;
    for (const auto& [row, count_sum] : expected) {
      const int64_t u = order[k++];
      EXPECT_EQ(plan.row(u), row);
      EXPECT_EQ(plan.contributions(u + 1) - plan.contributions(u), count_sum.first);
      EXPECT_EQ(Accumulated(plan, u, 1)[0], count_sum.second);
    }
  }
}

// The dense row -> unique index (static tables) and the hash map must give the same plan: the same unique rows in
// the same first-occurrence order, the same contributions in the same order, so bitwise equal sums.  Random ids
// with many duplicates, negative ids (no row), empty sources and steps; one reused plan per path, so a dense
// index left dirty by an earlier step would show.
TEST(RowGradientPlanTest, DenseIndexEqualsHashMap) {
  std::mt19937_64 rng(11);
  const int64_t dim = 3;
  RowGradientPlan dense_plan, hash_plan;
  for (int step = 0; step < 40; ++step) {
    const int64_t vocabulary = 1 + static_cast<int64_t>(rng() % (step % 2 == 0 ? 50 : 5000));
    std::vector<Feature> features;
    const int num_features = static_cast<int>(rng() % 4);  // 0 features: an empty step
    int64_t total = 0;
    for (int f = 0; f < num_features; ++f) {
      const int64_t num_ids = static_cast<int64_t>(rng() % 300) * (rng() % 5 == 0 ? 0 : 1);
      std::vector<int64_t> ids(num_ids);
      for (int64_t& id : ids) id = rng() % 7 == 0 ? -1 - static_cast<int64_t>(rng() % 3) : rng() % vocabulary;
      std::vector<float> gradient(num_ids * dim);
      for (float& g : gradient) g = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
      features.push_back(DenseFeature(ids, gradient));
      total += num_ids;
    }
    const std::vector<GradientSource> sources = Sources(features);
    dense_plan.Build(&sources, vocabulary);
    hash_plan.Build(&sources);
    SCOPED_TRACE(testing::Message() << "step " << step << ", vocabulary " << vocabulary << ", ids " << total);
    EXPECT_EQ(RowGradientPlan::UsesDenseIndex(vocabulary, total), vocabulary <= 64 * total);
    ASSERT_EQ(dense_plan.num_rows(), hash_plan.num_rows());
    for (int64_t u = 0; u <= hash_plan.num_rows(); ++u) {
      ASSERT_EQ(dense_plan.contributions(u), hash_plan.contributions(u));
    }
    for (int64_t u = 0; u < hash_plan.num_rows(); ++u) {
      ASSERT_EQ(dense_plan.row(u), hash_plan.row(u));
      const std::vector<float> a = Accumulated(dense_plan, u, dim), b = Accumulated(hash_plan, u, dim);
      ASSERT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * dim), 0) << "unique row " << u;
    }
    // First-occurrence order, checked independently of either path.
    std::vector<int64_t> first;
    std::map<int64_t, bool> seen;
    for (const Feature& f : features) {
      for (int64_t id : f.ids) {
        if (id >= 0 && !seen[id]) {
          seen[id] = true;
          first.push_back(id);
        }
      }
    }
    ASSERT_EQ(dense_plan.num_rows(), static_cast<int64_t>(first.size()));
    for (size_t u = 0; u < first.size(); ++u) EXPECT_EQ(dense_plan.row(u), first[u]);
  }
}

// A plan that sums while it builds (sum_dim) must give the gathered sums bitwise: the same rows, counts and
// sums, for ragged features with weights and every combiner next to dense ones, negative ids, signed zeros in the
// gradients, the dense index and the hash map, and reused plans (a row first seen in an earlier step starts
// from zero again).
TEST(RowGradientPlanTest, SummingBuildEqualsGatheredSums) {
  std::mt19937_64 rng(23);
  const int64_t dim = 13;  // not a multiple of the vector width: the loops' tails too
  RowGradientPlan gathered, summed;
  for (int step = 0; step < 30; ++step) {
    const int64_t vocabulary = 1 + static_cast<int64_t>(rng() % (step % 2 == 0 ? 40 : 4000));
    std::vector<Feature> features;
    const int num_features = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < num_features; ++f) {
      const int64_t num_samples = static_cast<int64_t>(rng() % 200);
      auto id = [&] { return rng() % 9 == 0 ? -1 : static_cast<int64_t>(rng() % vocabulary); };
      std::vector<float> gradient(num_samples * dim);
      for (float& g : gradient) {
        g = rng() % 11 == 0 ? -0.0f : std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
      }
      if (f % 2 == 0) {
        std::vector<int64_t> ids(num_samples);
        for (int64_t& i : ids) i = id();
        features.push_back(DenseFeature(ids, gradient));
        continue;
      }
      std::vector<int64_t> splits{0}, ids;
      std::vector<float> weights;
      for (int64_t b = 0; b < num_samples; ++b) {
        const int64_t n = static_cast<int64_t>(rng() % 4);
        for (int64_t k = 0; k < n; ++k) {
          ids.push_back(id());
          weights.push_back(std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng));
        }
        splits.push_back(static_cast<int64_t>(ids.size()));
      }
      const Combiner combiner = step % 3 == 0 ? Combiner::kSum : (step % 3 == 1 ? Combiner::kMean : Combiner::kSqrtn);
      features.push_back(RaggedFeature(splits, ids, weights, combiner, gradient));
    }
    const std::vector<GradientSource> sources = Sources(features);
    const int64_t rows_bound = step % 4 == 3 ? 0 : vocabulary;  // 0: the hash map
    gathered.Build(&sources, rows_bound);
    summed.Build(&sources, rows_bound, dim);
    SCOPED_TRACE(testing::Message() << "step " << step << ", vocabulary " << vocabulary);
    ASSERT_FALSE(gathered.summed());
    ASSERT_TRUE(summed.summed());
    ASSERT_EQ(summed.num_rows(), gathered.num_rows());
    for (int64_t u = 0; u <= gathered.num_rows(); ++u) ASSERT_EQ(summed.contributions(u), gathered.contributions(u));
    for (int64_t u = 0; u < gathered.num_rows(); ++u) {
      ASSERT_EQ(summed.row(u), gathered.row(u));
      const std::vector<float> a = Accumulated(summed, u, dim), b = Accumulated(gathered, u, dim);
      ASSERT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * dim), 0) << "unique row " << u;
      // Gradient(): the summing plan's own row, the gathering plan's sum in the scratch; both are Accumulate's.
      std::vector<float> scratch(dim, 7.0f);
      const float* own = summed.Gradient(u, dim, scratch.data());
      EXPECT_NE(own, scratch.data());
      ASSERT_EQ(std::memcmp(own, a.data(), sizeof(float) * dim), 0) << "unique row " << u;
      ASSERT_EQ(gathered.Gradient(u, dim, scratch.data()), scratch.data());
      ASSERT_EQ(std::memcmp(scratch.data(), b.data(), sizeof(float) * dim), 0) << "unique row " << u;
    }
  }
}

// A step whose sums would exceed kMaxSummedFloats is planned for the walk to gather (its rows are unchanged).
TEST(RowGradientPlanTest, SummingBuildFallsBackPastItsBound) {
  const std::vector<int64_t> ids{3, 1, 3};
  std::vector<Feature> features;
  features.push_back(DenseFeature(ids, std::vector<float>(ids.size() * 2, 1.0f)));
  const std::vector<GradientSource> sources = Sources(features);
  RowGradientPlan plan;
  plan.Build(&sources, 0, RowGradientPlan::kMaxSummedFloats / 3 + 1);  // 3 ids x that width > the bound
  EXPECT_FALSE(plan.summed());
  ASSERT_EQ(plan.num_rows(), 2);
  EXPECT_EQ(plan.row(0), 3);
  EXPECT_EQ(plan.row(1), 1);
  plan.Build(&sources, 0, 2);
  EXPECT_TRUE(plan.summed());
  EXPECT_EQ(Accumulated(plan, 0, 2), (std::vector<float>{2.0f, 2.0f}));
  plan.Build(&sources);  // and back to gathering
  EXPECT_FALSE(plan.summed());
  EXPECT_EQ(Accumulated(plan, 0, 2), (std::vector<float>{2.0f, 2.0f}));
}

TEST(RowGradientPlanTest, DenseIndexRule) {
  EXPECT_FALSE(RowGradientPlan::UsesDenseIndex(0, 100));  // dynamic table: no vocabulary
  EXPECT_TRUE(RowGradientPlan::UsesDenseIndex(6400, 100));
  EXPECT_FALSE(RowGradientPlan::UsesDenseIndex(6401, 100));
  EXPECT_FALSE(RowGradientPlan::UsesDenseIndex(10, 0));  // no ids: nothing to index
  EXPECT_TRUE(RowGradientPlan::UsesDenseIndex(RowGradientPlan::kMaxDenseVocabulary, int64_t{1} << 20));
  EXPECT_FALSE(RowGradientPlan::UsesDenseIndex(RowGradientPlan::kMaxDenseVocabulary + 1, int64_t{1} << 30));
}

// --- table_update.h ---------------------------------------------------------------------------------------

// A [vocabulary, dim] table and its slots, every element of slot k starting at initial[k].
struct Table {
  Table(int64_t vocabulary, int64_t dim, const std::vector<float>& initial) : weights(vocabulary * dim) {
    for (int64_t i = 0; i < vocabulary * dim; ++i) weights[i] = 0.01f * static_cast<float>(i) - 0.3f;
    for (float v : initial) slots.emplace_back(vocabulary * dim, v);
    buffers.weights = weights.data();
    for (auto& s : slots) buffers.slots.push_back(s.data());
    buffers.vocabulary_size = vocabulary;
    buffers.dim = dim;
  }
  std::vector<float> weights;
  std::vector<std::vector<float>> slots;
  TableBuffers buffers;
};

const ShardFn kSerial = [](int64_t total, int64_t, const std::function<void(int64_t, int64_t)>& fn) { fn(0, total); };

// Blocks of `block` units, run last block first: a result that depended on the order or the cut would show.
ShardFn Backwards(int64_t block) {
  return [block](int64_t total, int64_t, const std::function<void(int64_t, int64_t)>& fn) {
    for (int64_t end = total; end > 0; end -= block) fn(std::max<int64_t>(0, end - block), end);
  };
}

const ShardFn kThreads = [](int64_t total, int64_t, const std::function<void(int64_t, int64_t)>& fn) {
  constexpr int64_t kWorkers = 4;
  std::vector<std::thread> workers;
  for (int64_t t = 0; t < kWorkers; ++t) {
    const int64_t begin = total * t / kWorkers, end = total * (t + 1) / kWorkers;
    if (begin < end) workers.emplace_back([&fn, begin, end] { fn(begin, end); });
  }
  for (auto& w : workers) w.join();
};

TEST(UpdateTableTest, LazyAdagradUpdatesTouchedRowsOnceWithTheSummedGradient) {
  Table t(6, 2, {0.1f});
  const Table before = t;
  std::vector<Feature> features;
  features.push_back(RaggedFeature({0, 2, 3}, {1, 3, 1}, {}, Combiner::kSum, {1.0f, 2.0f, /**/ 0.5f, -1.0f}));
  features.push_back(DenseFeature({3, 5}, {2.0f, 0.0f, /**/ -1.0f, 1.0f}));
  const std::vector<GradientSource> sources = Sources(features);
  RowGradientPlan plan;
  plan.Build(&sources);
  TableOptimization o;
  o.optimizer = Adagrad{};
  UpdateTable(o, 0.1f, plan, t.buffers, kSerial);
  // Summed gradients: row 1 = [1.5, 1], row 3 = [3, 2], row 5 = [-1, 1].
  const std::map<int64_t, std::vector<float>> g = {{1, {1.5f, 1.0f}}, {3, {3.0f, 2.0f}}, {5, {-1.0f, 1.0f}}};
  for (int64_t row = 0; row < 6; ++row) {
    for (int64_t d = 0; d < 2; ++d) {
      const int64_t i = row * 2 + d;
      if (g.count(row) == 0) {
        EXPECT_EQ(t.weights[i], before.weights[i]) << "untouched row " << row;
        EXPECT_EQ(t.slots[0][i], 0.1f) << "untouched row " << row;
        continue;
      }
      const float gd = g.at(row)[d];
      // Adagrad once with the sum: a = 0.1 + (sum g)^2, not 0.1 + sum(g^2).
      EXPECT_FLOAT_EQ(t.slots[0][i], 0.1f + gd * gd) << "row " << row;
      EXPECT_FLOAT_EQ(t.weights[i], before.weights[i] - 0.1f * gd / std::sqrt(0.1f + gd * gd)) << "row " << row;
    }
  }
}

TEST(UpdateTableTest, ATouchedRowWhoseGradientSumsToZeroIsStillUpdated) {
  Table t(3, 1, {1.0f});
  const Table before = t;
  std::vector<Feature> features;
  features.push_back(DenseFeature({2, 2}, {1.0f, -1.0f}));
  const std::vector<GradientSource> sources = Sources(features);
  RowGradientPlan plan;
  plan.Build(&sources);
  TableOptimization o;
  Momentum momentum;
  momentum.momentum = 0.5f;
  o.optimizer = momentum;
  UpdateTable(o, 0.1f, plan, t.buffers, kSerial);
  EXPECT_EQ(t.slots[0][2], 0.5f);                            // m = 0.5 * 1 + 0
  EXPECT_FLOAT_EQ(t.weights[2], before.weights[2] - 0.05f);  // w -= 0.1 * m
  for (int64_t row : {0, 1}) {
    EXPECT_EQ(t.slots[0][row], 1.0f);
    EXPECT_EQ(t.weights[row], before.weights[row]);
  }
}

TEST(UpdateTableTest, NonLazyAdamUpdatesEveryRowWithAZeroGradientWhereUntouched) {
  Table t(5, 2, {0.1f, 0.01f});
  const Table before = t;
  std::vector<Feature> features;
  features.push_back(DenseFeature({3}, {0.5f, -2.0f}));
  const std::vector<GradientSource> sources = Sources(features);
  RowGradientPlan plan;
  plan.Build(&sources);
  TableOptimization o;
  Adam adam;
  adam.use_non_lazy_adam = true;
  o.optimizer = adam;
  o.weight_decay_factor = 0.25f;  // decays every row, since every row is updated
  UpdateTable(o, 0.1f, plan, t.buffers, Backwards(2));
  for (int64_t i = 0; i < 10; ++i) {
    const float g = i / 2 == 3 ? (i % 2 == 0 ? 0.5f : -2.0f) : 0.0f;
    // Adam's defaults: beta1 0.9, beta2 0.999, epsilon 1e-7 (inside the square root).
    const float m = 0.9f * 0.1f + (1.0f - 0.9f) * g;
    const float v = 0.999f * 0.01f + (1.0f - 0.999f) * g * g;
    const float w = before.weights[i] * (1.0f - 0.25f) - 0.1f * m / std::sqrt(v + 1e-7f * 1e-7f);
    EXPECT_FLOAT_EQ(t.slots[0][i], m) << i;
    EXPECT_FLOAT_EQ(t.slots[1][i], v) << i;
    EXPECT_FLOAT_EQ(t.weights[i], w) << i;
  }
}

// Random features over a larger table: SGD's result against an independent per-row sum in the documented
// order (features in input order, ids in input order), and bitwise the same for every sharding and every
// optimizer.
class UpdateTableShardingTest : public ::testing::Test {
 protected:
  static constexpr int64_t kVocabulary = 997;
  static constexpr int64_t kDim = 19;  // a vector body and a tail

  void SetUp() override {
    std::mt19937_64 rng(42);
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    for (int f = 0; f < 3; ++f) {
      const int64_t samples = 64 + 32 * f;
      std::vector<int64_t> splits = {0};
      std::vector<int64_t> ids;
      std::vector<float> weights;
      for (int64_t s = 0; s < samples; ++s) {
        const int64_t n = static_cast<int64_t>(rng() % 6);
        for (int64_t k = 0; k < n; ++k) {
          // Skewed: low ids repeat a lot.
          const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
          ids.push_back(static_cast<int64_t>(std::pow(u, 3.0) * kVocabulary));
          weights.push_back(value(rng) + 1.5f);
        }
        splits.push_back(static_cast<int64_t>(ids.size()));
      }
      std::vector<float> gradient(samples * kDim);
      for (float& x : gradient) x = value(rng);
      features_.push_back(RaggedFeature(
          splits, ids, weights, f == 0 ? Combiner::kSum : (f == 1 ? Combiner::kMean : Combiner::kSqrtn), gradient));
    }
    sources_ = Sources(features_);
    plan_.Build(&sources_);
  }

  std::vector<Feature> features_;
  std::vector<GradientSource> sources_;
  RowGradientPlan plan_;
};

TEST_F(UpdateTableShardingTest, SgdMatchesAnIndependentPerRowSum) {
  std::map<int64_t, std::vector<float>> sums;
  for (const Feature& f : features_) {
    for (size_t i = 0; i < f.ids.size(); ++i) {
      std::vector<float>& g = sums.try_emplace(f.ids[i], kDim, 0.0f).first->second;
      const float* dact = f.gradient.data() + f.layout.sample_of[i] * kDim;
      for (int64_t d = 0; d < kDim; ++d) g[d] += f.layout.Scale(i) * dact[d];
    }
  }
  Table t(kVocabulary, kDim, {});
  const Table before = t;
  TableOptimization o;
  o.optimizer = tf_embed_ops::Sgd{};
  UpdateTable(o, 0.25f, plan_, t.buffers, kThreads);
  for (int64_t row = 0; row < kVocabulary; ++row) {
    for (int64_t d = 0; d < kDim; ++d) {
      const int64_t i = row * kDim + d;
      const float expected = sums.count(row) ? before.weights[i] - 0.25f * sums[row][d] : before.weights[i];
      ASSERT_EQ(t.weights[i], expected) << "row " << row << " dim " << d;
    }
  }
}

TEST_F(UpdateTableShardingTest, EveryOptimizerGivesBitwiseTheSameResultForAnySharding) {
  Adam non_lazy_adam;
  non_lazy_adam.use_non_lazy_adam = true;
  Ftrl ftrl;
  ftrl.l1 = 0.01f;
  ftrl.l2 = 0.1f;
  const std::vector<OptimizerParams> optimizers = {tf_embed_ops::Sgd{}, Adagrad{}, Adam{}, non_lazy_adam, ftrl,
                                                   AdagradMomentum{},   Lion{}};
  for (const OptimizerParams& optimizer : optimizers) {
    TableOptimization o;
    o.optimizer = optimizer;
    o.gradient_clipping = {-0.5f, 0.5f};
    o.weight_clipping = {-0.2f, kInf};
    o.weight_decay_factor = 0.01f;
    std::vector<float> initial;
    for (const SlotInfo& s : OptimizerSlots(optimizer)) initial.push_back(s.default_initial_value);
    Table serial(kVocabulary, kDim, initial), backwards(kVocabulary, kDim, initial),
        threads(kVocabulary, kDim, initial);
    UpdateTable(o, 0.05f, plan_, serial.buffers, kSerial);
    UpdateTable(o, 0.05f, plan_, backwards.buffers, Backwards(3));
    UpdateTable(o, 0.05f, plan_, threads.buffers, kThreads);
    EXPECT_NE(serial.weights, Table(kVocabulary, kDim, initial).weights) << OptimizerName(optimizer);
    for (const Table* other : {&backwards, &threads}) {
      EXPECT_EQ(std::memcmp(serial.weights.data(), other->weights.data(), serial.weights.size() * sizeof(float)), 0)
          << OptimizerName(optimizer);
      for (size_t k = 0; k < serial.slots.size(); ++k) {
        EXPECT_EQ(std::memcmp(serial.slots[k].data(), other->slots[k].data(), serial.slots[k].size() * sizeof(float)),
                  0)
            << OptimizerName(optimizer) << " slot " << k;
      }
    }
  }
}

// A tracked table's walk marks every row it writes as one update of the tracker, whatever the sharding, and a
// non-lazy optimizer (every row written) marks them all at once; the rows come out as they do untracked.
TEST_F(UpdateTableShardingTest, TheWalkMarksTheRowsItWritesAsOneUpdate) {
  std::vector<int64_t> plan_rows;
  for (int64_t u = 0; u < plan_.num_rows(); ++u) plan_rows.push_back(plan_.row(u));
  std::sort(plan_rows.begin(), plan_rows.end());
  ASSERT_GT(plan_rows.size(), 10u);
  for (const ShardFn& shard : {kSerial, Backwards(3), kThreads}) {
    TableOptimization o;
    o.optimizer = Adagrad{};
    Table tracked(kVocabulary, kDim, {0.1f}), untracked(kVocabulary, kDim, {0.1f});
    TouchedRows touched(kVocabulary);
    const int64_t before = touched.version();
    UpdateTable(o, 0.05f, plan_, tracked.buffers, shard, &touched);
    UpdateTable(o, 0.05f, plan_, untracked.buffers, shard);
    EXPECT_EQ(touched.version(), before + 1);
    const TouchedRows::Changes changes = touched.Since(before, kVocabulary);
    EXPECT_FALSE(changes.full);
    EXPECT_EQ(changes.rows, plan_rows);
    EXPECT_EQ(tracked.weights, untracked.weights);
    EXPECT_EQ(tracked.slots, untracked.slots);
  }
  TableOptimization o;
  Adam non_lazy_adam;
  non_lazy_adam.use_non_lazy_adam = true;
  o.optimizer = non_lazy_adam;
  Table t(kVocabulary, kDim, {0.0f, 0.0f});
  TouchedRows touched(kVocabulary);
  const int64_t before = touched.version();
  UpdateTable(o, 0.05f, plan_, t.buffers, kThreads, &touched);
  EXPECT_TRUE(touched.Since(before, kVocabulary).full);
  EXPECT_FALSE(touched.Since(touched.version(), kVocabulary).full);
}

}  // namespace
}  // namespace tf_embed_ops
