// Socket-level helpers shared by the UDP aggregator and the UDP client.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace thc {

// A peer address as the kernel gave it; compared bytewise.
struct PeerAddr {
  sockaddr_storage ss{};
  socklen_t len = 0;
  bool operator==(const PeerAddr& o) const { return len == o.len && std::memcmp(&ss, &o.ss, len) == 0; }
  bool operator!=(const PeerAddr& o) const { return !(*this == o); }
  std::string str() const;
};

// "udp://HOST:PORT", "HOST:PORT" or "[V6]:PORT". Returns false with *err set on a bad string.
bool parse_udp_url(const std::string& url, std::string* host, uint16_t* port, std::string* err);
// Resolve host (numeric or name) + port into an address (first IPv4/IPv6 result).
bool resolve_udp(const std::string& host, uint16_t port, PeerAddr* out, std::string* err);

// A nonblocking, close-on-exec UDP socket of the address family of `a`, with large kernel buffers
// (bursts of a whole window must not overflow the receive queue). Throws thc::Error.
int open_udp_socket(const PeerAddr& family_of, int buffer_bytes);

// Microseconds on the monotonic clock.
uint64_t mono_us();

// "TOOL 2026-12-03T10:14:25": the start of the servers' log lines (local time).
std::string log_prefix(const char* tool);

}  // namespace thc
