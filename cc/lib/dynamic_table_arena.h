// Storage of a dynamic table's rows (docs/dynamic_tables_internals.md, "Layout"): fixed-size chunks of `rows_per_chunk`
// rows, allocated one by one as the table grows.  Growth appends chunks and never copies or frees one, so a row
// never moves: a pointer to row r stays valid for the arena's lifetime, and a table of N rows never needs 2N
// memory during growth (a doubling vector would).  Row r lives in chunk r >> log2(rows_per_chunk).
//
// A dynamic table keeps one arena per (table, slot) for the float rows and one for the row metadata, all with
// the same rows_per_chunk, so a row index addresses every one of them.
//
// Not thread-safe for growth: Reserve() may reallocate the chunk directory, so it must not run concurrently with
// At() (the table's callers hold its lock for inserts).  Rows obtained before a Reserve() remain valid.
#ifndef TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_ARENA_H_
#define TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_ARENA_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

#include "cc/lib/storage_types.h"

namespace tf_embed_ops {

template <typename T>
class ChunkedArena {
 public:
  // `row_width` elements per row; rows_per_chunk = 2^log2_rows_per_chunk.  Sizes are validated by the table.
  ChunkedArena(int64_t row_width, int log2_rows_per_chunk)
      : row_width_(row_width), log2_rows_(log2_rows_per_chunk), mask_((int64_t{1} << log2_rows_per_chunk) - 1) {}

  int64_t rows_per_chunk() const { return mask_ + 1; }
  int64_t capacity() const { return static_cast<int64_t>(chunks_.size()) << log2_rows_; }
  int64_t row_width() const { return row_width_; }

  // Makes room for rows [0, rows).  Returns false (and keeps what it had) if an allocation fails.
  bool Reserve(int64_t rows) {
    const int64_t needed = (rows + mask_) >> log2_rows_;
    if (needed <= static_cast<int64_t>(chunks_.size())) return true;
    std::vector<std::unique_ptr<T[]>> fresh;
    try {
      chunks_.reserve(needed);
      for (int64_t c = static_cast<int64_t>(chunks_.size()); c < needed; ++c) {
        fresh.emplace_back(new T[(mask_ + 1) * row_width_]);
      }
    } catch (const std::bad_alloc&) {
      return false;
    }
    for (auto& chunk : fresh) chunks_.push_back(std::move(chunk));
    return true;
  }

  T* At(int64_t row) { return chunks_[row >> log2_rows_].get() + (row & mask_) * row_width_; }
  const T* At(int64_t row) const { return chunks_[row >> log2_rows_].get() + (row & mask_) * row_width_; }

  // Bytes held: the chunks plus the chunk directory.
  int64_t MemoryBytes() const {
    return capacity() * row_width_ * static_cast<int64_t>(sizeof(T)) +
           static_cast<int64_t>(chunks_.capacity() * sizeof(std::unique_ptr<T[]>));
  }

 private:
  int64_t row_width_;
  int log2_rows_;
  int64_t mask_;
  std::vector<std::unique_ptr<T[]>> chunks_;
};

// One buffer of a dynamic table (its weights, or one optimizer slot): rows of `width` elements stored as
// float32 or as 16-bit bits (docs/low_precision.md), in a ChunkedArena of 16-bit units (a float32 element is two).
// The row walk reaches rows through At(); everything else reads rows widened to float32 (Read) and writes them
// rounded to nearest (Write: initial values and imports, which are exact for values that came from this storage).
class StoredRowArena {
 public:
  StoredRowArena(StorageType type, int64_t width, int log2_rows_per_chunk)
      : type_(type), width_(width), arena_(width * StorageBytes(type) / 2, log2_rows_per_chunk) {}

  StorageType type() const { return type_; }
  int64_t width() const { return width_; }  // elements per row
  int64_t capacity() const { return arena_.capacity(); }
  bool Reserve(int64_t rows) { return arena_.Reserve(rows); }
  int64_t MemoryBytes() const { return arena_.MemoryBytes(); }

  // The row's storage: float* for kFloat32, else uint16_t* (the 16-bit bits).
  void* At(int64_t row) { return arena_.At(row); }
  const void* At(int64_t row) const { return arena_.At(row); }

  void Read(int64_t row, float* out) const {
    if (type_ == StorageType::kFloat32) {
      std::copy_n(static_cast<const float*>(At(row)), width_, out);
    } else {
      const uint16_t* bits = arena_.At(row);
      for (int64_t d = 0; d < width_; ++d) out[d] = StoredToFloat(type_, bits[d]);
    }
  }
  void Write(int64_t row, const float* in) {
    if (type_ == StorageType::kFloat32) {
      std::copy_n(in, width_, static_cast<float*>(At(row)));
    } else {
      uint16_t* bits = arena_.At(row);
      for (int64_t d = 0; d < width_; ++d) bits[d] = ToStoredNearest(in[d]);
    }
  }
  void Fill(int64_t row, float value) {
    if (type_ == StorageType::kFloat32) {
      std::fill_n(static_cast<float*>(At(row)), width_, value);
    } else {
      std::fill_n(arena_.At(row), width_, ToStoredNearest(value));
    }
  }

 private:
  uint16_t ToStoredNearest(float x) const {
    return type_ == StorageType::kBfloat16 ? FloatToBfloat16Nearest(x) : FloatToFloat16Nearest(x);
  }

  StorageType type_;
  int64_t width_;
  ChunkedArena<uint16_t> arena_;
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_DYNAMIC_TABLE_ARENA_H_
