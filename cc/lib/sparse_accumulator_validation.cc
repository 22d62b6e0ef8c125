#include "cc/lib/sparse_accumulator_validation.h"

#include <sstream>

namespace tf_embed_ops {
namespace {

std::string DimsString(const std::vector<int64_t>& dims) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < dims.size(); ++i) out << (i ? "," : "") << dims[i];
  out << "]";
  return out.str();
}

template <typename... Parts>
std::string Cat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

// Step 8a: the declared dense shape against the accumulator's known dims.  -1 is not a wildcard here.
std::string CheckGradientShape(const AccumulatorShape& shape, const SparseGradientView& g) {
  const int64_t rank = shape.CheckedRank();
  if (rank > g.gradient_shape_size) {
    return Cat("Shape mismatch: expected shape rank at least ", rank, ", got ", g.gradient_shape_size);
  }
  for (int64_t i = 0; i < rank; ++i) {
    if (shape.dims[i] != -1 && shape.dims[i] != g.gradient_shape[i]) {
      return Cat("Shape mismatch: expected shape dim ", i, " to be ", shape.dims[i], ", got ", g.gradient_shape[i]);
    }
  }
  return "";
}

// Step 8b, with our negative-index rule folded into the same pass so the first bad position is reported.
std::string CheckIndices(const AccumulatorShape& shape, const SparseGradientView& g) {
  const int64_t nnz = g.indices_dims[0];
  const bool bounded = shape.KnowsDim0();
  for (int64_t i = 0; i < nnz; ++i) {
    const int64_t index = g.indices[i];
    if (index < 0) {
      return Cat("gradient_indices[", i, "] = ", index, " is negative; indices must be in [0, ",
                 bounded ? std::to_string(shape.dims[0]) : std::string("inf"), ")");
    }
    if (bounded && index >= shape.dims[0]) {
      return Cat("Shape mismatch: index of slice ", i, " exceeded limits of shape; index is ", index, " exceeded ",
                 shape.dims[0]);
    }
  }
  return "";
}

// Step 8c: values against the held gradient when there is one, else against the accumulator shape.
std::string CheckValues(const AccumulatorShape& shape, const SparseGradientView& g, const std::vector<int64_t>* held) {
  const int64_t values_rank = static_cast<int64_t>(g.values_dims.size());
  if (held != nullptr) {
    const int64_t held_rank = static_cast<int64_t>(held->size());
    if (held_rank != values_rank) {
      return Cat("Shape mismatch: expected values rank ", held_rank, ", got ", values_rank);
    }
    for (int64_t i = 1; i < held_rank; ++i) {
      if ((*held)[i] != g.values_dims[i]) {
        return Cat("Shape mismatch: expected values dim ", i, " to be ", (*held)[i], ", got ", g.values_dims[i]);
      }
    }
    return "";
  }
  const int64_t rank = shape.CheckedRank();
  if (rank > values_rank) {
    return Cat("Shape mismatch: expected values rank at least ", rank, ", got ", values_rank);
  }
  for (int64_t i = 1; i < rank; ++i) {
    if (shape.dims[i] != -1 && shape.dims[i] != g.values_dims[i]) {
      return Cat("Shape mismatch: expected values dim ", i, " to be ", shape.dims[i], ", got ", g.values_dims[i]);
    }
  }
  return "";
}

}  // namespace

std::string ValidateSparseGradient(const AccumulatorShape& shape, const SparseGradientView& gradient,
                                   const std::vector<int64_t>* held_values_dims) {
  if (gradient.indices_dims.size() != 1) {
    return "Input indices should be vector but received shape: " + DimsString(gradient.indices_dims);
  }
  if (gradient.values_dims.empty()) return "Values cannot be 0-dimensional.";
  const int64_t nnz = gradient.indices_dims[0];
  if (gradient.values_dims[0] != nnz) {
    return Cat("Expected ", nnz, " non-empty input values, got ", gradient.values_dims[0]);
  }
  std::string error;
  if (gradient.has_known_shape && !(error = CheckGradientShape(shape, gradient)).empty()) return error;
  if (!(error = CheckIndices(shape, gradient)).empty()) return error;
  return CheckValues(shape, gradient, held_values_dims);
}

std::vector<int64_t> TakeOutputShape(const AccumulatorShape& shape, const std::vector<int64_t>& held_values_dims) {
  std::vector<int64_t> out(held_values_dims);
  if (!out.empty()) out[0] = shape.KnowsDim0() ? shape.dims[0] : -1;
  return out;
}

}  // namespace tf_embed_ops
