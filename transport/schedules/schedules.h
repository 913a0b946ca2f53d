// Integer allreduce schedules over point-to-point links (transport/link.h): the algorithms the
// backends share instead of each writing its own (Gloo's algorithms over pairs). A backend
// supplies a Link (MPI: PMPI_Isend/Irecv on a duplicated communicator; inproc: threads), and
// make_scheduled_reducer turns it into a Reducer:
//
// - Index form (colocated parameter server): rank r owns shard r of the wire elements. A
//   reduce-scatter of the packed indices in pairwise order (step s: send to r+s, receive from
//   r-s, so every link carries one peer's traffic at a time and no rank receives from everyone at
//   once), cut into pieces; each piece of the shard is looked up and summed as soon as every
//   peer's part of it has arrived, then (optionally re-compressed, DownstreamCodec) sent to every
//   peer in the same pairwise order: the allgather of piece k overlaps the reduce-scatter of
//   piece k+1.
// - Value form: a pipelined ring (reduce-scatter with integer addition, then allgather), each of
//   the n segments cut into pieces.
//
// Every buffer the link reads or writes belongs to the request, so an operation abandoned on a
// timeout can never write into the caller's memory later: receives are cancelled, and buffers
// the link may still touch are kept for the life of the process. After a failure the reducer
// refuses further operations (the ranks are out of step).
//
// A wait gives up after THC_TIMEOUT_MS (the link's timeout_ms) in which no message of its operation
// completed: an inactivity bound, so a long operation that keeps moving is never cut short.
//
// Waiting does not spin: ranks may share cores (4 ranks on 2 here), and a busy-polling rank
// takes the CPU its peers need to encode. A wait polls again at once only while messages
// complete; after a poll that found nothing it sleeps, in growing steps up to 200 us (at 1 Gbit/s,
// 25 KB of wire time; the kernel's socket buffers hold far more). Polling is not free: over TCP
// every poll of Open MPI is a poll(2) of its sockets, and a spin of 50 us after every completion
// made those syscalls about a third of a rank's CPU on the 1 Gbit/s testbed (README).
#pragma once

#include <cstdint>
#include <memory>

#include "transport/link.h"
#include "transport/reducer.h"

namespace thc::transport {

// THC_CHUNK_GROWTH (1..64, default 1); anything else is an error naming the variable.
uint64_t default_chunk_growth();

struct ScheduleOptions {
  // Message size target: pieces carry about this many bytes of sums.
  uint64_t piece_bytes = 256 * 1024;
  // Sends in flight per operation (pairwise order: one or two peers at a time).
  int send_window = 4;
  // Reducer::chunk_growth: operations in the middle of a long call up to this many times
  // THC_CHUNK_BYTES. Every message costs Open MPI over TCP about the same CPU whatever its size
  // (a write, the receiver's wake-ups; a rendezvous above its 64 KB eager limit adds a handshake
  // and a small tail fragment): at 1 MB chunks and 4 ranks, a shard's 8-bit sums are 64 KB, and
  // the testbed's ranks spent ~15 % of their CPU on those messages (README, CPU per call).
  // Default 1 (THC_CHUNK_GROWTH): growth 4 cut that CPU but made 4-32 MB PS calls up to 2x
  // slower on an idle testbed (fewer chunks overlap less), so it is for CPU-bound hosts only.
  uint64_t chunk_growth = default_chunk_growth();
  // A message a little over this many bytes (up to twice) goes as equal parts at or under it, so
  // that none is a transport's rendezvous with a sliver of a tail; 0: messages are never cut.
  // Every rank of a group must use the same value (parts are matched by size).
  uint64_t eager_bytes = 0;
};

std::unique_ptr<Reducer> make_scheduled_reducer(std::unique_ptr<Link> link, const ScheduleOptions& opt = {});

}  // namespace thc::transport
