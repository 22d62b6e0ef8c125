// cc/lib/feature_layout: where each id of a feature lands (dense, ragged and sparse input), its combiner factor
// w_i / norm_s, the grouping by sample, and the rejection of malformed input with an InvalidArgument naming the
// feature and the offending value (docs/semantics.md, "Combiners" and "Tables, features and input forms").
#include "cc/lib/feature_layout.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace {

// gtest without gmock: the message must contain `part`.
void ExpectContains(const absl::Status& s, const std::string& part) {
  EXPECT_NE(std::string(s.message()).find(part), std::string::npos) << "\"" << part << "\" not in: " << s;
}

// Owns the buffers a FeatureBatch points into.
struct Input {
  std::vector<int64_t> splits_or_indices;
  int rank = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<int64_t> ids;
  std::vector<float> weights;
  std::vector<int64_t> sample_shape;

  FeatureBatch Batch() const {
    FeatureBatch b;
    b.splits_or_indices = splits_or_indices.data();
    b.splits_or_indices_rank = rank;
    b.splits_or_indices_rows = rows;
    b.splits_or_indices_cols = cols;
    b.ids = ids.data();
    b.num_ids = static_cast<int64_t>(ids.size());
    b.weights = weights.empty() ? nullptr : weights.data();
    b.num_weights = static_cast<int64_t>(weights.size());
    b.sample_shape = sample_shape;
    return b;
  }
};

Input Dense(std::vector<int64_t> ids, std::vector<float> weights = {}) {
  Input in;
  in.sample_shape = {static_cast<int64_t>(ids.size())};
  in.ids = std::move(ids);
  in.weights = std::move(weights);
  return in;
}

Input Ragged(std::vector<int64_t> splits, std::vector<int64_t> ids, std::vector<float> weights = {}) {
  Input in;
  in.rank = 1;
  in.rows = static_cast<int64_t>(splits.size());
  in.sample_shape = {in.rows - 1};
  in.splits_or_indices = std::move(splits);
  in.ids = std::move(ids);
  in.weights = std::move(weights);
  return in;
}

Input Sparse(std::vector<int64_t> indices, int64_t cols, std::vector<int64_t> sample_shape, std::vector<int64_t> ids) {
  Input in;
  in.rank = 2;
  in.cols = cols;
  in.rows = static_cast<int64_t>(indices.size()) / cols;
  in.splits_or_indices = std::move(indices);
  in.sample_shape = std::move(sample_shape);
  in.ids = std::move(ids);
  return in;
}

FeatureLayout Build(const Input& in, Combiner combiner) {
  FeatureLayout layout;
  const absl::Status s = BuildFeatureLayout(in.Batch(), combiner, "feature 'f'", &layout);
  EXPECT_TRUE(s.ok()) << s;
  return layout;
}

// The error of a malformed input: InvalidArgument, naming the feature and containing every `parts`.
void ExpectInvalid(const Input& in, const std::vector<std::string>& parts) {
  FeatureLayout layout;
  const absl::Status s = BuildFeatureLayout(in.Batch(), Combiner::kSum, "feature 'f'", &layout);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  ExpectContains(s, "feature 'f'");
  for (const std::string& part : parts) ExpectContains(s, part);
}

TEST(ParseCombinerTest, AcceptsExactlyTheThreeSpellings) {
  Combiner c;
  ASSERT_TRUE(ParseCombiner("sum", &c));
  EXPECT_EQ(c, Combiner::kSum);
  ASSERT_TRUE(ParseCombiner("mean", &c));
  EXPECT_EQ(c, Combiner::kMean);
  ASSERT_TRUE(ParseCombiner("sqrtn", &c));
  EXPECT_EQ(c, Combiner::kSqrtn);
  for (const char* bad : {"", "Sum", "avg", "sqrt_n", "mean "}) EXPECT_FALSE(ParseCombiner(bad, &c)) << bad;
}

TEST(InverseNormTest, ZeroNormGivesZero) {
  EXPECT_EQ(InverseNorm(Combiner::kSum, 0.0, 0.0), 1.0f);
  EXPECT_EQ(InverseNorm(Combiner::kMean, 4.0, 10.0), 0.25f);
  EXPECT_EQ(InverseNorm(Combiner::kSqrtn, 4.0, 16.0), 0.25f);
  EXPECT_EQ(InverseNorm(Combiner::kMean, 0.0, 2.0), 0.0f);  // weights 1 and -1
  EXPECT_EQ(InverseNorm(Combiner::kSqrtn, 0.0, 0.0), 0.0f);
}

TEST(FeatureLayoutTest, DenseInputIsOneIdPerSample) {
  const Input in = Dense({7, 7, 2}, {2.0f, -0.5f, 0.0f});
  const FeatureLayout sum = Build(in, Combiner::kSum);
  EXPECT_TRUE(sum.one_id_per_sample);
  EXPECT_EQ(sum.num_samples, 3);
  EXPECT_TRUE(sum.sample_of.empty());
  EXPECT_TRUE(sum.members.empty());
  EXPECT_EQ(sum.scale, (std::vector<float>{2.0f, -0.5f, 0.0f}));
  // mean: w / w (0 where w = 0); sqrtn: w / |w|.
  EXPECT_EQ(Build(in, Combiner::kMean).scale, (std::vector<float>{1.0f, 1.0f, 0.0f}));
  EXPECT_EQ(Build(in, Combiner::kSqrtn).scale, (std::vector<float>{1.0f, -1.0f, 0.0f}));
  EXPECT_FALSE(sum.unit_scale);
  // Unweighted: every factor is 1 whatever the combiner, and scale is left empty.
  for (const Combiner combiner : {Combiner::kSum, Combiner::kMean, Combiner::kSqrtn}) {
    const FeatureLayout unweighted = Build(Dense({1, 2}), combiner);
    EXPECT_TRUE(unweighted.unit_scale);
    EXPECT_TRUE(unweighted.scale.empty());
    EXPECT_EQ(unweighted.Scale(0), 1.0f);
    EXPECT_EQ(unweighted.Scale(1), 1.0f);
  }
}

TEST(FeatureLayoutTest, RaggedRowsWithAnEmptyRow) {
  // Rows {0: ids 4, 9}, {1: empty}, {2: ids 4, 1, 3}, weights 1, 3 | - | 2, 2, 1.
  const Input in = Ragged({0, 2, 2, 5}, {4, 9, 4, 1, 3}, {1.0f, 3.0f, 2.0f, 2.0f, 1.0f});
  const FeatureLayout sum = Build(in, Combiner::kSum);
  EXPECT_FALSE(sum.one_id_per_sample);
  EXPECT_EQ(sum.num_samples, 3);
  EXPECT_EQ(sum.sample_of, (std::vector<int64_t>{0, 0, 2, 2, 2}));
  EXPECT_EQ(sum.member_offsets, (std::vector<int64_t>{0, 2, 2, 5}));
  // Grouped in input order already: members is the identity, left implicit.
  EXPECT_TRUE(sum.members_in_input_order);
  EXPECT_TRUE(sum.members.empty());
  for (int64_t k = 0; k < 5; ++k) EXPECT_EQ(sum.Member(k), k);
  EXPECT_EQ(sum.scale, (std::vector<float>{1.0f, 3.0f, 2.0f, 2.0f, 1.0f}));
  // mean: row 0 sums to 4, row 2 to 5.
  EXPECT_EQ(Build(in, Combiner::kMean).scale, (std::vector<float>{0.25f, 0.75f, 0.4f, 0.4f, 0.2f}));
  // sqrtn: sqrt(1 + 9) and sqrt(4 + 4 + 1) = 3.
  const float inv10 = static_cast<float>(1.0 / std::sqrt(10.0));
  const float third = static_cast<float>(1.0 / 3.0);
  EXPECT_EQ(Build(in, Combiner::kSqrtn).scale,
            (std::vector<float>{1.0f * inv10, 3.0f * inv10, 2.0f * third, 2.0f * third, 1.0f * third}));
}

TEST(FeatureLayoutTest, UnweightedBagsHaveUnitFactorsOnlyUnderTheSumCombiner) {
  const Input in = Ragged({0, 2, 2, 5}, {4, 9, 4, 1, 3});
  const FeatureLayout sum = Build(in, Combiner::kSum);
  EXPECT_TRUE(sum.unit_scale);
  EXPECT_TRUE(sum.scale.empty());
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(sum.Scale(i), 1.0f);
  const FeatureLayout mean = Build(in, Combiner::kMean);
  EXPECT_FALSE(mean.unit_scale);
  EXPECT_EQ(mean.scale, (std::vector<float>{0.5f, 0.5f, 1.0f / 3.0f, 1.0f / 3.0f, 1.0f / 3.0f}));
  // Weighted sums keep their weights.
  EXPECT_FALSE(Build(Ragged({0, 1}, {4}, {2.0f}), Combiner::kSum).unit_scale);
}

TEST(FeatureLayoutTest, MeanOfWeightsSummingToZeroGivesZeroFactors) {
  const FeatureLayout layout = Build(Ragged({0, 2}, {1, 2}, {1.0f, -1.0f}), Combiner::kMean);
  EXPECT_EQ(layout.scale, (std::vector<float>{0.0f, 0.0f}));
}

TEST(FeatureLayoutTest, SparseIndicesMapToRowMajorSamplesAndKeepInputOrderWithinASample) {
  // sample_shape [2, 3]; the last index column is the reduced one.  Ids arrive out of sample order.
  const Input in = Sparse({1, 2, 0,  //
                           0, 1, 0,  //
                           1, 2, 1,  //
                           0, 1, 7},
                          3, {2, 3}, {10, 11, 12, 13});
  const FeatureLayout layout = Build(in, Combiner::kMean);
  EXPECT_EQ(layout.num_samples, 6);
  EXPECT_EQ(layout.sample_of, (std::vector<int64_t>{5, 1, 5, 1}));
  EXPECT_EQ(layout.member_offsets, (std::vector<int64_t>{0, 0, 2, 2, 2, 2, 4}));
  EXPECT_FALSE(layout.members_in_input_order);
  EXPECT_EQ(layout.members, (std::vector<int64_t>{1, 3, 0, 2}));
  EXPECT_EQ(layout.Member(0), 1);
  EXPECT_EQ(layout.scale, (std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f}));
}

TEST(FeatureLayoutTest, EmptyInput) {
  const FeatureLayout ragged = Build(Ragged({0, 0, 0}, {}), Combiner::kMean);
  EXPECT_EQ(ragged.num_samples, 2);
  EXPECT_EQ(ragged.member_offsets, (std::vector<int64_t>{0, 0, 0}));
  EXPECT_TRUE(ragged.scale.empty());
  const FeatureLayout dense = Build(Dense({}), Combiner::kSum);
  EXPECT_EQ(dense.num_samples, 0);
}

TEST(FeatureLayoutTest, AReusedLayoutHoldsOnlyTheLastBatch) {
  FeatureLayout layout;
  ASSERT_TRUE(
      BuildFeatureLayout(Ragged({0, 3, 4}, {1, 2, 3, 4}).Batch(), Combiner::kMean, "feature 'f'", &layout).ok());
  ASSERT_TRUE(BuildFeatureLayout(Dense({5, 6}).Batch(), Combiner::kMean, "feature 'f'", &layout).ok());
  EXPECT_TRUE(layout.one_id_per_sample);
  EXPECT_TRUE(layout.sample_of.empty());
  EXPECT_TRUE(layout.unit_scale && layout.scale.empty());
  ASSERT_TRUE(BuildFeatureLayout(Ragged({0, 1, 2}, {5, 6}).Batch(), Combiner::kSum, "feature 'f'", &layout).ok());
  EXPECT_FALSE(layout.one_id_per_sample);
  EXPECT_EQ(layout.member_offsets, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_TRUE(layout.members_in_input_order);
  EXPECT_TRUE(layout.members.empty());
  EXPECT_EQ(layout.sample_of, (std::vector<int64_t>{0, 1}));
  // Sparse input after ragged: its own members, not the identity.
  ASSERT_TRUE(
      BuildFeatureLayout(Sparse({1, 0, 0, 0}, 2, {2}, {7, 8}).Batch(), Combiner::kSum, "feature 'f'", &layout).ok());
  EXPECT_FALSE(layout.members_in_input_order);
  EXPECT_FALSE(layout.unit_scale);
  EXPECT_EQ(layout.members, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(layout.scale, (std::vector<float>{1.0f, 1.0f}));
}

// A kernel builds only what it reads (the forward pass the grouping, the update each id's sample); the scale is
// always built, and is the same either way.
TEST(FeatureLayoutTest, PartsLeaveOutWhatTheKernelDoesNotRead) {
  for (const Combiner combiner : {Combiner::kSum, Combiner::kMean, Combiner::kSqrtn}) {
    for (const Input& in :
         {Ragged({0, 2, 2, 5}, {4, 9, 4, 1, 3}), Ragged({0, 2, 2, 5}, {4, 9, 4, 1, 3}, {1, 3, 2, 2, 1})}) {
      const FeatureLayout all = Build(in, combiner);
      FeatureLayout grouping, sample_of;
      BuildValidatedFeatureLayout(in.Batch(), 3, combiner, &grouping, LayoutParts::kGrouping);
      BuildValidatedFeatureLayout(in.Batch(), 3, combiner, &sample_of, LayoutParts::kSampleOf);
      EXPECT_EQ(grouping.member_offsets, all.member_offsets);
      EXPECT_TRUE(grouping.sample_of.empty());
      EXPECT_EQ(sample_of.sample_of, all.sample_of);
      EXPECT_TRUE(sample_of.member_offsets.empty());
      EXPECT_EQ(grouping.scale, all.scale);
      EXPECT_EQ(sample_of.scale, all.scale);
    }
  }
  // Sparse indices build both: the grouping is sorted by each id's sample.
  FeatureLayout sparse;
  BuildValidatedFeatureLayout(Sparse({1, 0, 0, 0}, 2, {2}, {7, 8}).Batch(), 2, Combiner::kSum, &sparse,
                              LayoutParts::kGrouping);
  EXPECT_EQ(sparse.sample_of, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(sparse.members, (std::vector<int64_t>{1, 0}));
}

// --- malformed input --------------------------------------------------------------------------------------

TEST(FeatureLayoutErrorsTest, UnsupportedRank) {
  Input in = Dense({1});
  in.rank = 3;
  ExpectInvalid(in, {"got rank 3"});
}

TEST(FeatureLayoutErrorsTest, DenseIdCountMustMatchTheSamples) {
  Input in = Dense({1, 2, 3});
  in.sample_shape = {2};
  ExpectInvalid(in, {"has 3 ids", "[2]", "2 samples"});
}

TEST(FeatureLayoutErrorsTest, NegativeSampleShape) {
  Input in = Dense({});
  in.sample_shape = {2, -1};
  ExpectInvalid(in, {"sample_shape[1] = -1"});
}

TEST(FeatureLayoutErrorsTest, WeightCountMustMatchTheIds) {
  ExpectInvalid(Ragged({0, 2}, {1, 2}, {1.0f}), {"has 1 weights for 2 ids"});
}

TEST(FeatureLayoutErrorsTest, RaggedNeedsOneMoreSplitThanSamples) {
  Input in = Ragged({0, 1, 2}, {1, 2});
  in.sample_shape = {3};
  ExpectInvalid(in, {"3 row_splits", "[3]"});
}

TEST(FeatureLayoutErrorsTest, RaggedNeedsARankOneSampleShape) {
  Input in = Ragged({0, 1, 2}, {1, 2});
  in.sample_shape = {1, 2};
  ExpectInvalid(in, {"rank-1 sample_shape", "[1, 2]"});
}

TEST(FeatureLayoutErrorsTest, RaggedFirstSplitMustBeZero) {
  ExpectInvalid(Ragged({1, 2, 2}, {1, 2}), {"row_splits[0] = 1"});
}

TEST(FeatureLayoutErrorsTest, RaggedLastSplitMustBeTheIdCount) {
  ExpectInvalid(Ragged({0, 1, 3}, {1, 2}), {"row_splits[2] = 3", "number of ids, 2"});
}

TEST(FeatureLayoutErrorsTest, RaggedSplitsMustNotDecrease) {
  ExpectInvalid(Ragged({0, 2, 1, 3}, {1, 2, 3}), {"non-decreasing", "row_splits[2] = 1"});
  ExpectInvalid(Ragged({0, -1, 0}, {}), {"row_splits[1] = -1"});
}

// A middle split beyond the number of ids (first and last splits valid): the layout must reject it before
// writing per-id entries for positions that do not exist.
// Before the splits were validated in full, both wrote past the end of FeatureLayout::sample_of (SIGSEGV, or
// SIGABRT from the corrupted heap): regression tests.
TEST(FeatureLayoutErrorsTest, RaggedMiddleSplitBeyondTheIdsIsRejectedBeforeAnyWrite) {
  ExpectInvalid(Ragged({0, int64_t{1} << 40, int64_t{1} << 40, 4}, {1, 2, 3, 4}), {"row_splits"});
}

TEST(FeatureLayoutErrorsTest, RaggedSplitsBeyondTheIdsThenBackAreRejected) {
  ExpectInvalid(Ragged({0, 6, 6, 4}, {1, 2, 3, 4}), {"row_splits"});
}

// The splits are checked a vector at a time first: an offender in any lane, or in the loop's scalar tail, is found.
TEST(FeatureLayoutErrorsTest, EverySplitOfALongBatchIsChecked) {
  constexpr int64_t kSamples = 203;  // not a multiple of any vector width
  for (int64_t at = 1; at < kSamples; ++at) {
    std::vector<int64_t> splits(kSamples + 1);
    for (int64_t s = 0; s <= kSamples; ++s) splits[s] = s;
    Input decreasing = Ragged(splits, std::vector<int64_t>(kSamples, 0));
    decreasing.splits_or_indices[at] = at - 2;
    ExpectInvalid(decreasing, {absl::StrCat("row_splits[", at, "] = ", at - 2)});
    Input beyond = Ragged(splits, std::vector<int64_t>(kSamples, 0));
    beyond.splits_or_indices[at] = std::numeric_limits<int64_t>::max();
    ExpectInvalid(beyond, {absl::StrCat("row_splits[", at, "] = ", std::numeric_limits<int64_t>::max())});
  }
}

TEST(FeatureLayoutErrorsTest, SparseIndicesNeedOneRowPerIdAndRankPlusOneColumns) {
  ExpectInvalid(Sparse({0, 0, 1, 0}, 2, {2}, {1}), {"shape [2, 2]", "expected [1 (number of ids), 2"});
  ExpectInvalid(Sparse({0, 0, 0, 1, 0, 0}, 3, {2}, {1, 2}), {"shape [2, 3]", "expected [2 (number of ids), 2"});
}

TEST(FeatureLayoutErrorsTest, SparseCoordinatesMustLieInsideTheSampleShape) {
  ExpectInvalid(Sparse({0, 0, 0, 1, 3, 0}, 3, {2, 3}, {1, 2}), {"indices[1, 1] = 3", "not in [0, 3)", "[2, 3]"});
  ExpectInvalid(Sparse({-1, 0}, 2, {2}, {1}), {"indices[0, 0] = -1"});
}

// A sample shape whose element count overflows int64 must be rejected, not used to size or index the grouping.
// Before the sample shape was overflow-checked, the product wrapped around and the grouping was written out of
// bounds (SIGSEGV): a regression test.
TEST(FeatureLayoutErrorsTest, SampleShapeWhoseSizeOverflowsIsRejected) {
  ExpectInvalid(Sparse({1, 1, 0}, 3, {int64_t{1} << 32, int64_t{1} << 32}, {1}), {"sample_shape"});
}

// --- id range ---------------------------------------------------------------------------------------------

TEST(ValidateIdsTest, FirstAndLastValidIdsAreAccepted) {
  const std::vector<int64_t> ids = {0, 9, 0, 9};
  EXPECT_TRUE(ValidateIds(ids.data(), 4, 10, "feature 'f'", "t").ok());
}

TEST(ValidateIdsTest, OnePastEitherEndIsRejectedWithItsPosition) {
  for (const auto& [ids, expected] : std::vector<std::pair<std::vector<int64_t>, std::string>>{
           {{0, 10, 3}, "ids[1] = 10 is not in [0, 10)"},
           {{5, 5, -1}, "ids[2] = -1 is not in [0, 10)"},
           {{std::numeric_limits<int64_t>::min()}, "ids[0] = -9223372036854775808"}}) {
    const absl::Status s = ValidateIds(ids.data(), static_cast<int64_t>(ids.size()), 10, "feature 'f'", "user");
    ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    ExpectContains(s, expected);
    ExpectContains(s, "feature 'f'");
    ExpectContains(s, "table 'user'");
  }
}

// The ids are checked a vector at a time first: an offender in any lane, or in the loop's scalar tail, is found.
TEST(ValidateIdsTest, EveryIdOfALongBatchIsChecked) {
  constexpr int64_t kIds = 203;  // not a multiple of any vector width
  for (const int64_t bad :
       {int64_t{10}, int64_t{-1}, std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()}) {
    for (int64_t at = 0; at < kIds; ++at) {
      std::vector<int64_t> ids(kIds, 9);
      ids[at] = bad;
      const absl::Status s = ValidateIds(ids.data(), kIds, 10, "feature 'f'", "user");
      ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "id " << bad << " at " << at;
      ExpectContains(s, absl::StrCat("ids[", at, "] = ", bad, " is not in [0, 10)"));
    }
  }
  const std::vector<int64_t> ids(kIds, 9);
  EXPECT_TRUE(ValidateIds(ids.data(), kIds, 10, "feature 'f'", "user").ok());
  EXPECT_EQ(ValidateIds(ids.data(), kIds, 9, "feature 'f'", "user").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tf_embed_ops
