// The row file's CRC32C, record layout and record codec (tiered_row_file.h).
#include <algorithm>
#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cc/lib/tiered_row_file.h"
#include "cc/lib/tiered_row_file_internal.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace tf_embed_ops {
namespace {

std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;  // reflected Castagnoli polynomial
    table[i] = c;
  }
  return table;
}

uint32_t Crc32cTable(uint32_t crc, const unsigned char* p, size_t n) {
  static const std::array<uint32_t, 256> table = MakeCrcTable();
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xffu] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
// The crc32 instruction takes 3 cycles and can start one a cycle: one chain of them runs at a third of the speed
// the core allows.  So blocks of 3 * kLane bytes are summed as three independent lanes (each register starts from
// 0 but the first's), and the lanes are joined by linearity: the register after lane a then lane b is the register
// of a moved over kLane zero bytes, xor b's.  Moving a register over kLane zero bytes is linear in its 32 bits, so
// it is four lookups in tables built once (by feeding zeros through the bytewise table).
constexpr size_t kCrcLane = 128;

struct CrcZerosShift {
  std::array<std::array<uint32_t, 256>, 4> table;
  CrcZerosShift() {
    const std::array<unsigned char, kCrcLane> zeros{};
    for (uint32_t j = 0; j < 4; ++j) {
      for (uint32_t b = 0; b < 256; ++b) table[j][b] = Crc32cTable(b << (8 * j), zeros.data(), zeros.size());
    }
  }
  uint32_t operator()(uint32_t crc) const {
    return table[0][crc & 0xffu] ^ table[1][(crc >> 8) & 0xffu] ^ table[2][(crc >> 16) & 0xffu] ^ table[3][crc >> 24];
  }
};

__attribute__((target("sse4.2"))) uint32_t Crc32cSse42(uint32_t crc, const unsigned char* p, size_t n) {
  uint64_t c = crc;
  if (n >= 3 * kCrcLane) {
    static const CrcZerosShift shift;
    for (; n >= 3 * kCrcLane; n -= 3 * kCrcLane, p += 3 * kCrcLane) {
      uint64_t a = c, b = 0, d = 0;
      for (size_t i = 0; i < kCrcLane; i += 8) {
        uint64_t va, vb, vd;
        std::memcpy(&va, p + i, 8);
        std::memcpy(&vb, p + kCrcLane + i, 8);
        std::memcpy(&vd, p + 2 * kCrcLane + i, 8);
        a = _mm_crc32_u64(a, va);
        b = _mm_crc32_u64(b, vb);
        d = _mm_crc32_u64(d, vd);
      }
      c = shift(shift(static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b)) ^ static_cast<uint32_t>(d);
    }
  }
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return c32;
}
#endif

}  // namespace

uint32_t row_file_internal::Crc32cExtend(uint32_t crc, const void* data, size_t size) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
#if defined(__x86_64__)
  static const bool has_sse42 = __builtin_cpu_supports("sse4.2");
  if (has_sse42) return Crc32cSse42(crc, p, size);
#endif
  return Crc32cTable(crc, p, size);
}

uint32_t Crc32c(const void* data, size_t size) { return ~row_file_internal::Crc32cExtend(~0u, data, size); }

// ---------------------------------------------------------------------------------------------- layout

absl::Status TieredRowLayout::Validate(const std::string& what) const {
  if (types.size() != widths.size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", types.size(), " storage types for ", widths.size(),
                                                   " buffers; give one per buffer (the table, then each slot)"));
  }
  if (types.empty() || num_buffers() > kMaxBuffers) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", types.size(), " buffers; a table has 1 to ", kMaxBuffers,
                                                   " (the table and its slots)"));
  }
  for (int64_t b = 0; b < num_buffers(); ++b) {
    if (widths[b] < 1 || widths[b] > kMaxWidth) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": buffer ", b, " (", b == 0 ? "the table" : "a slot",
                                                     ") has width ", widths[b], "; allowed [1, ", kMaxWidth, "]"));
    }
  }
  // (The file: the header, num_rows plus a quarter spare record slots, the map; the map's slot numbers are 32-bit.)
  const int64_t max_rows = std::min(kMaxRows, (INT64_MAX / 4) / record_bytes());
  if (num_rows < 1 || num_rows > max_rows) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": num_rows is ", num_rows, "; allowed [1, ", max_rows,
                                                   "] for records of ", record_bytes(), " bytes"));
  }
  return absl::OkStatus();
}

int64_t TieredRowLayout::offset(int64_t b) const {
  int64_t at = 0;
  for (int64_t i = 0; i < b; ++i) at += (widths[i] * StorageBytes(types[i]) + 3) / 4 * 4;
  return at;
}

std::string TieredRowLayout::DebugString() const {
  std::string out = absl::StrCat(num_rows, " rows of [");
  for (int64_t b = 0; b < num_buffers(); ++b) {
    absl::StrAppend(&out, b ? ", " : "", StorageTypeName(types[b]), " x ", widths[b]);
  }
  absl::StrAppend(&out, "]");
  return out;
}

void EncodeRecord(const TieredRowLayout& layout, const float* const* buffers, char* record) {
  std::memset(record, 0, layout.payload_bytes());  // the padding too: the CRC covers it
  for (int64_t b = 0; b < layout.num_buffers(); ++b) {
    char* dst = record + layout.offset(b);
    const int64_t w = layout.widths[b];
    if (layout.types[b] == StorageType::kFloat32) {
      std::memcpy(dst, buffers[b], w * sizeof(float));
      continue;
    }
    for (int64_t d = 0; d < w; ++d) {
      const uint16_t bits = layout.types[b] == StorageType::kBfloat16 ? FloatToBfloat16Nearest(buffers[b][d])
                                                                      : FloatToFloat16Nearest(buffers[b][d]);
      std::memcpy(dst + 2 * d, &bits, 2);
    }
  }
  StampRecord(layout, record);
}

void DecodeRecord(const TieredRowLayout& layout, const char* record, float* const* buffers) {
  for (int64_t b = 0; b < layout.num_buffers(); ++b) {
    const char* src = record + layout.offset(b);
    const int64_t w = layout.widths[b];
    if (layout.types[b] == StorageType::kFloat32) {
      std::memcpy(buffers[b], src, w * sizeof(float));
      continue;
    }
    for (int64_t d = 0; d < w; ++d) {
      uint16_t bits;
      std::memcpy(&bits, src + 2 * d, 2);
      buffers[b][d] = StoredToFloat(layout.types[b], bits);
    }
  }
}

void StampRecord(const TieredRowLayout& layout, char* record) {
  const int64_t payload = layout.payload_bytes();
  const uint32_t crc = Crc32c(record, static_cast<size_t>(payload));
  std::memcpy(record + payload, &crc, 4);
}
}  // namespace tf_embed_ops
