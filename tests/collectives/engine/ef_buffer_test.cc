// The error-feedback residual, the library's own tensor-sized host buffer, is advised for
// transparent huge pages from 2 MiB (common/huge_alloc.h): checked in the kernel's view of the
// mapping (VmFlags "hg" of the range in /proc/self/smaps), which does not depend on whether huge
// pages were free when it was touched.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "collectives/engine/engine.h"

namespace {

// VmFlags of the mapping that holds p ("" if none does).
std::string vm_flags(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    unsigned long lo = 0, hi = 0;
    char dash = 0;
    std::istringstream hdr(line);
    if (hdr >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
      inside = a >= lo && a < hi;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line.substr(8) + " ";
  }
  return "";
}

bool thp_in_kernel() {
  struct stat st {};
  return stat("/sys/kernel/mm/transparent_hugepage", &st) == 0;
}

TEST(ErrorFeedbackBuffer, LargeResidualIsAdvisedForHugePages) {
  if (!thp_in_kernel()) GTEST_SKIP() << "kernel without transparent huge pages";
  thc::engine::ErrorFeedback ef;
  ef.residual.assign(uint64_t{3} << 20, 0.0f);  // 12 MiB
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ef.residual.data()) % thc::kHugePage, 0u);
  EXPECT_NE(vm_flags(ef.residual.data()).find(" hg "), std::string::npos) << vm_flags(ef.residual.data());
  EXPECT_NE(vm_flags(ef.residual.data() + ef.residual.size() - 1).find(" hg "), std::string::npos);
  // Out of place: the next residual too; growing moves it to a new advised buffer.
  ef.out_of_place = true;
  float* next = ef.target(uint64_t{1} << 20);
  EXPECT_NE(vm_flags(next).find(" hg "), std::string::npos);
  next = ef.target(uint64_t{5} << 20);
  EXPECT_NE(vm_flags(next + (uint64_t{5} << 20) - 1).find(" hg "), std::string::npos);
  ef.reset();
  EXPECT_TRUE(ef.residual.empty());
}

TEST(ErrorFeedbackBuffer, SmallResidualIsPlainMemory) {
  thc::engine::ErrorFeedback ef;
  ef.residual.assign(1000, 1.5f);
  EXPECT_EQ(ef.residual[999], 1.5f);
  ef.residual.resize(2000, 0.0f);
  EXPECT_EQ(ef.residual[999], 1.5f);
  EXPECT_EQ(ef.residual[1999], 0.0f);
}

}  // namespace
