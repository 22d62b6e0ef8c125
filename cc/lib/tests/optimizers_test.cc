// Every optimizer of cc/lib/optimizers against values computed by hand from its formula (docs/semantics.md,
// "Optimizers"), in float32: two steps on a row of three elements, the second with a different gradient, one of
// the gradients exactly 0.  The expected numbers come from an independent scalar evaluation of each formula
// (numpy float32, in the formula's own order), not from this code; EXPECT_FLOAT_EQ allows 4 ulp for the
// differences in operation order.
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cc/lib/optimizers/registry.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace {

constexpr int kDim = 3;
using Row = std::array<float, kDim>;

constexpr Row kW0 = {0.5f, -1.25f, 2.0f};
constexpr Row kG1 = {0.3f, -0.7f, 0.0f};
constexpr Row kG2 = {-0.4f, 0.2f, 1.5f};
constexpr float kLr = 0.1f;

// A row with its slots, each slot starting at the given value in every element.
struct State {
  Row w = kW0;
  std::vector<Row> slots;
};

template <typename Optimizer>
State TwoSteps(const Optimizer& optimizer, const std::vector<float>& initial_slots) {
  State s;
  for (float v : initial_slots) s.slots.push_back(Row{v, v, v});
  EXPECT_EQ(s.slots.size(), Optimizer::kSlots.size());
  std::vector<float*> slot_ptrs;
  for (Row& r : s.slots) slot_ptrs.push_back(r.data());
  for (const Row& g : {kG1, kG2}) optimizer.UpdateRow(kLr, g.data(), s.w.data(), slot_ptrs.data(), kDim);
  return s;
}

void ExpectRow(const Row& actual, const Row& expected, const std::string& what) {
  for (int i = 0; i < kDim; ++i) EXPECT_FLOAT_EQ(actual[i], expected[i]) << what << "[" << i << "]";
}

void ExpectState(const State& s, const Row& w, const std::vector<Row>& slots) {
  ExpectRow(s.w, w, "w");
  ASSERT_EQ(s.slots.size(), slots.size());
  for (size_t k = 0; k < slots.size(); ++k) ExpectRow(s.slots[k], slots[k], "slot " + std::to_string(k));
}

TEST(OptimizersTest, Sgd) { ExpectState(TwoSteps(Sgd{}, {}), {0.51f, -1.2f, 1.85f}, {}); }

// Row-wise Adagrad (FBGEMM's EXACT_ROWWISE_ADAGRAD): one accumulator per row, in element 0 of the slot row; the
// other elements stay untouched (the kernels give it a [vocabulary_size, 1] slot).  Step 1: a = (0.09 + 0.49) / 3.
TEST(OptimizersTest, RowWiseAdagradAccumulatesTheMeanSquareOncePerRow) {
  ExpectState(TwoSteps(RowWiseAdagrad{}, {0.0f}), {0.4715726375579834f, -1.110700249671936f, 1.8507444858551025f},
              {{1.0099999904632568f, 0.0f, 0.0f}});
}

// epsilon is added to the square root, not inside it: 0.5 changes the step by a third here.
TEST(OptimizersTest, RowWiseAdagradAddsEpsilonOutsideTheSquareRoot) {
  RowWiseAdagrad o;
  o.epsilon = 0.5f;
  ExpectState(TwoSteps(o, {0.0f}), {0.4946531057357788f, -1.1887969970703125f, 1.9003313779830933f},
              {{1.0099999904632568f, 0.0f, 0.0f}});
}

TEST(OptimizersTest, RowWiseAdagradL2FoldsTheDecayIntoTheAccumulatorAndTheFactor) {
  RowWiseAdagrad o;
  o.weight_decay = 0.1f;
  ExpectState(TwoSteps(o, {0.0f}), {0.4654342532157898f, -1.1023672819137573f, 1.8126522302627563f},
              {{1.2852262258529663f, 0.0f, 0.0f}});
}

TEST(OptimizersTest, RowWiseAdagradDecoupledScalesTheRowByOneMinusLrTimesDecay) {
  RowWiseAdagrad o;
  o.weight_decay = 0.1f;
  o.decoupled_weight_decay = true;
  ExpectState(TwoSteps(o, {0.0f}), {0.4623049199581146f, -1.0874172449111938f, 1.8109445571899414f},
              {{1.0099999904632568f, 0.0f, 0.0f}});
}

// The row's sum of squares in FBGEMM's order, written out in scalars: lane k = sum of the terms of elements
// k, k + 8, ... in order, then ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).  SumSquares (blocks of eight
// lanes, which the compiler keeps in one vector register) must give these bits for every width, the tails of 1-7
// elements included; magnitudes spread over 2^-20 .. 2^20 make any other order round differently (checked below
// against a plain left-to-right sum).
float FbgemmOrderSumSquares(const std::vector<float>& g, const std::vector<float>& w, float l2) {
  float lane[8] = {};
  for (size_t i = 0; i < g.size(); ++i) {
    const float t = l2 != 0.0f ? g[i] + l2 * w[i] : g[i];
    lane[i % 8] += t * t;
  }
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

TEST(OptimizersTest, RowWiseAdagradSumsSquaresInFbgemmOrder) {
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  int order_matters = 0;
  for (int64_t dim = 1; dim <= 41; ++dim) {
    for (float l2 : {0.0f, 0.3f}) {
      std::vector<float> g(dim), w(dim);
      for (int64_t i = 0; i < dim; ++i) {
        g[i] = std::ldexp(mantissa(rng), exponent(rng)) * (rng() % 2 ? 1.0f : -1.0f);
        w[i] = std::ldexp(mantissa(rng), exponent(rng));
      }
      const float expected = FbgemmOrderSumSquares(g, w, l2);
      const float actual = l2 == 0.0f ? RowWiseAdagrad::SumSquares<false>(g.data(), w.data(), 0.0f, dim)
                                      : RowWiseAdagrad::SumSquares<true>(g.data(), w.data(), l2, dim);
      uint32_t e, a;
      std::memcpy(&e, &expected, 4);
      std::memcpy(&a, &actual, 4);
      EXPECT_EQ(a, e) << "dim " << dim << " l2 " << l2 << ": " << actual << " vs " << expected;
      float sequential = 0.0f;
      for (int64_t i = 0; i < dim; ++i) {
        const float t = l2 != 0.0f ? g[i] + l2 * w[i] : g[i];
        sequential += t * t;
      }
      if (sequential != expected) ++order_matters;
    }
  }
  EXPECT_GT(order_matters, 10);  // the data tells the orders apart
}

TEST(OptimizersTest, RowWiseAdagradSlotIsOneValuePerRow) {
  EXPECT_EQ(SlotWidth(RowWiseAdagrad::kSlots[0], 64), 1);
  EXPECT_EQ(SlotWidth(Adagrad::kSlots[0], 64), 64);
}

TEST(OptimizersTest, AdagradHasNoEpsilon) {
  ExpectState(TwoSteps(Adagrad{}, {0.1f}), {0.49878764152526855f, -1.184065341949463f, 1.9021507501602173f},
              {{0.35f, 0.63f, 2.35f}});
}

TEST(OptimizersTest, AdagradMomentumFoldsTheGradientIntoTheMomentum) {
  AdagradMomentum o;
  o.momentum = 0.9f;
  ExpectState(TwoSteps(o, {0.0f, 0.0f}), {0.39000001549720764f, -1.0874720811843872f, 1.899999976158142f},
              {{0.25f, 0.53f, 2.25f}, {0.09999996423721313f, -0.6252788305282593f, 1.0f}});
}

TEST(OptimizersTest, AdagradMomentumNesterovWithDecayingAccumulatorAndExponent3) {
  AdagradMomentum o;
  o.momentum = 0.5f;
  o.use_nesterov = true;
  o.exponent = 3.0f;
  o.beta2 = 0.9f;
  o.epsilon = 1e-3f;
  ExpectState(TwoSteps(o, {0.0f, 0.0f}), {0.46124082803726196f, -0.9994109272956848f, 1.6306146383285522f},
              {{0.024100007489323616f, 0.04810000956058502f, 0.2250000536441803f},
               {-0.6699233055114746f, -0.4038656949996948f, 2.462568998336792f}});
}

TEST(OptimizersTest, AdamSumInsideSqrtWithoutBiasCorrection) {
  Adam o;  // beta1 0.9, beta2 0.999, epsilon 1e-7, use_sum_inside_sqrt
  ExpectState(TwoSteps(o, {0.0f, 0.0f}), {0.26600468158721924f, -0.7469024062156677f, 1.6837701797485352f},
              {{-0.0130000039935112f, -0.043000005185604095f, 0.15000003576278687f},
               {0.0002499067923054099f, 0.0005295031587593257f, 0.002249971032142639f}});
}

TEST(OptimizersTest, AdamEpsilonOutsideSqrt) {
  Adam o;
  o.beta1 = 0.8f;
  o.beta2 = 0.99f;
  o.epsilon = 0.1f;
  o.use_sum_inside_sqrt = false;
  ExpectState(TwoSteps(o, {0.0f, 0.0f}), {0.4751923084259033f, -1.125899076461792f, 1.8799999952316284f},
              {{-0.03199999779462814f, -0.07199998944997787f, 0.29999998211860657f},
               {0.0024909977801144123f, 0.005250995513051748f, 0.02249997854232788f}});
}

TEST(OptimizersTest, AdamLaziness) {
  Adam o;
  EXPECT_FALSE(o.UpdatesAllRows());
  o.use_non_lazy_adam = true;
  EXPECT_TRUE(o.UpdatesAllRows());
}

TEST(OptimizersTest, FtrlStandardWithL1L2Beta) {
  Ftrl o;
  o.l1 = 0.05f;
  o.l2 = 0.2f;
  o.beta = 0.3f;
  ExpectState(TwoSteps(o, {0.1f, 0.0f}), {0.07493984699249268f, -0.45970579981803894f, -0.07741712033748627f},
              {{0.35f, 0.63f, 2.35f}, {-0.748145580291748f, 5.261801242828369f, 1.5f}});
}

TEST(OptimizersTest, FtrlMultiplyLinearByLrWithGeneralPower) {
  Ftrl o;
  o.l1 = 0.01f;
  o.l2 = 0.1f;
  o.lr_power = -0.7f;
  o.beta = 0.2f;
  o.multiply_linear_by_lr = true;
  ExpectState(TwoSteps(o, {0.1f, 0.0f}), {0.10521057993173599f, -0.6177529692649841f, -0.07308783382177353f},
              {{0.35f, 0.63f, 2.35f}, {-0.0746016651391983f, 0.5839526653289795f, 0.15000000596046448f}});
}

TEST(OptimizersTest, FtrlL1ThresholdZeroesTheWeight) {
  // |linear| <= l1 gives w = 0 exactly: one step from a = 0.1, w = 0 with g = 0.3, l1 = 1.
  Ftrl o;
  o.l1 = 1.0f;
  float w = 0.0f, a = 0.1f, lin = 0.0f;
  float* slots[] = {&a, &lin};
  const float g = 0.3f;
  o.UpdateRow(kLr, &g, &w, slots, 1);
  EXPECT_EQ(w, 0.0f);
  EXPECT_FLOAT_EQ(lin, 0.3f);
  EXPECT_FLOAT_EQ(a, 0.19f);
}

TEST(OptimizersTest, Momentum) {
  Momentum o;
  o.momentum = 0.9f;
  ExpectState(TwoSteps(o, {0.0f}), {0.483f, -1.137f, 1.85f}, {{-0.13f, -0.43f, 1.5f}});
}

TEST(OptimizersTest, MomentumNesterov) {
  Momentum o;
  o.momentum = 0.9f;
  o.use_nesterov = true;
  ExpectState(TwoSteps(o, {0.0f}), {0.49469998478889465f, -1.0982999801635742f, 1.715000033378601f},
              {{-0.13f, -0.43f, 1.5f}});
}

TEST(OptimizersTest, RmsProp) {
  RmsProp o;
  o.rho = 0.9f;
  o.momentum = 0.5f;
  o.epsilon = 1e-2f;
  ExpectState(TwoSteps(o, {1.0f, 0.0f}), {0.49659621715545654f, -1.1642446517944336f, 1.8532651662826538f},
              {{0.8340999484062195f, 0.8580999970436096f, 1.034999966621399f},
               {-0.027890373021364212f, -0.014274640008807182f, 0.1467348039150238f}});
}

TEST(OptimizersTest, CenteredRmsProp) {
  CenteredRmsProp o;
  o.rho = 0.9f;
  o.momentum = 0.5f;
  o.epsilon = 1e-2f;
  ExpectState(TwoSteps(o, {1.0f, 0.0f, 0.0f}), {0.49657756090164185f, -1.1639926433563232f, 1.8516595363616943f},
              {{0.8340999484062195f, 0.8580999970436096f, 1.034999966621399f},
               {-0.02788706310093403f, -0.014343401417136192f, 0.14834046363830566f},
               {-0.0130000039935112f, -0.043000005185604095f, 0.15000003576278687f}});
}

TEST(OptimizersTest, Adadelta) {
  Adadelta o;
  o.rho = 0.95f;
  o.epsilon = 1e-2f;
  ExpectState(TwoSteps(o, {0.0f, 0.0f}), {0.5057655572891235f, -1.2262388467788696f, 1.9571428298950195f},
              {{0.01227500382810831f, 0.025275005027651787f, 0.11250002682209015f},
               {0.007654340006411076f, 0.007715984247624874f, 0.009183675050735474f}});
}

TEST(OptimizersTest, ProximalAdagradWithL1) {
  ProximalAdagrad o;
  o.l1 = 0.2f;
  o.l2 = 0.1f;
  ExpectState(TwoSteps(o, {0.1f}), {0.4036346971988678f, -1.1043577194213867f, 1.7550418376922607f},
              {{0.35f, 0.63f, 2.35f}});
}

TEST(OptimizersTest, ProximalAdagradWithoutL1) {
  ProximalAdagrad o;
  o.l2 = 0.1f;
  ExpectState(TwoSteps(o, {0.1f}), {0.4809874892234802f, -1.1546251773834229f, 1.8289134502410889f},
              {{0.35f, 0.63f, 2.35f}});
}

TEST(OptimizersTest, LionStepsBySignAndSignOfZeroIsZero) {
  Lion o;
  o.beta1 = 0.9f;
  o.beta2 = 0.99f;
  // Element 2 sees g = 0 with m = 0 first: sign(0) = 0, so it does not move on that step.
  ExpectState(TwoSteps(o, {0.0f}), {0.5f, -1.25f, 1.9f},
              {{-0.001029999228194356f, -0.004929995164275169f, 0.014999985694885254f}});
  EXPECT_FALSE(o.UpdatesAllRows());
  o.use_non_lazy_lion = true;
  EXPECT_TRUE(o.UpdatesAllRows());
}

TEST(OptimizersTest, BoundedAdagradAccumulatorFirstWithBothBounds) {
  BoundedAdagrad o;
  o.update_accumulator_first = true;
  o.max_var_update = 0.05f;
  o.max_accumulator = 0.3f;
  ExpectState(TwoSteps(o, {0.1f}), {0.5f, -1.236514925956726f, 1.95f}, {{0.3f, 0.3f, 0.3f}});
}

TEST(OptimizersTest, BoundedAdagradOldAccumulatorWithoutBounds) {
  BoundedAdagrad o;  // bounds 0 = disabled
  ExpectState(TwoSteps(o, {0.1f}), {0.49689796566963196f, -1.0546783208847046f, 1.525658369064331f},
              {{0.35f, 0.63f, 2.35f}});
}

TEST(OptimizersTest, OnlineYogi) {
  OnlineYogi o;
  o.l1 = 0.01f;
  o.l2 = 0.1f;
  o.beta2 = 0.9f;
  ExpectState(TwoSteps(o, {0.1f, 0.0f}), {0.0f, -0.08985624462366104f, -0.2525048553943634f},
              {{0.107f, 0.145f, 0.3250000476837158f}, {0.0015316605567932129f, 0.3701336681842804f, 1.5f}});
}

TEST(OptimizersTest, ProximalYogiWithL1) {
  ProximalYogi o;
  o.l1 = 0.05f;
  o.l2 = 0.1f;
  o.beta1 = 0.9f;
  o.beta2 = 0.99f;
  o.epsilon = 1e-3f;
  ExpectState(TwoSteps(o, {0.1f, 0.0f}), {0.4348161816596985f, -1.1138111352920532f, 1.8149135112762451f},
              {{0.1006999984383583f, 0.10449999570846558f, 0.122499980032444f},
               {-0.0130000039935112f, -0.043000005185604095f, 0.15000003576278687f}});
}

TEST(OptimizersTest, ProximalYogiWithoutL1) {
  ProximalYogi o;
  o.l2 = 0.1f;
  o.beta1 = 0.9f;
  o.beta2 = 0.99f;
  o.epsilon = 1e-3f;
  ExpectState(TwoSteps(o, {0.1f, 0.0f}), {0.4649239778518677f, -1.143253207206726f, 1.8436204195022583f},
              {{0.1006999984383583f, 0.10449999570846558f, 0.122499980032444f},
               {-0.0130000039935112f, -0.043000005185604095f, 0.15000003576278687f}});
}

TEST(OptimizersTest, FrequencyEstimatorTracksTheMeanGapBetweenHits) {
  FrequencyEstimator o;
  o.tau = 0.5f;
  o.max_delta = 10.0f;
  o.outlier_threshold = 2.0f;
  Row d = {4.0f, 4.0f, 4.0f}, last_hit = {0.0f, 0.0f, 3.0f};
  float* slots[] = {last_hit.data()};
  const Row ignored_gradient = {1.0f, 1.0f, 1.0f};
  // Step 5: gaps 5, 5, 2 < 2 * 4, so D moves halfway to the gap.
  o.UpdateRow(5.0f, ignored_gradient.data(), d.data(), slots, kDim);
  ExpectRow(d, {4.5f, 4.5f, 3.0f}, "D after step 5");
  ExpectRow(last_hit, {5.0f, 5.0f, 5.0f}, "last hit after step 5");
  // Step 12: gap 7 < 2 * 4.5 (elements 0, 1: averaged); 7 >= 2 * 3 (element 2: an outlier, D = gap).
  o.UpdateRow(12.0f, ignored_gradient.data(), d.data(), slots, kDim);
  ExpectRow(d, {5.75f, 5.75f, 7.0f}, "D after step 12");
  // Step 40: gap 28 is an outlier everywhere, and is clipped to max_delta.
  o.UpdateRow(40.0f, ignored_gradient.data(), d.data(), slots, kDim);
  ExpectRow(d, {10.0f, 10.0f, 10.0f}, "D after step 40");
  ExpectRow(last_hit, {40.0f, 40.0f, 40.0f}, "last hit after step 40");
}

TEST(OptimizersTest, AssignWritesTheGradient) { ExpectState(TwoSteps(Assign{}, {}), kG2, {}); }

// The registry: names, slot names and order (the Load/Retrieve order), default initial values, laziness.
TEST(OptimizerRegistryTest, NamesSlotsAndLaziness) {
  struct Expected {
    OptimizerParams params;
    const char* name;
    std::vector<std::string> slots;
    std::vector<float> initial;
  };
  const std::vector<Expected> all = {
      {Sgd{}, "stochastic_gradient_descent", {}, {}},
      {Adagrad{}, "adagrad", {"accumulators"}, {0.1f}},
      {AdagradMomentum{}, "adagrad_momentum", {"accumulators", "momenta"}, {0.0f, 0.0f}},
      {Adam{}, "adam", {"momenta", "velocities"}, {0.0f, 0.0f}},
      {Ftrl{}, "ftrl", {"accumulators", "linears"}, {0.1f, 0.0f}},
      {Momentum{}, "momentum", {"momenta"}, {0.0f}},
      {RmsProp{}, "rms_prop", {"ms", "mom"}, {1.0f, 0.0f}},
      {CenteredRmsProp{}, "centered_rms_prop", {"ms", "mom", "mg"}, {1.0f, 0.0f, 0.0f}},
      {Adadelta{}, "adadelta", {"accumulators", "updates"}, {0.0f, 0.0f}},
      {ProximalAdagrad{}, "proximal_adagrad", {"accumulators"}, {0.1f}},
      {Lion{}, "lion", {"momenta"}, {0.0f}},
      {BoundedAdagrad{}, "bounded_adagrad", {"accumulators"}, {0.1f}},
      {OnlineYogi{}, "online_yogi", {"vs", "linears"}, {0.1f, 0.0f}},
      {ProximalYogi{}, "proximal_yogi", {"v", "m"}, {0.1f, 0.0f}},
      {FrequencyEstimator{}, "frequency_estimator", {"last_hit_step"}, {0.0f}},
      {Assign{}, "assign", {}, {}},
      {RowWiseAdagrad{}, "rowwise_adagrad", {"row_accumulators"}, {0.0f}},
  };
  ASSERT_EQ(all.size(), std::variant_size_v<OptimizerParams>);
  for (const Expected& e : all) {
    EXPECT_STREQ(OptimizerName(e.params), e.name);
    const std::vector<SlotInfo> slots = OptimizerSlots(e.params);
    ASSERT_EQ(slots.size(), e.slots.size()) << e.name;
    for (size_t k = 0; k < slots.size(); ++k) {
      EXPECT_EQ(slots[k].name, e.slots[k]) << e.name;
      EXPECT_EQ(slots[k].default_initial_value, e.initial[k]) << e.name;
    }
    EXPECT_FALSE(OptimizerUpdatesAllRows(e.params)) << e.name << " is lazy by default";
  }
  Adam non_lazy;
  non_lazy.use_non_lazy_adam = true;
  EXPECT_TRUE(OptimizerUpdatesAllRows(non_lazy));
}

// ForEachHyperParameter pairs the schema's proto names with the struct's own members, in the schema's order, so
// what a config sets reaches the member of that name (the names written out from FtrlParameters, not the schema).
TEST(OptimizerRegistryTest, HyperParametersPairProtoNamesWithMembers) {
  Ftrl o;
  o.l1 = 1.5f;
  o.l2 = 2.5f;
  o.lr_power = -0.25f;
  o.beta = 3.5f;
  o.multiply_linear_by_lr = true;
  std::vector<std::string> names;
  std::vector<float> values;
  ForEachHyperParameter(o, [&](const char* name, auto value) {
    names.push_back(name);
    values.push_back(static_cast<float>(value));
  });
  EXPECT_EQ(names, (std::vector<std::string>{"l1", "l2", "lr_power", "beta", "multiply_linear_by_lr",
                                             "allow_zero_accumulator"}));
  EXPECT_EQ(values, (std::vector<float>{1.5f, 2.5f, -0.25f, 3.5f, 1.0f, 0.0f}));
  ForEachHyperParameter(Sgd{}, [](const char* name, auto) { ADD_FAILURE() << "Sgd has no hyper-parameter " << name; });
}

}  // namespace
}  // namespace tf_embed_ops
