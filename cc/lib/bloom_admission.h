// Counting Bloom filter admission for dynamic tables (docs/dynamic_lifecycle.md, "Admission with bounded memory"):
// a fixed array of `num_counters` saturating counters of `counter_bits` bits (4, 8 or 16), whatever the number of
// distinct keys. A sighting of a key adds to its `num_hashes` counters; the key's estimated count is the minimum of
// them (count-min).  The estimate never undercounts (until a counter saturates at 2^bits - 1, which is >= min_count),
// so a key seen min_count times is always admitted; a key seen fewer times is admitted by mistake when every one of
// its counters was pushed to min_count by other keys (the false-admission rate, documented with its formula).
//
// Counter positions: double hashing over MixKey, h1 + i * h2 (mod num_counters), i < num_hashes.
// Not thread-safe: the table's lock covers it.  Memory: ceil(num_counters * counter_bits / 8) bytes.
#ifndef TF_EMBED_OPS_CC_LIB_BLOOM_ADMISSION_H_
#define TF_EMBED_OPS_CC_LIB_BLOOM_ADMISSION_H_

#include <algorithm>
#include <cstdint>
#include <new>
#include <unordered_map>
#include <vector>

#include "cc/lib/dynamic_table_key.h"

namespace tf_embed_ops {

class CountingBloomFilter {
 public:
  static constexpr int64_t kMaxCounters = int64_t{1} << 34;
  static constexpr int64_t kMaxHashes = 16;

  static bool ValidBits(int64_t bits) { return bits == 4 || bits == 8 || bits == 16; }
  static int64_t BytesFor(int64_t num_counters, int64_t bits) { return (num_counters * bits + 7) / 8; }

  CountingBloomFilter() = default;
  // Sizes are validated by the table; false if the allocation fails.
  bool Init(int64_t num_counters, int64_t num_hashes, int64_t bits) {
    num_counters_ = num_counters;
    num_hashes_ = num_hashes;
    bits_ = bits;
    max_value_ = (int64_t{1} << bits) - 1;
    try {
      bytes_.assign(BytesFor(num_counters, bits), 0);
    } catch (const std::bad_alloc&) {
      return false;
    }
    return true;
  }

  bool enabled() const { return num_counters_ > 0; }
  int64_t num_counters() const { return num_counters_; }
  int64_t num_hashes() const { return num_hashes_; }
  int64_t bits() const { return bits_; }
  int64_t max_value() const { return max_value_; }
  const std::vector<uint8_t>& bytes() const { return bytes_; }
  std::vector<uint8_t>* mutable_bytes() { return &bytes_; }
  int64_t MemoryBytes() const { return static_cast<int64_t>(bytes_.capacity()); }

  // The counter positions of `key` (num_hashes of them; a position may repeat for tiny filters).
  template <typename Fn>
  void ForEachPosition(int64_t key, const Fn& fn) const {
    const uint64_t h1 = MixKey(static_cast<uint64_t>(key));
    const uint64_t h2 = MixKey(h1 ^ 0x9e3779b97f4a7c15ULL) | 1;
    for (int64_t i = 0; i < num_hashes_; ++i) {
      fn(static_cast<int64_t>((h1 + static_cast<uint64_t>(i) * h2) % static_cast<uint64_t>(num_counters_)));
    }
  }

  int64_t Get(int64_t pos) const {
    switch (bits_) {
      case 4:
        return (bytes_[pos >> 1] >> ((pos & 1) * 4)) & 0xf;
      case 8:
        return bytes_[pos];
      default:
        return bytes_[2 * pos] | (int64_t{bytes_[2 * pos + 1]} << 8);
    }
  }

  void Set(int64_t pos, int64_t value) {
    switch (bits_) {
      case 4: {
        uint8_t& b = bytes_[pos >> 1];
        const int shift = (pos & 1) * 4;
        b = static_cast<uint8_t>((b & ~(0xf << shift)) | (value << shift));
        break;
      }
      case 8:
        bytes_[pos] = static_cast<uint8_t>(value);
        break;
      default:
        bytes_[2 * pos] = static_cast<uint8_t>(value & 0xff);
        bytes_[2 * pos + 1] = static_cast<uint8_t>(value >> 8);
    }
  }

  // The estimate of a key: the minimum of its counters.
  int64_t Estimate(int64_t key) const {
    int64_t m = max_value_;
    ForEachPosition(key, [&](int64_t p) { m = std::min(m, Get(p)); });
    return m;
  }

  // A batch's additions, staged so that the decisions can be made on the counts after the whole batch before
  // anything is written: Stage(key, n) for each distinct key, then EstimateStaged(key), then Commit().
  void Stage(int64_t key, int64_t n) {
    ForEachPosition(key, [&](int64_t p) { staged_[p] += n; });
  }
  int64_t EstimateStaged(int64_t key) const {
    int64_t m = max_value_;
    ForEachPosition(key, [&](int64_t p) {
      auto it = staged_.find(p);
      const int64_t add = it == staged_.end() ? 0 : it->second;
      m = std::min(m, std::min(max_value_, Get(p) + add));
    });
    return m;
  }
  void Commit() {
    for (const auto& [p, add] : staged_) Set(p, std::min(max_value_, Get(p) + add));
    staged_.clear();
  }
  void Discard() { staged_.clear(); }

  // counters += other's (saturating); both have this filter's geometry (a restore into another shard count).
  void AddSaturating(const uint8_t* other_bytes) {
    CountingBloomFilter other;
    other.num_counters_ = num_counters_;
    other.num_hashes_ = num_hashes_;
    other.bits_ = bits_;
    other.max_value_ = max_value_;
    other.bytes_.assign(other_bytes, other_bytes + bytes_.size());
    for (int64_t p = 0; p < num_counters_; ++p) Set(p, std::min(max_value_, Get(p) + other.Get(p)));
  }

 private:
  int64_t num_counters_ = 0;
  int64_t num_hashes_ = 0;
  int64_t bits_ = 8;
  int64_t max_value_ = 255;
  std::vector<uint8_t> bytes_;
  std::unordered_map<int64_t, int64_t> staged_;
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_BLOOM_ADMISSION_H_
