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
#include <type_traits>
#include <vector>

#include "cc/lib/huge_pages.h"
#include "cc/lib/storage_types.h"

namespace tf_embed_ops {

template <typename T>
class ChunkedArena {
  static_assert(std::is_trivially_default_constructible_v<T> && std::is_trivially_destructible_v<T>,
                "chunks are raw memory");

 public:
  // Chunks are carved from slabs; once the arena holds kSlabsFrom bytes, a new slab holds at least a huge page of
  // chunks (a table that grows chunk by chunk gets 2 MiB pages, huge_pages.h, and a random row no TLB miss), at
  // the cost of at most one slab's unused chunks, counted in MemoryBytes.  Smaller arenas allocate what they need.
  static constexpr int64_t kSlabsFrom = int64_t{8} << 20;

  // `row_width` elements per row; rows_per_chunk = 2^log2_rows_per_chunk.  Sizes are validated by the table.
  ChunkedArena(int64_t row_width, int log2_rows_per_chunk)
      : row_width_(row_width), log2_rows_(log2_rows_per_chunk), mask_((int64_t{1} << log2_rows_per_chunk) - 1) {}
  ChunkedArena(ChunkedArena&&) noexcept = default;  // (moving keeps every row where it is)
  ChunkedArena& operator=(ChunkedArena&&) noexcept = default;

  int64_t rows_per_chunk() const { return mask_ + 1; }
  int64_t capacity() const { return static_cast<int64_t>(chunks_.size()) << log2_rows_; }
  int64_t row_width() const { return row_width_; }

  // Makes room for rows [0, rows).  Returns false (and keeps what it had) if an allocation fails.
  bool Reserve(int64_t rows) {
    const int64_t needed = (rows + mask_) >> log2_rows_;
    const int64_t have = static_cast<int64_t>(chunks_.size());
    if (needed <= have) return true;
    const int64_t chunk_elems = (mask_ + 1) * row_width_;
    const int64_t chunk_bytes = chunk_elems * static_cast<int64_t>(sizeof(T));
    const int64_t from_slab = std::min(needed - have, spare_chunks_);
    int64_t fresh_chunks = needed - have - from_slab;
    if (fresh_chunks > 0 && slab_bytes_ >= kSlabsFrom) {
      fresh_chunks =
          std::max<int64_t>(fresh_chunks, (static_cast<int64_t>(kHugePageBytes) + chunk_bytes - 1) / chunk_bytes);
    }
    // Everything that can fail first: the directory's room, then the one new slab.
    try {
      chunks_.reserve(needed);
      if (fresh_chunks > 0) slabs_.reserve(slabs_.size() + 1);
    } catch (const std::bad_alloc&) {
      return false;
    }
    T* slab = nullptr;
    if (fresh_chunks > 0) {
      slab = static_cast<T*>(AllocateHugePageMemory(static_cast<size_t>(fresh_chunks * chunk_bytes)));
      if (slab == nullptr) return false;
    }
    for (int64_t c = 0; c < from_slab; ++c, next_chunk_ += chunk_elems) chunks_.push_back(next_chunk_);
    spare_chunks_ -= from_slab;
    if (slab != nullptr) {
      slabs_.emplace_back(slab);
      slab_bytes_ += fresh_chunks * chunk_bytes;
      next_chunk_ = slab;
      spare_chunks_ = fresh_chunks;
      for (; static_cast<int64_t>(chunks_.size()) < needed; next_chunk_ += chunk_elems) {
        chunks_.push_back(next_chunk_);
        --spare_chunks_;
      }
    }
    // The chunks that continue the first one end to end (its slab's, at least) join the direct range.
    const uintptr_t first = reinterpret_cast<uintptr_t>(chunks_.front());
    int64_t run = direct_rows_ >> log2_rows_;
    while (run < needed && reinterpret_cast<uintptr_t>(chunks_[run]) == first + run * chunk_bytes) ++run;
    direct_rows_ = run << log2_rows_;
    first_ = chunks_.front();
    return true;
  }

  T* At(int64_t row) { return row < direct_rows_ ? first_ + row * row_width_ : Chunked(row); }
  const T* At(int64_t row) const { return row < direct_rows_ ? first_ + row * row_width_ : Chunked(row); }
  // Rows [0, direct_rows()) lie back to back from At(0): the first Reserve's rows (a dynamic table's
  // initial_capacity), and any later chunks that happen to continue them.
  int64_t direct_rows() const { return direct_rows_; }

  // Bytes held: the slabs (spare chunks included) plus the chunk directory.
  int64_t MemoryBytes() const { return slab_bytes_ + static_cast<int64_t>(chunks_.capacity() * sizeof(T*)); }

 private:
  struct FreeSlab {
    void operator()(T* p) const { FreeHugePageMemory(p); }
  };
  T* Chunked(int64_t row) const { return chunks_[row >> log2_rows_] + (row & mask_) * row_width_; }

  int64_t row_width_;
  int log2_rows_;
  int64_t mask_;
  std::vector<T*> chunks_;  // the directory: chunk c's first element
  // Rows below direct_rows_ are reached from first_ without the directory: a row's address then depends on no
  // load, which the row walk's prefetches (issued rows ahead, each address from the one before) otherwise wait on.
  int64_t direct_rows_ = 0;
  T* first_ = nullptr;
  std::vector<std::unique_ptr<T, FreeSlab>> slabs_;
  int64_t slab_bytes_ = 0;
  T* next_chunk_ = nullptr;  // the last slab's first spare chunk
  int64_t spare_chunks_ = 0;
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
  int64_t direct_rows() const { return arena_.direct_rows(); }

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
