// How a switch client exchanges datagrams with its aggregator: a UDP socket (udp/), a DPDK port
// (dpdk/). The client's protocol logic (windows, congestion control, retransmission, partial
// aggregation) is the same over every channel. One channel per client job instance, driven from
// the client's calls only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace thc::transport {

class DatagramChannel {
 public:
  virtual ~DatagramChannel() = default;
  // Queue a datagram; queued datagrams go out at the latest before the next recv/wait, in
  // batches (UDP GSO where the kernel has it). Best effort: a datagram lost here is recovered by
  // retransmission. Failures are remembered for last_error().
  virtual void send(const uint8_t* p, size_t n) = 0;
  // Send what is queued now.
  virtual void flush() = 0;
  // The next datagram from the aggregator, copied into buf (at most cap bytes): its length, or 0
  // when none is waiting. Never blocks.
  virtual size_t recv(uint8_t* buf, size_t cap) = 0;
  // Sleep until a datagram may be waiting or timeout_us passes (0: return at once).
  virtual void wait_us(uint64_t timeout_us) = 0;
  // A file descriptor that polls readable when a datagram may be waiting (-1: none, the channel
  // must be waited on through wait_us). Lets a client wait on several channels at once.
  virtual int poll_fd() const { return -1; }
  // Whether recv() would return a datagram already received into user space.
  virtual bool pending() const { return false; }
  // Largest protocol payload (bytes after the 64-byte header) the path to the aggregator carries
  // without fragmentation.
  virtual int payload_budget() const = 0;
  virtual std::string kind() const = 0;  // "udp", "dpdk"
  virtual std::string peer() const = 0;  // the aggregator, for messages
  // The last send/receive failure ("" if none), e.g. "Connection refused".
  virtual std::string last_error() const { return {}; }
};

// A connected, nonblocking UDP socket to "udp://HOST:PORT" (batched: GSO out, GRO in). Throws
// thc::Error.
std::unique_ptr<DatagramChannel> make_udp_channel(const std::string& address);

}  // namespace thc::transport
