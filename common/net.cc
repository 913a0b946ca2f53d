#include "common/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <ctime>
#include <cstdlib>

#include "common/sys_check.h"

namespace thc {

std::string PeerAddr::str() const {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  return "?";
}

bool parse_udp_url(const std::string& url, std::string* host, uint16_t* port, std::string* err) {
  std::string s = url;
  const std::string scheme = "udp://";
  if (s.compare(0, scheme.size(), scheme) == 0) {
    s = s.substr(scheme.size());
  } else if (s.find("://") != std::string::npos) {
    if (err) *err = "unsupported scheme in '" + url + "' (expected udp://HOST:PORT)";
    return false;
  }
  std::string h, p;
  if (!s.empty() && s[0] == '[') {
    const size_t close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':') {
      if (err) *err = "bad address '" + url + "' (expected udp://[V6ADDR]:PORT)";
      return false;
    }
    h = s.substr(1, close - 1);
    p = s.substr(close + 2);
  } else {
    const size_t colon = s.rfind(':');
    if (colon == std::string::npos || s.find(':') != colon) {
      if (err) *err = "bad address '" + url + "' (expected udp://HOST:PORT)";
      return false;
    }
    h = s.substr(0, colon);
    p = s.substr(colon + 1);
  }
  char* end = nullptr;
  errno = 0;
  const unsigned long v = p.empty() ? 0 : std::strtoul(p.c_str(), &end, 10);
  if (h.empty() || p.empty() || errno || *end != '\0' || v == 0 || v > 65535) {
    if (err) *err = "bad host or port in '" + url + "' (expected udp://HOST:PORT, port 1..65535)";
    return false;
  }
  *host = h;
  *port = static_cast<uint16_t>(v);
  return true;
}

bool resolve_udp(const std::string& host, uint16_t port, PeerAddr* out, std::string* err) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  const std::string ps = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), ps.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    if (err) *err = "cannot resolve '" + host + "': " + gai_strerror(rc);
    return false;
  }
  std::memcpy(&out->ss, res->ai_addr, res->ai_addrlen);
  out->len = static_cast<socklen_t>(res->ai_addrlen);
  freeaddrinfo(res);
  return true;
}

int open_udp_socket(const PeerAddr& family_of, int buffer_bytes) {
  const int fd = static_cast<int>(
      THC_CHECK_SYS(::socket(family_of.ss.ss_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)));
  if (buffer_bytes > 0) {
    // FORCE variants exceed net.core.[rw]mem_max when privileged; the plain ones cap silently.
    if (!THC_SYS(::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buffer_bytes, sizeof buffer_bytes)).ok())
      (void)THC_SYS(::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof buffer_bytes));
    if (!THC_SYS(::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buffer_bytes, sizeof buffer_bytes)).ok())
      (void)THC_SYS(::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof buffer_bytes));
  }
  return fd;
}

uint64_t mono_us() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

std::string log_prefix(const char* tool) {
  char buf[64];
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return std::string(tool) + " " + buf;
}

}  // namespace thc
