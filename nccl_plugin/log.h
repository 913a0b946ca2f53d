// The plugin's messages go through the logger NCCL hands to init() (NCCL_DEBUG=INFO shows them,
// NCCL_DEBUG_SUBSYS=NET selects them); with no logger (a program that drives the plugin without
// NCCL and passes none), warnings go to stderr.
#pragma once

#include "nccl_plugin/abi.h"

namespace thc::nccl_plugin {

void set_logger(nccl_abi::ncclDebugLogger_t logger);

// printf-style; file/line are the caller's.
void log(nccl_abi::ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));

}  // namespace thc::nccl_plugin

#define THC_PLUGIN_WARN(...) \
  ::thc::nccl_plugin::log(::thc::nccl_abi::NCCL_LOG_WARN, ::thc::nccl_abi::NCCL_NET, __FILE__, __LINE__, __VA_ARGS__)
#define THC_PLUGIN_INFO(flags, ...) \
  ::thc::nccl_plugin::log(::thc::nccl_abi::NCCL_LOG_INFO, (flags), __FILE__, __LINE__, __VA_ARGS__)
#define THC_PLUGIN_TRACE(flags, ...) \
  ::thc::nccl_plugin::log(::thc::nccl_abi::NCCL_LOG_TRACE, (flags), __FILE__, __LINE__, __VA_ARGS__)
