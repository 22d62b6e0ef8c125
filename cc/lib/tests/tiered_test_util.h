// Helpers of the tiered-table tests (tiered_*_test.cc): a scratch directory, a shard function over real threads,
// a one-feature training step, and every optimizer of the schema.
#ifndef TF_EMBED_OPS_CC_LIB_TESTS_TIERED_TEST_UTIL_H_
#define TF_EMBED_OPS_CC_LIB_TESTS_TIERED_TEST_UTIL_H_

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "cc/lib/feature_layout.h"
#include "cc/lib/gradient_accumulation.h"
#include "cc/lib/optimizers/registry.h"
#include "cc/lib/shard.h"
#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace tiered_test {

// A fresh directory per test (removed with its files at the end).
class TempDir {
 public:
  TempDir() {
    std::string tmpl = "/tmp/tiered_table_test.XXXXXX";
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    for (const std::string& f : files_) unlink(f.c_str());
    rmdir(path_.c_str());
  }
  std::string File(const std::string& name) {
    files_.push_back(path_ + "/" + name);
    return files_.back();
  }

 private:
  std::string path_;
  std::vector<std::string> files_;
};

// [0, total) cut into `parts` ranges, each on its own thread (1: the calling thread only).
inline ShardFn Threads(int parts) {
  return [parts](int64_t total, int64_t, const std::function<void(int64_t, int64_t)>& fn) {
    std::vector<std::thread> threads;
    for (int p = 1; p < parts; ++p) threads.emplace_back(fn, total * p / parts, total * (p + 1) / parts);
    fn(0, total / parts);
    for (std::thread& t : threads) t.join();
  };
}

template <size_t... I>
std::vector<OptimizerParams> EveryOptimizer(std::index_sequence<I...>) {
  return {OptimizerParams(std::in_place_index<I>)...};
}

// One feature with one id per sample: its ids (or rows), layout and a random gradient ([ids, dim]).
struct Step {
  std::vector<int64_t> ids;
  FeatureLayout layout;
  std::vector<float> gradient;
  std::vector<GradientSource> sources;
  RowGradientPlan plan;

  Step(std::vector<int64_t> ids_in, int64_t dim, std::mt19937_64* rng) : ids(std::move(ids_in)) {
    layout.num_samples = static_cast<int64_t>(ids.size());
    layout.one_id_per_sample = true;
    layout.scale.assign(ids.size(), 1.0f);
    std::normal_distribution<float> g(0.0f, 1.0f);
    gradient.resize(ids.size() * dim);
    for (float& x : gradient) x = g(*rng);
    sources = {GradientSource{ids.data(), static_cast<int64_t>(ids.size()), &layout, gradient.data()}};
  }
  // The plan over the ids (row ids < vocabulary_size when it is given: a dense plan).
  void Build(int64_t vocabulary_size = 0) { plan.Build(&sources, vocabulary_size); }
};

// Every optimizer of the schema with its default hyper-parameters, plus the non-lazy variants.
inline std::vector<OptimizerParams> EveryOptimizer() {
  std::vector<OptimizerParams> all = EveryOptimizer(std::make_index_sequence<std::variant_size_v<OptimizerParams>>{});
  Adam non_lazy_adam;
  non_lazy_adam.use_non_lazy_adam = true;
  Lion non_lazy_lion;
  non_lazy_lion.use_non_lazy_lion = true;
  all.push_back(non_lazy_adam);
  all.push_back(non_lazy_lion);
  return all;
}

// The bytes of the file at `path` (empty when it cannot be opened).
inline std::vector<char> FileBytes(const std::string& path) {
  std::vector<char> bytes;
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return bytes;
  struct stat st;
  fstat(fd, &st);
  bytes.resize(st.st_size);
  EXPECT_EQ(pread(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  close(fd);
  return bytes;
}

// Overwrites bytes of the file at `path` from `offset` (a corruption behind the table's back).
inline void PatchFile(const std::string& path, int64_t offset, const std::vector<char>& bytes) {
  const int fd = open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, bytes.data(), bytes.size(), offset), static_cast<ssize_t>(bytes.size()));
  close(fd);
}

}  // namespace tiered_test
}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_TESTS_TIERED_TEST_UTIL_H_
