// Transparent huge pages (2 MiB) for table and slot buffers.
//
// Why: a training step reads and writes rows at random in tables far larger than the TLB's reach.  With 4 KiB
// pages nearly every row costs a TLB miss and a page walk (a two-level walk in a virtual machine); with 2 MiB
// pages the walks mostly hit the paging-structure caches.  On the benchmark machine this made the random-row
// update pass 30-60% faster (docs/design_notes.md, "Round two").  TensorFlow allocates variables with the
// system allocator, so on Linux's default THP mode ("madvise") their pages are 4 KiB unless someone asks.
//
// AdviseHugePages(data, bytes), called by the kernels for every table and slot buffer they touch, asks once per
// buffer:
//   madvise(MADV_HUGEPAGE) on the 2 MiB-aligned part strictly inside the buffer (never a byte outside it), so
//     pages faulted later and the kernel's background collapser (khugepaged) use huge pages, and
//   madvise(MADV_COLLAPSE) (Linux >= 6.1) on the same part: the already-written 4 KiB pages are rebuilt as huge
//     pages now, synchronously (about 1-2 ms per MiB, once per buffer; content is preserved, and concurrent
//     readers are safe: the kernel blocks them for the copy).
// Hints only: a failure (no THP, not enough contiguous memory, another OS) changes nothing but speed, and is
// never reported as an error.  The policy comes from TF_EMBED_OPS_HUGE_PAGES, read once:
//   "collapse" (default) both calls; "advise" MADV_HUGEPAGE only (khugepaged collapses over minutes, the step
//   never waits); "off" nothing.
#ifndef TF_EMBED_OPS_CC_LIB_HUGE_PAGES_H_
#define TF_EMBED_OPS_CC_LIB_HUGE_PAGES_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace tf_embed_ops {

enum class HugePagePolicy { kOff, kAdvise, kCollapse };

// The policy of TF_EMBED_OPS_HUGE_PAGES (read at the first call); kOff where the OS has no transparent huge
// pages or its mode is "never".
HugePagePolicy ProcessHugePagePolicy();

// What one AdviseRange call did.
struct HugePageAdvice {
  size_t advised_bytes = 0;  // the 2 MiB-aligned part inside the buffer (0: buffer too small, or policy off)
  bool advised = false;      // MADV_HUGEPAGE succeeded
  bool collapsed = false;    // MADV_COLLAPSE succeeded (only asked under kCollapse)
};

// Applies `policy` to the 2 MiB-aligned part of [data, data + bytes), now (no once-per-buffer bookkeeping).
HugePageAdvice AdviseRange(const void* data, size_t bytes, HugePagePolicy policy);

// AdviseRange under the process policy, once per buffer (keyed by address and size).  A buffer freed and
// replaced by another at the same address and size would be skipped, so every kRecheckEvery-th sighting of a
// buffer advises it again (MADV_COLLAPSE of a range that is already huge costs ~10 us per 256 MiB).
// Thread-safe; cheap after the first call for a buffer (a hash lookup under a mutex).
void AdviseHugePages(const void* data, size_t bytes);

inline constexpr size_t kHugePageBytes = size_t{2} << 20;
inline constexpr uint32_t kRecheckEvery = 1024;

// Memory the library allocates itself (a dynamic table's rows and key index): `bytes` from malloc, or, when
// bytes >= kHugePageBytes and the process policy is not kOff, aligned to 2 MiB with MADV_HUGEPAGE on its whole
// 2 MiB pages before anything touches them, so it faults in as huge pages with no collapse to pay.  Null when
// the allocation fails.  Release with FreeHugePageMemory (std::free).
void* AllocateHugePageMemory(size_t bytes);
inline void FreeHugePageMemory(void* p) { std::free(p); }

// A std allocator over AllocateHugePageMemory (throws std::bad_alloc when it fails).
template <typename T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT: implicit, as std allocators are
  T* allocate(size_t n) {
    if (n > static_cast<size_t>(-1) / sizeof(T)) throw std::bad_alloc();
    void* p = AllocateHugePageMemory(n * sizeof(T));
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { FreeHugePageMemory(p); }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const HugePageAllocator<U>&) const {
    return false;
  }
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_HUGE_PAGES_H_
