// What the row file's three sources share (tiered_row_record.cc: CRC32C, the layout and the record codec;
// tiered_row_file.cc: create, open, the header and map, reads; tiered_row_file_write.cc: the log's writes, cleaning,
// growth and sync).  Not an API: only those sources include it.
#ifndef TF_EMBED_OPS_CC_LIB_TIERED_ROW_FILE_INTERNAL_H_
#define TF_EMBED_OPS_CC_LIB_TIERED_ROW_FILE_INTERNAL_H_

#include <sys/uio.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the row file format is little-endian and is read and written with memcpy"
#endif

// (cc/lib has no TensorFlow, hence no TF_RETURN_IF_ERROR.)
#define RETURN_IF_ERROR_(expr)           \
  do {                                   \
    const absl::Status status_ = (expr); \
    if (!status_.ok()) return status_;   \
  } while (0)

namespace tf_embed_ops {
namespace row_file_internal {

// The header's state field.
constexpr uint32_t kStateWriting = 0, kStateClean = 1;
// The most iovecs one preadv/pwritev takes (POSIX guarantees at least 16; Linux has 1024).
constexpr int kMaxIov = 1024;

// The CRC32C register after `size` more bytes (start from ~0u, finish with ~).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);

// Little-endian fields of the header and the map.
template <typename T>
void Put(char* header, size_t at, T value) {
  std::memcpy(header + at, &value, sizeof(T));
}
template <typename T>
T Get(const char* header, size_t at) {
  T value;
  std::memcpy(&value, header + at, sizeof(T));
  return value;
}

// An errno as a status: ResourceExhausted for a full disk or quota, NotFound, AlreadyExists, PermissionDenied,
// else Internal.
absl::Status IoError(int err, const std::string& message);

// "row 7" or "rows [7, 9)".
std::string Rows(int64_t first, int64_t n);

// The rows of pieces [0, n) for an error: "rows [a, b)" when consecutive, else the first few.
template <typename P>
std::string RowsOf(const P* pieces, int64_t n) {
  bool consecutive = true;
  for (int64_t i = 1; i < n && consecutive; ++i) consecutive = pieces[i].row == pieces[i - 1].row + 1;
  if (consecutive) return Rows(pieces[0].row, n);
  std::string out = "rows ";
  for (int64_t i = 0; i < std::min<int64_t>(n, 4); ++i) absl::StrAppend(&out, i ? ", " : "", pieces[i].row);
  if (n > 4) absl::StrAppend(&out, " and ", n - 4, " more");
  return out;
}

// iovecs for `n` records of `record_bytes` at pointers[0..n), adjacent records merged into one iovec.
void RecordIovecs(char* const* records, int64_t n, int64_t record_bytes, std::vector<struct iovec>* iov);

// iovecs for pieces [0, n) (consecutive slots), adjacent destinations merged; returns how many.
template <typename P>
int PieceIovecs(const P* pieces, int64_t n, int64_t record_bytes, struct iovec* iov) {
  int count = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (count > 0 && static_cast<char*>(iov[count - 1].iov_base) + iov[count - 1].iov_len == pieces[i].record) {
      iov[count - 1].iov_len += static_cast<size_t>(record_bytes);
    } else {
      iov[count++] = {pieces[i].record, static_cast<size_t>(record_bytes)};
    }
  }
  return count;
}

}  // namespace row_file_internal

// (The three sources use these unqualified.)
using row_file_internal::Crc32cExtend;
using row_file_internal::Get;
using row_file_internal::IoError;
using row_file_internal::kMaxIov;
using row_file_internal::kStateClean;
using row_file_internal::kStateWriting;
using row_file_internal::PieceIovecs;
using row_file_internal::Put;
using row_file_internal::RecordIovecs;
using row_file_internal::Rows;
using row_file_internal::RowsOf;

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_TIERED_ROW_FILE_INTERNAL_H_
