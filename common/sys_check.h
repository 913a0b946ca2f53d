// The one check macro for POSIX calls (DESIGN.md §5: THC_CHECK_SYS with EINTR retry).
//
//   THC_SYS(expr)        runs expr, retrying while it fails with EINTR, and returns a SysResult
//                        that records the call text, file:line, return value and errno. Callers
//                        on a data path inspect it (EAGAIN is not an error for a nonblocking
//                        socket) and never throw.
//   THC_CHECK_SYS(expr)  the same, but throws thc::Error(kTransport, "<call> at file:line: ...")
//                        when the call fails.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>

#include "common/status.h"

namespace thc::sys {

struct SysResult {
  long rc = 0;
  int err = 0;
  const char* call = "";
  const char* file = "";
  int line = 0;

  bool ok() const { return rc >= 0; }
  bool would_block() const { return rc < 0 && (err == EAGAIN || err == EWOULDBLOCK); }
  std::string describe() const {
    return std::string(call) + " at " + file + ":" + std::to_string(line) + ": " +
           (rc < 0 ? std::strerror(err) : "ok");
  }
  [[noreturn]] void fail(Status s = Status::kTransport) const { thc::fail(s, describe()); }
  long check() const {
    if (!ok()) fail();
    return rc;
  }
};

template <typename F>
SysResult sys_call(F&& f, const char* call, const char* file, int line) {
  SysResult r;
  r.call = call;
  r.file = file;
  r.line = line;
  for (;;) {
    errno = 0;
    r.rc = static_cast<long>(f());
    r.err = r.rc < 0 ? errno : 0;
    if (!(r.rc < 0 && r.err == EINTR)) return r;
  }
}

}  // namespace thc::sys

#ifndef THC_SYS
#define THC_SYS(expr) ::thc::sys::sys_call([&]() { return (expr); }, #expr, __FILE__, __LINE__)
#endif
#ifndef THC_CHECK_SYS
#define THC_CHECK_SYS(expr) THC_SYS(expr).check()
#endif
