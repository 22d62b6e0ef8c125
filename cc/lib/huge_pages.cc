#include "cc/lib/huge_pages.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <unordered_map>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace tf_embed_ops {
namespace {

#if defined(__linux__) && defined(MADV_HUGEPAGE)
#define TF_EMBED_OPS_HAVE_THP 1
// Older C libraries lack the constant; the value is the kernel's ABI (include/uapi/asm-generic/mman-common.h).
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif
#endif

// The kernel's THP mode: the bracketed word of /sys/kernel/mm/transparent_hugepage/enabled.
bool ThpAvailable() {
#ifdef TF_EMBED_OPS_HAVE_THP
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  const std::string modes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return !modes.empty() && modes.find("[never]") == std::string::npos;
#else
  return false;
#endif
}

HugePagePolicy DetectPolicy() {
  HugePagePolicy policy = HugePagePolicy::kCollapse;
  if (const char* v = std::getenv("TF_EMBED_OPS_HUGE_PAGES")) {
    if (std::strcmp(v, "off") == 0) policy = HugePagePolicy::kOff;
    if (std::strcmp(v, "advise") == 0) policy = HugePagePolicy::kAdvise;
  }
  return ThpAvailable() ? policy : HugePagePolicy::kOff;
}

// Buffers already advised: start address -> (size, sightings).  Cleared when it grows past kMaxEntries (freed
// buffers leave their entries behind; clearing costs one cheap re-advice per live buffer).
struct Registry {
  struct Entry {
    size_t bytes;
    uint32_t sightings;
  };
  static constexpr size_t kMaxEntries = 4096;
  std::mutex mu;
  std::unordered_map<uintptr_t, Entry> seen;
};

Registry& TheRegistry() {
  static Registry* registry = new Registry();  // never destroyed: kernels may run during static destruction
  return *registry;
}

}  // namespace

HugePagePolicy ProcessHugePagePolicy() {
  static const HugePagePolicy policy = DetectPolicy();
  return policy;
}

HugePageAdvice AdviseRange(const void* data, size_t bytes, HugePagePolicy policy) {
  HugePageAdvice out;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = (begin + kHugePageBytes - 1) & ~(uintptr_t{kHugePageBytes} - 1);
  const uintptr_t last = (begin + bytes) & ~(uintptr_t{kHugePageBytes} - 1);
  if (policy == HugePagePolicy::kOff || bytes < kHugePageBytes || last <= first) return out;
  out.advised_bytes = last - first;
#ifdef TF_EMBED_OPS_HAVE_THP
  void* start = reinterpret_cast<void*>(first);
  out.advised = madvise(start, out.advised_bytes, MADV_HUGEPAGE) == 0;
  if (out.advised && policy == HugePagePolicy::kCollapse) {
    out.collapsed = madvise(start, out.advised_bytes, MADV_COLLAPSE) == 0;
  }
#endif
  return out;
}

void* AllocateHugePageMemory(size_t bytes) {
  const HugePagePolicy policy = ProcessHugePagePolicy();
  if (policy == HugePagePolicy::kOff || bytes < kHugePageBytes) return std::malloc(bytes == 0 ? 1 : bytes);
  void* p = nullptr;
  if (posix_memalign(&p, kHugePageBytes, bytes) != 0) return nullptr;
  // Advice only (the memory is fresh: nothing to collapse), whatever the policy says beyond "not off".
  AdviseRange(p, bytes, HugePagePolicy::kAdvise);
  return p;
}

void AdviseHugePages(const void* data, size_t bytes) {
  const HugePagePolicy policy = ProcessHugePagePolicy();
  if (policy == HugePagePolicy::kOff || bytes < kHugePageBytes) return;
  Registry& registry = TheRegistry();
  {
    std::lock_guard<std::mutex> lock(registry.mu);
    if (registry.seen.size() >= Registry::kMaxEntries) registry.seen.clear();
    auto [it, inserted] = registry.seen.try_emplace(reinterpret_cast<uintptr_t>(data), Registry::Entry{bytes, 0});
    if (!inserted && it->second.bytes == bytes && ++it->second.sightings % kRecheckEvery != 0) return;
    it->second = Registry::Entry{bytes, 0};
  }
  // Outside the lock: a first collapse takes a while, and other buffers' lookups must not wait for it.  Two
  // threads advising the same new buffer at once is harmless.
  AdviseRange(data, bytes, policy);
}

}  // namespace tf_embed_ops
