// Helpers of the tests that build features by hand (row_pipeline_test.cc, embedding_forward_test.cc,
// dynamic_table_update_test.cc): a feature's ids, layout and gradient in one value.
#ifndef TF_EMBED_OPS_CC_LIB_TESTS_FEATURE_TEST_UTIL_H_
#define TF_EMBED_OPS_CC_LIB_TESTS_FEATURE_TEST_UTIL_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "cc/lib/combiner.h"
#include "cc/lib/feature_layout.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace testing_util {

// Owns a feature's ids, layout and gradient.
struct Feature {
  std::vector<int64_t> ids;
  FeatureLayout layout;
  std::vector<float> gradient;  // [num_samples, dim]
};

inline Feature DenseFeature(std::vector<int64_t> ids, std::vector<float> gradient) {
  Feature f;
  f.ids = std::move(ids);
  f.layout.num_samples = static_cast<int64_t>(f.ids.size());
  f.layout.one_id_per_sample = true;
  f.layout.scale.assign(f.ids.size(), 1.0f);
  f.gradient = std::move(gradient);
  return f;
}

inline Feature RaggedFeature(std::vector<int64_t> splits, std::vector<int64_t> ids, std::vector<float> weights,
                             Combiner combiner, std::vector<float> gradient) {
  Feature f;
  f.ids = std::move(ids);
  FeatureBatch b;
  b.splits_or_indices = splits.data();
  b.splits_or_indices_rank = 1;
  b.splits_or_indices_rows = static_cast<int64_t>(splits.size());
  b.ids = f.ids.data();
  b.num_ids = static_cast<int64_t>(f.ids.size());
  b.weights = weights.empty() ? nullptr : weights.data();
  b.num_weights = static_cast<int64_t>(weights.size());
  b.sample_shape = {b.splits_or_indices_rows - 1};
  const absl::Status s = BuildFeatureLayout(b, combiner, "feature", &f.layout);
  EXPECT_TRUE(s.ok()) << s;
  f.gradient = std::move(gradient);
  return f;
}

}  // namespace testing_util
}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_TESTS_FEATURE_TEST_UTIL_H_
