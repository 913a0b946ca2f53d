// Point-to-point messaging between the ranks of a group: what a backend supplies so that the
// integer allreduce schedules (transport/schedules) run over it, as Gloo's algorithms run over
// its transport pairs. A backend with collectives of its own worth using for a small MAX (MPI's)
// supplies that too.
//
// Contract:
// - Messages from one rank to another on the same tag are matched in the order they were posted
//   (MPI's non-overtaking rule); a receive must name the exact size of the message it matches.
// - A buffer handed to isend/irecv stays valid and untouched until its request completes, or
//   until cancel() said the link will never touch it again.
// - Requests are owned by the caller: a Req is an opaque word the link fills in; test_some and
//   cancel reset completed ones to kNullReq.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace thc::transport {

class Link {
 public:
  using Req = uint64_t;
  static constexpr Req kNullReq = 0;

  virtual ~Link() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;
  // THC_TIMEOUT_MS: how long a schedule waits for a peer (<= 0: no bound).
  virtual long timeout_ms() const = 0;
  // Tags are < tag_limit() (at least 2^15, MPI's guaranteed minimum).
  virtual uint32_t tag_limit() const = 0;

  // Element-wise MAX of u32 over all ranks, in place, blocking (prelude, seed agreement).
  // Throws thc::Error (kTimeout, kTransport).
  virtual void max_u32(uint32_t* data, size_t n) = 0;

  virtual void isend(int peer, uint32_t tag, const void* buf, size_t bytes, Req* req) = 0;
  virtual void irecv(int peer, uint32_t tag, void* buf, size_t bytes, Req* req) = 0;
  // Drives progress. For each completed request among reqs[0..n): reqs[i] becomes kNullReq and i
  // is written to done[]; returns how many. kNullReq entries are skipped. Throws on a transport
  // error (the message names the peer where the transport can tell).
  virtual int test_some(Req* reqs, int n, int* done) = 0;
  // Gives up on a request (error paths): true if the link will never touch its buffer again
  // (then *req is kNullReq); false if it may (the caller must keep the buffer alive for good).
  virtual bool cancel(Req* req) = 0;
  // Nothing to do until a message moves: return within about `us` microseconds, earlier if the
  // link can tell that something arrived. Never a busy loop: ranks may share cores.
  virtual void idle(uint64_t us) = 0;
};

}  // namespace thc::transport
