// AdviseRange / AdviseHugePages (cc/lib/huge_pages.h): the advice stays strictly inside the buffer, leaves the
// content unchanged, and, where the kernel reports a collapse, the range is really backed by huge pages.
#include "cc/lib/huge_pages.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tf_embed_ops {
namespace {

// A buffer that starts `offset` bytes after a 2 MiB boundary, `bytes` long, filled with a pattern.
struct Buffer {
  Buffer(size_t offset, size_t bytes) : bytes(bytes) {
    base = static_cast<char*>(std::aligned_alloc(kHugePageBytes, offset + bytes + kHugePageBytes));
    data = base + offset;
    for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<char>(i * 131 + 7);
  }
  ~Buffer() { std::free(base); }
  bool Intact() const {
    for (size_t i = 0; i < bytes; ++i)
      if (data[i] != static_cast<char>(i * 131 + 7)) return false;
    return true;
  }
  char* base;
  char* data;
  size_t bytes;
};

// AnonHugePages (kB) of the mapping of /proc/self/smaps that contains `address`.
int64_t AnonHugeKbAt(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t a = reinterpret_cast<uintptr_t>(address);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream header(line);
    if (header >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo <= a && a < hi;
    } else if (inside && line.rfind("AnonHugePages:", 0) == 0) {
      return std::strtoll(line.c_str() + 14, nullptr, 10);
    }
  }
  return -1;
}

TEST(HugePagesTest, TooSmallOrOffDoesNothing) {
  Buffer small(0, kHugePageBytes - 1);
  EXPECT_EQ(AdviseRange(small.data, small.bytes, HugePagePolicy::kCollapse).advised_bytes, 0u);
  // [1 MiB, 4 MiB) past a boundary holds one whole aligned page, [2 MiB, 4 MiB).
  Buffer straddling(size_t{1} << 20, size_t{3} << 20);
  EXPECT_EQ(AdviseRange(straddling.data, straddling.bytes, HugePagePolicy::kCollapse).advised_bytes, kHugePageBytes);
  Buffer off(0, 4 * kHugePageBytes);
  const HugePageAdvice advice = AdviseRange(off.data, off.bytes, HugePagePolicy::kOff);
  EXPECT_EQ(advice.advised_bytes, 0u);
  EXPECT_FALSE(advice.advised);
  EXPECT_TRUE(small.Intact() && straddling.Intact() && off.Intact());
}

TEST(HugePagesTest, AdvisesOnlyWholeAlignedPagesInsideTheBuffer) {
  // Starts 4 KiB past a boundary and ends 4 KiB before one: the first and last partial pages are left alone.
  constexpr size_t kPage4k = 4096;
  Buffer buffer(kPage4k, 6 * kHugePageBytes - 2 * kPage4k);
  const HugePageAdvice advice = AdviseRange(buffer.data, buffer.bytes, HugePagePolicy::kAdvise);
  EXPECT_EQ(advice.advised_bytes, 4 * kHugePageBytes);
  EXPECT_FALSE(advice.collapsed);  // kAdvise never collapses
  EXPECT_TRUE(buffer.Intact());
}

TEST(HugePagesTest, CollapseKeepsTheContentAndMapsHugePages) {
  if (ProcessHugePagePolicy() == HugePagePolicy::kOff) GTEST_SKIP() << "no transparent huge pages here";
  Buffer buffer(12345, 8 * kHugePageBytes);
  const HugePageAdvice advice = AdviseRange(buffer.data, buffer.bytes, HugePagePolicy::kCollapse);
  EXPECT_EQ(advice.advised_bytes, 7 * kHugePageBytes);
  EXPECT_TRUE(buffer.Intact());
  if (!advice.collapsed) GTEST_SKIP() << "the kernel did not collapse (no MADV_COLLAPSE, or no free huge page)";
  EXPECT_GT(AnonHugeKbAt(buffer.data + kHugePageBytes), 0);
}

TEST(HugePagesTest, AdviseHugePagesIsRepeatableAndKeepsTheContent) {
  Buffer buffer(64, 3 * kHugePageBytes);
  for (uint32_t i = 0; i < kRecheckEvery + 2; ++i) AdviseHugePages(buffer.data, buffer.bytes);
  AdviseHugePages(buffer.data, kHugePageBytes / 2);  // another size at the same address: advised as new
  EXPECT_TRUE(buffer.Intact());
}

TEST(HugePagesTest, AllocatedMemoryIsAlignedAndFaultsInAsHugePagesWhenLarge) {
  void* small = AllocateHugePageMemory(100);
  ASSERT_NE(small, nullptr);
  FreeHugePageMemory(small);
  const size_t bytes = 4 * kHugePageBytes + 4096;
  char* large = static_cast<char*>(AllocateHugePageMemory(bytes));
  ASSERT_NE(large, nullptr);
  for (size_t i = 0; i < bytes; i += 4096) large[i] = 1;  // fault every page in
  if (ProcessHugePagePolicy() != HugePagePolicy::kOff) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(large) % kHugePageBytes, 0u);
    // A hint: where the kernel had free huge pages, the faults mapped some.
    if (AnonHugeKbAt(large) == 0) std::printf("no huge page mapped (none free on this machine)\n");
  }
  FreeHugePageMemory(large);
  std::vector<uint32_t, HugePageAllocator<uint32_t>> v(kHugePageBytes, 7u);  // 8 MiB through the allocator
  EXPECT_EQ(v[kHugePageBytes - 1], 7u);
}

}  // namespace
}  // namespace tf_embed_ops
