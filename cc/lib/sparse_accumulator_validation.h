// Validation of one sparse gradient against an accumulator's shape and held state (TensorFlow-free).
//
// The checks and their messages are TensorFlow's (sparse_conditional_accumulator.h, in its order), plus one of ours:
// negative indices are rejected (TensorFlow accepts them).  The first failing check wins.  Nothing here
// depends on the step: the caller validates before the stale check, so a malformed gradient is an error
// even when it is stale (TensorFlow drops stale gradients unvalidated).
#ifndef TF_EMBED_OPS_CC_LIB_SPARSE_ACCUMULATOR_VALIDATION_H_
#define TF_EMBED_OPS_CC_LIB_SPARSE_ACCUMULATOR_VALIDATION_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tf_embed_ops {

// The accumulator's partial shape.  An unknown rank and rank 0 both impose nothing; -1 is an
// unknown dimension.
struct AccumulatorShape {
  bool known_rank = false;
  std::vector<int64_t> dims;

  // The rank the checks use: 0 when the rank is unknown.
  int64_t CheckedRank() const { return known_rank ? static_cast<int64_t>(dims.size()) : 0; }
  bool KnowsDim0() const { return CheckedRank() > 0 && dims[0] != -1; }
};

// One incoming gradient, as views over the op's inputs.
struct SparseGradientView {
  std::vector<int64_t> indices_dims;  // must be a vector
  const int64_t* indices = nullptr;   // indices_dims[0] entries when it is a vector
  std::vector<int64_t> values_dims;
  bool has_known_shape = false;
  const int64_t* gradient_shape = nullptr;  // gradient_shape_size entries; read only when has_known_shape
  int64_t gradient_shape_size = 0;
};

// Returns the InvalidArgument message for `gradient`, or "" when it is acceptable.  `held_values_dims` is the
// shape of the held values (rank and dims 1.. are fixed by the first gradient since the last take), or null
// when nothing is held.
std::string ValidateSparseGradient(const AccumulatorShape& shape, const SparseGradientView& gradient,
                                   const std::vector<int64_t>* held_values_dims);

// The dense shape a take reports (docs/sparse_accumulator.md, "Semantics"): dim 0 of the accumulator shape when
// known (else -1), then the
// held values' dims 1..
std::vector<int64_t> TakeOutputShape(const AccumulatorShape& shape, const std::vector<int64_t>& held_values_dims);

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_SPARSE_ACCUMULATOR_VALIDATION_H_
