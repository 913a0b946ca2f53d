// Errors inside thc are exceptions carrying a status code; every C boundary converts them to a
// thc_status_t in one place (collectives/capi).
#pragma once

#include <stdexcept>
#include <string>

namespace thc {

enum class Status : int {
  kSuccess = 0,
  kInvalidArgument = 1,
  kNonFinite = 2,
  kConfigMismatch = 3,
  kOverflow = 4,
  kTransport = 5,
  kTimeout = 6,
  kUnsupported = 7,
  kOutOfMemory = 8,
  kInternal = 9,
  kLeftBehind = 10,
};

class Error : public std::runtime_error {
 public:
  Error(Status s, const std::string& msg) : std::runtime_error(msg), status_(s) {}
  Status status() const { return status_; }

 private:
  Status status_;
};

// What each status means, in words (thc_status_string).
inline const char* status_text(Status s) {
  switch (s) {
    case Status::kSuccess: return "success";
    case Status::kInvalidArgument: return "invalid argument";
    case Status::kNonFinite: return "non-finite input";
    case Status::kConfigMismatch: return "configuration mismatch across ranks";
    case Status::kOverflow: return "integer sums would overflow";
    case Status::kTransport: return "transport failure";
    case Status::kTimeout: return "timeout";
    case Status::kUnsupported: return "unsupported";
    case Status::kOutOfMemory: return "out of memory";
    case Status::kInternal: return "internal error";
    case Status::kLeftBehind: return "left behind by partial aggregation";
  }
  return "unknown status";
}

[[noreturn]] inline void fail(Status s, const std::string& msg) { throw Error(s, msg); }

}  // namespace thc
