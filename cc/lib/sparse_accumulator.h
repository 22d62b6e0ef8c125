// The aggregation core of the sparse conditional accumulator, free of TensorFlow types.
//
// Contract (docs/sparse_accumulator.md, "canonical mode"):
// - The store holds rows keyed by an int64 index.  Each row has a running sum of `row_width` elements and a
//   count: the number of gradients that touched the row since the store was (re)created.
// - Add() takes one gradient (indices in any order, duplicates allowed).  It is canonicalised first: the
//   duplicates of an index are summed in the order they appear, then that one row is added to the held row
//   (or becomes it).  So a row's count grows by exactly one per gradient that touches it, however many times.
// - Extract() writes the rows in ascending index order, each divided by its own count when `mean` is set.
// Cost: Add is O(n log H) (a B-tree probe per row, O(1) for rows beyond the largest held index) plus the row
// arithmetic, and O(n log n) more when the indices are not strictly ascending (checked in one pass); it never
// touches rows it does not hit (TensorFlow's merge copies every held row on every apply).  Extract is
// O(H * row_width) for H held rows: the B-tree is already in index order.
// Not thread-safe: the owner serialises access.
#ifndef TF_EMBED_OPS_CC_LIB_SPARSE_ACCUMULATOR_H_
#define TF_EMBED_OPS_CC_LIB_SPARSE_ACCUMULATOR_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"

namespace tf_embed_ops {

template <typename T>
class SparseRowSum {
  using Iterator = typename absl::btree_map<int64_t, int64_t>::iterator;

 public:
  explicit SparseRowSum(int64_t row_width) : row_width_(row_width) {}

  SparseRowSum(const SparseRowSum&) = delete;
  SparseRowSum& operator=(const SparseRowSum&) = delete;

  int64_t row_width() const { return row_width_; }
  int64_t num_rows() const { return static_cast<int64_t>(counts_.size()); }

  // Adds one gradient: `n` indices and `n * row_width()` values, row-major.  Indices are not range-checked
  // here (the caller validated them).
  void Add(const int64_t* indices, int64_t n, const T* values) {
    if (n == 0) return;
    if (StrictlyAscending(indices, n)) {
      Iterator hint = slot_of_.begin();
      for (int64_t i = 0; i < n; ++i) hint = AddRun(indices[i], hint, values + i * row_width_, values, nullptr, 0);
      return;
    }
    // Sort positions by (index, position): duplicates stay in their input order, so their sum is defined.
    std::vector<std::pair<int64_t, int64_t>> order(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) order[i] = {indices[i], i};
    std::sort(order.begin(), order.end());
    std::vector<int64_t> run_positions;
    Iterator hint = slot_of_.begin();
    for (size_t begin = 0; begin < order.size();) {
      size_t end = begin + 1;
      while (end < order.size() && order[end].first == order[begin].first) ++end;
      run_positions.clear();
      for (size_t k = begin + 1; k < end; ++k) run_positions.push_back(order[k].second);
      hint = AddRun(order[begin].first, hint, values + order[begin].second * row_width_, values, run_positions.data(),
                    run_positions.size());
      begin = end;
    }
  }

  // Writes the held rows in ascending index order: `num_rows()` indices and `num_rows() * row_width()`
  // values.  With `mean`, each row is divided by its count converted to T (as TensorFlow does, so float16
  // rounds the count first).
  void Extract(bool mean, int64_t* out_indices, T* out_values) const {
    int64_t r = 0;
    for (const auto& [index, slot] : slot_of_) {
      out_indices[r] = index;
      const T* src = Row(slot);
      T* dst = out_values + r * row_width_;
      ++r;
      if (mean) {
        const T count = static_cast<T>(counts_[slot]);
        for (int64_t j = 0; j < row_width_; ++j) dst[j] = src[j] / count;
      } else {
        std::copy(src, src + row_width_, dst);
      }
    }
  }

 private:
  // Rows live in fixed-size chunks so that growing the store never moves (copies) the rows already held.
  static constexpr int64_t kChunkElements = 1 << 16;

  static bool StrictlyAscending(const int64_t* indices, int64_t n) {
    for (int64_t i = 1; i < n; ++i) {
      if (indices[i] <= indices[i - 1]) return false;
    }
    return true;
  }

  int64_t RowsPerChunk() const {
    return row_width_ == 0 ? kChunkElements : std::max<int64_t>(1, kChunkElements / row_width_);
  }

  T* Row(int64_t slot) {
    if (row_width_ == 0) return nullptr;
    const int64_t per_chunk = RowsPerChunk();
    return chunks_[slot / per_chunk].get() + (slot % per_chunk) * row_width_;
  }
  const T* Row(int64_t slot) const { return const_cast<SparseRowSum*>(this)->Row(slot); }

  // The first held entry with key >= index.  Every key before `hint` must be < index: runs are added in
  // ascending order and each passes its own position on, so a merge of dense gradients steps a few entries
  // forward instead of searching, and rows beyond the largest held index append without a search.
  Iterator Locate(int64_t index, Iterator hint) {
    if (slot_of_.empty() || index > slot_of_.rbegin()->first) return slot_of_.end();
    for (int step = 0; step < 8 && hint != slot_of_.end() && hint->first < index; ++step) ++hint;
    if (hint == slot_of_.end() || hint->first >= index) return hint;
    return slot_of_.lower_bound(index);
  }

  // Adds the run of one index: the row at `first`, then the `num_more` rows of `values` at `more` (input
  // order).  Returns the index's entry, the hint for the next (larger) index.
  Iterator AddRun(int64_t index, Iterator hint, const T* first, const T* values, const int64_t* more, size_t num_more) {
    Iterator it = Locate(index, hint);
    const bool inserted = it == slot_of_.end() || it->first != index;
    if (inserted) {
      it = slot_of_.emplace_hint(it, index, num_rows());
      counts_.push_back(1);
      if (row_width_ > 0 && static_cast<int64_t>(chunks_.size()) * RowsPerChunk() < num_rows()) {
        // Not value-initialised: every row is written before it is read.
        chunks_.push_back(std::unique_ptr<T[]>(new T[static_cast<size_t>(RowsPerChunk() * row_width_)]));
      }
      T* row = Row(it->second);
      std::copy(first, first + row_width_, row);
      for (size_t k = 0; k < num_more; ++k) AddInto(row, values + more[k] * row_width_);
      return it;
    }
    ++counts_[it->second];
    T* row = Row(it->second);
    if (num_more == 0) {
      AddInto(row, first);
      return it;
    }
    // Duplicates are summed among themselves first, then added once: the canonical gradient's row.
    scratch_.assign(first, first + row_width_);
    for (size_t k = 0; k < num_more; ++k) AddInto(scratch_.data(), values + more[k] * row_width_);
    AddInto(row, scratch_.data());
    return it;
  }

  void AddInto(T* dst, const T* src) const {
    for (int64_t j = 0; j < row_width_; ++j) dst[j] += src[j];
  }

  int64_t row_width_;
  absl::btree_map<int64_t, int64_t> slot_of_;  // index -> slot, in index order
  std::vector<std::unique_ptr<T[]>> chunks_;
  std::vector<int32_t> counts_;  // by slot
  std::vector<T> scratch_;
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_SPARSE_ACCUMULATOR_H_
