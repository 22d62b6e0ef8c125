#include "cc/lib/feature_layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cc/lib/vector_isa.h"

namespace tf_embed_ops {
namespace {

absl::Status Invalid(const std::string& label, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(label, ": ", what));
}

bool Has(LayoutParts parts, LayoutParts part) { return (static_cast<int>(parts) & static_cast<int>(part)) != 0; }

// The checks below as one branch-free pass that the compiler vectorises (the row loops' ISA, vector_isa.h): every
// batch pays it, and only a batch it refuses pays the pass that finds and names the offender.  A negative int64
// is a uint64 of at least 2^63, so one unsigned compare checks both ends of a range.

// Every ids[i] in [0, limit), for limit >= 0.
bool AllInRange(const int64_t* ids, int64_t n, int64_t limit) {
  uint64_t outside = 0;
  RunWithRowLoopIsa([ids, n, limit, &outside] {
    // Accumulated in a local: a store through the captured reference in the loop would keep it scalar.
    const uint64_t bound = static_cast<uint64_t>(limit);
    uint64_t any = 0;
    for (int64_t i = 0; i < n; ++i) any |= static_cast<uint64_t>(ids[i]) >= bound;
    outside = any;
  });
  return outside == 0;
}

// splits[1 .. num_samples] each in [0, num_ids] and each at least the one before (num_ids >= 0).
bool SplitsInOrder(const int64_t* splits, int64_t num_samples, int64_t num_ids) {
  uint64_t bad = 0;
  RunWithRowLoopIsa([splits, num_samples, num_ids, &bad] {
    const uint64_t bound = static_cast<uint64_t>(num_ids);
    uint64_t any = 0;
    for (int64_t s = 1; s <= num_samples; ++s) {
      any |= (static_cast<uint64_t>(splits[s]) > bound) | (splits[s] < splits[s - 1]);
    }
    bad = any;
  });
  return bad == 0;
}

// Ragged input: the splits are checked completely before anything reads through them.  Every entry is
// range-checked on its own (not only through its neighbours), so a check never relies on an earlier one
// having caught an overflow in a difference.
absl::Status ValidateRowSplits(const FeatureBatch& b, const std::string& label, int64_t num_samples) {
  if (b.sample_shape.size() != 1 || b.splits_or_indices_rows != num_samples + 1) {
    return Invalid(label, absl::StrCat("ragged input needs a rank-1 sample_shape [B] and B + 1 row_splits; got ",
                                       b.splits_or_indices_rows, " row_splits for sample_shape [",
                                       absl::StrJoin(b.sample_shape, ", "), "]"));
  }
  const int64_t* splits = b.splits_or_indices;
  if (splits[0] != 0) return Invalid(label, absl::StrCat("row_splits[0] = ", splits[0], ", must be 0"));
  if (splits[num_samples] != b.num_ids) {
    return Invalid(label, absl::StrCat("row_splits[", num_samples, "] = ", splits[num_samples],
                                       " must equal the number of ids, ", b.num_ids));
  }
  if (SplitsInOrder(splits, num_samples, b.num_ids)) return absl::OkStatus();
  for (int64_t s = 1; s < num_samples; ++s) {
    if (splits[s] < 0 || splits[s] > b.num_ids) {
      return Invalid(label, absl::StrCat("row_splits[", s, "] = ", splits[s], " is not in [0, ", b.num_ids,
                                         "] (the number of ids)"));
    }
    if (splits[s] < splits[s - 1]) {
      return Invalid(label, absl::StrCat("row_splits must be non-decreasing: row_splits[", s, "] = ", splits[s],
                                         " < row_splits[", s - 1, "] = ", splits[s - 1]));
    }
  }
  if (num_samples > 0 && splits[num_samples] < splits[num_samples - 1]) {
    return Invalid(
        label, absl::StrCat("row_splits must be non-decreasing: row_splits[", num_samples, "] = ", splits[num_samples],
                            " < row_splits[", num_samples - 1, "] = ", splits[num_samples - 1]));
  }
  return absl::OkStatus();
}

// Sparse input: [num_ids, rank + 1] indices, each of the first rank coordinates inside sample_shape (the last
// column is the reduced one and is not read).
absl::Status ValidateSparseIndices(const FeatureBatch& b, const std::string& label) {
  const int64_t cols = b.splits_or_indices_cols;
  const int64_t rank = static_cast<int64_t>(b.sample_shape.size());
  if (b.splits_or_indices_rows != b.num_ids || cols != rank + 1) {
    return Invalid(label,
                   absl::StrCat("sparse indices have shape [", b.splits_or_indices_rows, ", ", cols, "]; expected [",
                                b.num_ids, " (number of ids), ", rank + 1, " (rank of sample_shape + 1)]"));
  }
  for (int64_t i = 0; i < b.num_ids; ++i) {
    const int64_t* idx = b.splits_or_indices + i * cols;
    for (int64_t d = 0; d < rank; ++d) {
      if (idx[d] < 0 || idx[d] >= b.sample_shape[d]) {
        return Invalid(label, absl::StrCat("indices[", i, ", ", d, "] = ", idx[d], " is not in [0, ", b.sample_shape[d],
                                           ") (sample_shape [", absl::StrJoin(b.sample_shape, ", "), "])"));
      }
    }
  }
  return absl::OkStatus();
}

// Sparse-indices input: the output sample of every id (the row-major position of its leading coordinates).
void ComputeSparseSamples(const FeatureBatch& b, std::vector<int64_t>* sample_of) {
  const int64_t cols = b.splits_or_indices_cols;
  const int64_t rank = static_cast<int64_t>(b.sample_shape.size());
  sample_of->resize(b.num_ids);
  for (int64_t i = 0; i < b.num_ids; ++i) {
    const int64_t* idx = b.splits_or_indices + i * cols;
    int64_t position = 0;
    for (int64_t d = 0; d < rank; ++d) position = position * b.sample_shape[d] + idx[d];
    (*sample_of)[i] = position;
  }
}

// Ragged input lists its ids sample by sample, in input order, so the grouping is the row splits and the
// identity (members left empty): one pass over the samples fills everything (the general path's counting sort
// would return exactly this).  Unweighted samples sum n weights of 1.0, which in double is exactly n.
template <bool kSampleOf>
void FillRaggedSamples(const FeatureBatch& b, int64_t num_samples, Combiner combiner, FeatureLayout* out) {
  const int64_t* splits = b.splits_or_indices;
  int64_t* const sample_of = kSampleOf ? out->sample_of.data() : nullptr;
  float* const scale = out->scale.data();
  if (out->unit_scale) {
    if constexpr (kSampleOf) {
      for (int64_t s = 0; s < num_samples; ++s) std::fill(sample_of + splits[s], sample_of + splits[s + 1], s);
    }
    return;
  }
  for (int64_t s = 0; s < num_samples; ++s) {
    const int64_t first = splits[s], last = splits[s + 1];
    if constexpr (kSampleOf) std::fill(sample_of + first, sample_of + last, s);
    if (b.num_weights == 0) {
      const double n = static_cast<double>(last - first);
      std::fill(scale + first, scale + last, 1.0f * InverseNorm(combiner, n, n));
      continue;
    }
    double sum_w = 0.0, sum_w2 = 0.0;
    for (int64_t i = first; i < last; ++i) {
      const double w = b.weights[i];
      sum_w += w;
      sum_w2 += w * w;
    }
    const float inv = InverseNorm(combiner, sum_w, sum_w2);
    for (int64_t i = first; i < last; ++i) scale[i] = b.weights[i] * inv;
  }
}

void BuildRaggedLayout(const FeatureBatch& b, int64_t num_samples, Combiner combiner, LayoutParts parts,
                       FeatureLayout* out) {
  out->members_in_input_order = true;
  out->members.clear();
  // Unweighted sums: every factor is 1 whatever the bag's size.
  out->unit_scale = b.num_weights == 0 && combiner == Combiner::kSum;
  if (Has(parts, LayoutParts::kGrouping)) {
    out->member_offsets.assign(b.splits_or_indices, b.splits_or_indices + num_samples + 1);
  } else {
    out->member_offsets.clear();
  }
  if (out->unit_scale) {
    out->scale.clear();
  } else {
    out->scale.resize(b.num_ids);
  }
  if (Has(parts, LayoutParts::kSampleOf)) {
    out->sample_of.resize(b.num_ids);
    FillRaggedSamples<true>(b, num_samples, combiner, out);
  } else {
    out->sample_of.clear();
    FillRaggedSamples<false>(b, num_samples, combiner, out);
  }
}

}  // namespace

absl::Status ValidateFeatureBatch(const FeatureBatch& b, const std::string& label, int64_t* num_samples) {
  bool empty = false;
  for (size_t d = 0; d < b.sample_shape.size(); ++d) {
    if (b.sample_shape[d] < 0) {
      return Invalid(label, absl::StrCat("sample_shape[", d, "] = ", b.sample_shape[d], " is negative"));
    }
    empty = empty || b.sample_shape[d] == 0;
  }
  int64_t samples = empty ? 0 : 1;
  for (size_t d = 0; d < b.sample_shape.size() && !empty; ++d) {
    // samples <= kMaxSamples < 2^31 here, so the division test is exact and the product cannot overflow.
    if (b.sample_shape[d] > kMaxSamples / samples) {
      return Invalid(label, absl::StrCat("sample_shape [", absl::StrJoin(b.sample_shape, ", "), "] has more than ",
                                         kMaxSamples, " samples (sample_shape[", d, "] = ", b.sample_shape[d],
                                         "); at most that many per feature and call are supported"));
    }
    samples *= b.sample_shape[d];
  }
  if (b.num_weights != 0 && b.num_weights != b.num_ids) {
    return Invalid(label, absl::StrCat("has ", b.num_weights, " weights for ", b.num_ids,
                                       " ids; give one weight per id or none (all ones)"));
  }
  switch (b.splits_or_indices_rank) {
    case 0:
      if (b.num_ids != samples) {
        return Invalid(label, absl::StrCat("dense input (empty sample_indices_or_row_splits) has ", b.num_ids,
                                           " ids but sample_shape [", absl::StrJoin(b.sample_shape, ", "), "] has ",
                                           samples, " samples; they must be equal"));
      }
      break;
    case 1:
      if (auto s = ValidateRowSplits(b, label, samples); !s.ok()) return s;
      break;
    case 2:
      if (auto s = ValidateSparseIndices(b, label); !s.ok()) return s;
      break;
    default:
      return Invalid(label, absl::StrCat("sample_indices_or_row_splits must be empty, rank 1 (row_splits) or rank 2 "
                                         "(sparse indices); got rank ",
                                         b.splits_or_indices_rank));
  }
  *num_samples = samples;
  return absl::OkStatus();
}

void BuildValidatedFeatureLayout(const FeatureBatch& b, int64_t num_samples, Combiner combiner, FeatureLayout* out,
                                 LayoutParts parts) {
  out->num_samples = num_samples;
  out->one_id_per_sample = b.splits_or_indices_rank == 0;
  out->members_in_input_order = false;
  out->unit_scale = false;

  if (b.splits_or_indices_rank == 0) {
    // Dense input: sample i holds exactly id i, so the grouping is the identity (left implicit) and the
    // combiner factor is w_i / norm(w_i) (1 for unweighted input whatever the combiner).  Same values as the
    // general path below.
    out->sample_of.clear();
    out->member_offsets.clear();
    out->members.clear();
    if (b.num_weights == 0) {  // w / norm(w) with w = 1: 1 whatever the combiner
      out->unit_scale = true;
      out->scale.clear();
      return;
    }
    out->scale.resize(b.num_ids);
    for (int64_t i = 0; i < b.num_ids; ++i) {
      const double w = b.weights[i];
      out->scale[i] = static_cast<float>(w) * InverseNorm(combiner, w, w * w);
    }
    return;
  }
  if (b.splits_or_indices_rank == 1) {
    BuildRaggedLayout(b, num_samples, combiner, parts, out);
    return;
  }

  // Sparse indices may come in any order: group ids by sample with a stable counting sort, so each group keeps
  // input order (the summation order of the forward pass is then fixed by the input alone).
  ComputeSparseSamples(b, &out->sample_of);
  out->member_offsets.assign(num_samples + 1, 0);
  for (int64_t i = 0; i < b.num_ids; ++i) ++out->member_offsets[out->sample_of[i] + 1];
  for (int64_t s = 0; s < num_samples; ++s) out->member_offsets[s + 1] += out->member_offsets[s];
  out->members.resize(b.num_ids);
  out->cursor.assign(out->member_offsets.begin(), out->member_offsets.end() - 1);
  for (int64_t i = 0; i < b.num_ids; ++i) out->members[out->cursor[out->sample_of[i]]++] = i;

  out->scale.resize(b.num_ids);
  for (int64_t s = 0; s < num_samples; ++s) {
    double sum_w = 0.0, sum_w2 = 0.0;
    for (int64_t k = out->member_offsets[s]; k < out->member_offsets[s + 1]; ++k) {
      const double w = b.num_weights ? b.weights[out->members[k]] : 1.0;
      sum_w += w;
      sum_w2 += w * w;
    }
    const float inv = InverseNorm(combiner, sum_w, sum_w2);
    for (int64_t k = out->member_offsets[s]; k < out->member_offsets[s + 1]; ++k) {
      const int64_t i = out->members[k];
      out->scale[i] = (b.num_weights ? b.weights[i] : 1.0f) * inv;
    }
  }
}

absl::Status BuildFeatureLayout(const FeatureBatch& b, Combiner combiner, const std::string& label,
                                FeatureLayout* out) {
  int64_t num_samples = 0;
  if (auto s = ValidateFeatureBatch(b, label, &num_samples); !s.ok()) return s;
  BuildValidatedFeatureLayout(b, num_samples, combiner, out);
  return absl::OkStatus();
}

absl::Status ValidateIds(const int64_t* ids, int64_t num_ids, int64_t vocabulary_size, const std::string& label,
                         const std::string& table_name) {
  if (vocabulary_size >= 0 && AllInRange(ids, num_ids, vocabulary_size)) return absl::OkStatus();
  for (int64_t i = 0; i < num_ids; ++i) {
    if (ids[i] < 0 || ids[i] >= vocabulary_size) {
      return Invalid(label, absl::StrCat("ids[", i, "] = ", ids[i], " is not in [0, ", vocabulary_size,
                                         ") (vocabulary_size of table '", table_name,
                                         "'); raise the table's vocabulary_size, or hash the ids into range "
                                         "(e.g. tf.math.floormod or tf.strings.to_hash_bucket_fast), or use "
                                         "te.DynamicTableConfig, whose rows are created for new ids"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tf_embed_ops
