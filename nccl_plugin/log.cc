#include "nccl_plugin/log.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>

namespace thc::nccl_plugin {
namespace {
std::atomic<nccl_abi::ncclDebugLogger_t> g_logger{nullptr};
}

void set_logger(nccl_abi::ncclDebugLogger_t logger) {
  if (logger) g_logger.store(logger);
}

void log(nccl_abi::ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (nccl_abi::ncclDebugLogger_t l = g_logger.load()) {
    // The message goes as an argument, never as the format: it may contain '%'.
    l(level, flags, file, line, "NET/THC %s", msg);
  } else if (level == nccl_abi::NCCL_LOG_WARN) {
    std::fprintf(stderr, "NET/THC WARN %s\n", msg);
  }
}

}  // namespace thc::nccl_plugin
