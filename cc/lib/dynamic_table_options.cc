// DynamicTable::Create: every option is checked before anything is allocated (dynamic_table.h).
#include <cmath>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "cc/lib/dynamic_table.h"
#include "cc/lib/dynamic_table_errors.h"

namespace tf_embed_ops {
namespace dynamic_table_internal {

absl::Status ValidatePolicy(const std::string& name, int64_t max_rows, const EvictionOptions& p, const char* what) {
  switch (p.policy) {
    case EvictionPolicy::kNone:
      return absl::OkStatus();
    case EvictionPolicy::kLru:
    case EvictionPolicy::kLfu:
    case EvictionPolicy::kDecayedLfu:
      if (p.target_rows <= 0 || p.target_rows > max_rows) {
        return Invalid(name, absl::StrCat(what, ": LRU/LFU/DecayedLFU target_rows must be in [1, max_rows = ", max_rows,
                                          "], got ", p.target_rows));
      }
      if (p.policy == EvictionPolicy::kDecayedLfu && !(p.decay > 0.0 && p.decay <= 1.0)) {
        return Invalid(name, absl::StrCat(what, ": DecayedLFU decay must be in (0, 1], got ", p.decay));
      }
      return absl::OkStatus();
    case EvictionPolicy::kTtl:
      if (p.ttl_steps <= 0) return Invalid(name, absl::StrCat(what, ": TTL ttl_steps must be > 0, got ", p.ttl_steps));
      return absl::OkStatus();
    case EvictionPolicy::kL2Norm:
      if (!(p.min_norm >= 0.0) || !std::isfinite(p.min_norm)) {
        return Invalid(name, absl::StrCat(what, ": L2Norm min_norm must be finite and >= 0, got ", p.min_norm));
      }
      return absl::OkStatus();
    case EvictionPolicy::kCountAndAge:
      if (p.min_count < 1 || p.min_count > DynamicTable::kMaxCount || p.ttl_steps < 0) {
        return Invalid(name, absl::StrCat(what, ": CountAndAge needs min_count in [1, ", DynamicTable::kMaxCount,
                                          "] and max_age_steps >= 0, got ", p.min_count, " and ", p.ttl_steps));
      }
      return absl::OkStatus();
  }
  return Invalid(name, absl::StrCat(what, ": unknown eviction policy ", static_cast<int>(p.policy)));
}

absl::Status L2NormOfExternalRows(const std::string& name, const char* what) {
  return Invalid(name, absl::StrCat(what, ": L2Norm eviction reads every row's weights, which this table keeps in ",
                                    "a row file (a tiered table): use LRU, LFU, DecayedLFU, TTL or CountAndAge"));
}

}  // namespace dynamic_table_internal

using dynamic_table_internal::Exhausted;
using dynamic_table_internal::Invalid;

absl::StatusOr<std::unique_ptr<DynamicTable>> DynamicTable::Create(const DynamicTableOptions& o) {
  const std::string& t = o.name;
  if (o.dim <= 0 || o.dim > kMaxDim) {
    return Invalid(t, absl::StrCat("dim must be in [1, ", kMaxDim, "], got ", o.dim));
  }
  const int64_t num_slots = static_cast<int64_t>(o.slot_initial_values.size());
  if (num_slots > kMaxSlots) {
    return Invalid(t, absl::StrCat("at most ", kMaxSlots, " optimizer slots, got ", num_slots));
  }
  for (int64_t s = 0; s < num_slots; ++s) {
    if (!std::isfinite(o.slot_initial_values[s])) {
      return Invalid(t, absl::StrCat("slot ", s, " initial value must be finite, got ", o.slot_initial_values[s]));
    }
  }
  if (!o.slot_widths.empty() && static_cast<int64_t>(o.slot_widths.size()) != num_slots) {
    return Invalid(t, absl::StrCat(o.slot_widths.size(), " slot widths for ", num_slots,
                                   " slot initial values (one of each per optimizer slot)"));
  }
  int64_t slot_floats = 0;
  for (size_t s = 0; s < o.slot_widths.size(); ++s) {
    if (o.slot_widths[s] != 1 && o.slot_widths[s] != o.dim) {
      return Invalid(t, absl::StrCat("slot ", s, " width must be 1 (one value per row) or dim = ", o.dim, ", got ",
                                     o.slot_widths[s]));
    }
    slot_floats += o.slot_widths[s];
  }
  if (o.slot_widths.empty()) slot_floats = num_slots * o.dim;
  if (o.max_rows <= 0 || o.max_rows > KeyIndex::kMaxRows) {
    return Invalid(t, absl::StrCat("max_rows must be in [1, ", KeyIndex::kMaxRows, "], got ", o.max_rows));
  }
  if (o.initial_capacity <= 0 || o.initial_capacity > o.max_rows) {
    return Invalid(
        t, absl::StrCat("initial_capacity must be in [1, max_rows = ", o.max_rows, "], got ", o.initial_capacity));
  }
  if (o.rows_per_chunk <= 0 || o.rows_per_chunk > kMaxRowsPerChunk || (o.rows_per_chunk & (o.rows_per_chunk - 1))) {
    return Invalid(t, absl::StrCat("rows_per_chunk must be a power of two in [1, ", kMaxRowsPerChunk, "], got ",
                                   o.rows_per_chunk));
  }
  // The largest table these options allow must be addressable: max_rows (rounded up to whole chunks) times the
  // floats of a row and its slots, in bytes, within int64.  dim <= 2^20, slots <= 16 and max_rows < 2^31 bound
  // it by 2^56, but the check keeps that true if the limits above ever change.
  const int64_t rows_bound = (o.max_rows + o.rows_per_chunk - 1) / o.rows_per_chunk * o.rows_per_chunk;
  const int64_t floats_per_row = o.dim + slot_floats;
  if (rows_bound > std::numeric_limits<int64_t>::max() / 4 / floats_per_row) {
    return Invalid(t, absl::StrCat("max_rows = ", o.max_rows, " rows of ", floats_per_row,
                                   " floats overflow a 64-bit byte count"));
  }
  if (absl::Status s = o.initializer.Validate(t); !s.ok()) return s;
  const AdmissionOptions& a = o.admission;
  if (a.min_count < 1 || a.min_count > kMaxCount) {
    return Invalid(t, absl::StrCat("admission min_count must be in [1, ", kMaxCount, "], got ", a.min_count));
  }
  if (a.min_count > 1 && a.max_pending_keys <= 0 && a.bloom_num_counters == 0) {
    return Invalid(t, absl::StrCat("admission with min_count = ", a.min_count, " needs max_pending_keys > 0, got ",
                                   a.max_pending_keys));
  }
  if (a.max_pending_keys < 0 || a.pending_ttl_steps < 0) {
    return Invalid(t, absl::StrCat("admission max_pending_keys and pending_ttl_steps must be >= 0, got ",
                                   a.max_pending_keys, " and ", a.pending_ttl_steps));
  }
  if (a.bloom_num_counters < 0 || a.bloom_num_counters > CountingBloomFilter::kMaxCounters) {
    return Invalid(t, absl::StrCat("BloomAdmission num_counters must be in [1, ", CountingBloomFilter::kMaxCounters,
                                   "], got ", a.bloom_num_counters));
  }
  if (a.bloom_num_counters > 0) {
    if (a.bloom_num_hashes < 1 || a.bloom_num_hashes > CountingBloomFilter::kMaxHashes) {
      return Invalid(t, absl::StrCat("BloomAdmission num_hashes must be in [1, ", CountingBloomFilter::kMaxHashes,
                                     "], got ", a.bloom_num_hashes));
    }
    if (!CountingBloomFilter::ValidBits(a.bloom_counter_bits)) {
      return Invalid(t, absl::StrCat("BloomAdmission counter_bits must be 4, 8 or 16, got ", a.bloom_counter_bits));
    }
    if (a.min_count > (int64_t{1} << a.bloom_counter_bits) - 1) {
      return Invalid(
          t, absl::StrCat("BloomAdmission min_count = ", a.min_count, " does not fit counters of ",
                          a.bloom_counter_bits, " bits (at most ", (int64_t{1} << a.bloom_counter_bits) - 1, ")"));
    }
  }
  if (o.eviction_log_capacity < 1 || o.eviction_log_capacity > EvictionLog::kMaxCapacity) {
    return Invalid(t, absl::StrCat("eviction_log_capacity must be in [1, ", EvictionLog::kMaxCapacity, "], got ",
                                   o.eviction_log_capacity));
  }
  int log2_rows = 0;
  while ((int64_t{1} << log2_rows) < o.rows_per_chunk) ++log2_rows;
  if (absl::Status s = dynamic_table_internal::ValidatePolicy(t, o.max_rows, o.eviction, "eviction"); !s.ok()) return s;
  if (o.external_rows && o.eviction.policy == EvictionPolicy::kL2Norm)
    return dynamic_table_internal::L2NormOfExternalRows(t, "eviction");
  std::unique_ptr<DynamicTable> table(new DynamicTable(o, log2_rows));
  if (a.bloom_num_counters > 0 && !table->bloom_.Init(a.bloom_num_counters, a.bloom_num_hashes, a.bloom_counter_bits)) {
    return Exhausted(t, absl::StrCat("cannot allocate ", a.bloom_num_counters, " Bloom admission counters"));
  }
  if (!table->Grow(o.initial_capacity)) {
    return Exhausted(t, absl::StrCat("cannot allocate initial_capacity = ", o.initial_capacity, " rows"));
  }
  return table;
}

}  // namespace tf_embed_ops
