// Where a table's rows live, as the one row walk (table_update.h) sees them.  The walk updates a table and its
// optimizer slots row by row; it never needs to know how rows are laid out, only how to reach a row.  So every
// storage is a small class with these members (a compile-time interface: the walk is a template over it, so the
// per-row address computation inlines into the row loop):
//
//   int64_t num_buffers() const;              1 + the optimizer's slot count: buffer 0 is the table, 1 + k slot k
//   StorageType type(size_t b) const;         element type of buffer b (float32, bfloat16, float16)
//   int64_t width(size_t b) const;            elements per row of buffer b (dim, or 1 for a per-row slot)
//   void* Row(size_t b, int64_t row) const;   address of `row` in buffer b; called concurrently for DISTINCT rows
//   int64_t num_walk_rows() const;            the rows a non-lazy optimizer (UpdatesAllRows) walks ...
//   int64_t walk_row(int64_t i) const;        ... in ascending order: walk_row(0) < walk_row(1) < ...
//   uint64_t rounding_id(int64_t row) const;  what keys a row's stochastic-rounding bits (stable across restores)
//
// Storages today:
//   DenseRowStorage  static tables: each buffer one row-major array (a TensorFlow variable's buffer).
//   ArenaRowStorage  dynamic tables (dynamic_table_update.h): each buffer a ChunkedArena (dynamic_table_arena.h);
//                    the walk rows are the live rows and the rounding id is the row's key, not its (reusable)
//                    row index.
// Either may mix 16-bit and float32 buffers: the walk widens a 16-bit row into fp32 scratch and rounds it back.
//
// Adding a storage (a tiered cache whose cold rows live elsewhere, say): write one more class with the members
// above and call UpdateRows / FindNonFiniteUpdate (table_update.h) with it.  Row(b, row) is where such a storage
// makes the row resident (it is called once per buffer per updated row, by the thread that updates it, before
// any read or write of the row); nothing in the walk, the optimizers or the 16-bit path changes.
#ifndef TF_EMBED_OPS_CC_LIB_ROW_STORAGE_H_
#define TF_EMBED_OPS_CC_LIB_ROW_STORAGE_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "cc/lib/storage_types.h"

namespace tf_embed_ops {

// One buffer of a table with any storage type: `data` is float* for kFloat32, else the 16-bit bits (uint16_t*).
struct StoredBuffer {
  void* data = nullptr;
  StorageType type = StorageType::kFloat32;
};

// Row-major arrays: buffer b's row r starts at data + r * width(b) elements.
class DenseRowStorage {
 public:
  // buffers[0] is the table, buffers[1 + k] slot k, with widths[b] elements per row; num_rows rows each.
  DenseRowStorage(std::vector<StoredBuffer> buffers, std::vector<int64_t> widths, int64_t num_rows)
      : buffers_(std::move(buffers)), widths_(std::move(widths)), num_rows_(num_rows) {
    for (size_t b = 0; b < buffers_.size(); ++b) {
      bases_.push_back(static_cast<char*>(buffers_[b].data));
      row_bytes_.push_back(widths_[b] * StorageBytes(buffers_[b].type));
    }
  }

  int64_t num_buffers() const { return static_cast<int64_t>(buffers_.size()); }
  StorageType type(size_t b) const { return buffers_[b].type; }
  int64_t width(size_t b) const { return widths_[b]; }
  void* Row(size_t b, int64_t row) const { return bases_[b] + row * row_bytes_[b]; }
  int64_t num_walk_rows() const { return num_rows_; }
  int64_t walk_row(int64_t i) const { return i; }
  uint64_t rounding_id(int64_t row) const { return static_cast<uint64_t>(row); }

 private:
  std::vector<StoredBuffer> buffers_;
  std::vector<int64_t> widths_;
  int64_t num_rows_;
  std::vector<char*> bases_;
  std::vector<int64_t> row_bytes_;
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_ROW_STORAGE_H_
