// The one place where the plugin's C++ exceptions become ncclResult_t (and a WARN through NCCL's
// logger): every entry point runs its body in guard().
#pragma once

#include <exception>
#include <new>

#include "common/status.h"
#include "nccl_plugin/abi.h"
#include "nccl_plugin/log.h"

namespace thc::nccl_plugin {

inline nccl_abi::ncclResult_t to_nccl(Status s) {
  switch (s) {
    case Status::kSuccess: return nccl_abi::ncclSuccess;
    case Status::kInvalidArgument: return nccl_abi::ncclInvalidArgument;
    case Status::kUnsupported: return nccl_abi::ncclInvalidUsage;
    case Status::kTransport:
    case Status::kTimeout: return nccl_abi::ncclRemoteError;  // NCCL: "remote process exited or network error"
    case Status::kOutOfMemory: return nccl_abi::ncclSystemError;
    default: return nccl_abi::ncclInternalError;
  }
}

template <typename F>
nccl_abi::ncclResult_t guard(const char* where, F&& body) {
  try {
    body();
    return nccl_abi::ncclSuccess;
  } catch (const Error& e) {
    THC_PLUGIN_WARN("%s: %s", where, e.what());
    return to_nccl(e.status());
  } catch (const std::bad_alloc&) {
    THC_PLUGIN_WARN("%s: out of memory", where);
    return nccl_abi::ncclSystemError;
  } catch (const std::exception& e) {
    THC_PLUGIN_WARN("%s: %s", where, e.what());
    return nccl_abi::ncclInternalError;
  }
}

}  // namespace thc::nccl_plugin
