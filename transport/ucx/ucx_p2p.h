// Point-to-point byte transport over UCX (ucp tag matching): what the NCCL net plugin
// (nccl_plugin/) offers NCCL, usable by anything that needs ordered, tagged messages between
// processes. Bytes only; it never sees floats.
//
// Shape (all non-blocking, every call returns at once):
//   Listener   binds a UCX listener (client-server connection establishment, UCX's sockaddr
//              connection manager) on one device's IPv4 address; its Address fits in 32 bytes.
//   Connector  connects to an Address; poll() returns the Endpoint once the connection is up.
//   Endpoint   one UCX worker and one ucp endpoint: send / grouped recv / test.
//
// One UCX worker per endpoint (and per listener): NCCL hands a comm from the thread that connected
// it to the thread that drives it, and never uses one comm from two threads at once, which is
// exactly UCS_THREAD_MODE_SERIALIZED; comms share nothing, so no lock is taken on the data path.
// Messages on an endpoint match receives in posting order per tag (UCX's tag matching); a
// receive buffer may be larger than the message (the received length is reported), never
// smaller (the request fails with "truncated").
//
// Which UCX transports carry the data is UCX's choice (UCX_TLS, UCX_NET_DEVICES, ... are read
// from the environment): shared memory between processes of one host, TCP or RDMA otherwise.
// When UCX_NET_DEVICES is not set, the Context of a Device restricts UCX's network devices to
// that interface, so that one Device is one NIC, as NCCL expects of a net device.
#pragma once

#include <netinet/in.h>
#include <ucp/api/ucp.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

// The check macro for UCS calls (DESIGN.md §5: one per foreign API): throws
// thc::Error(kTransport, "<call> at file:line: <ucs_status_string>").
#define THC_CHECK_UCS(expr) ::thc::transport::ucx::check_ucs((expr), #expr, __FILE__, __LINE__)

namespace thc::transport::ucx {

void check_ucs(ucs_status_t st, const char* call, const char* file, int line);

// A network interface offered as a device.
struct Device {
  std::string name;          // interface name ("eth0")
  std::string pci_path;      // realpath of /sys/class/net/<name>/device; "" for a virtual interface
  int speed_mbps = 0;        // /sys/class/net/<name>/speed, or 10000 when the kernel does not know
  bool speed_known = false;  // false: speed_mbps is the 10 Gb/s assumption
  in_addr ipv4{};            // listeners bind here
  bool is_loopback = false;
};

struct Discovery {
  std::vector<Device> devices;
  std::string note;  // how the list was chosen (for the log)
};

// UP IPv4 interfaces. UCX_NET_DEVICES (when set and not "all") keeps the interfaces it names;
// otherwise loopback and container bridges (docker*, virbr*) are left out, and loopback is used
// only when nothing else exists.
Discovery discover_devices();

// What a listener publishes (and a connector needs). Host byte order except where noted; both
// ends run the same build.
struct Address {
  static constexpr uint32_t kMagic = 0x74686375;  // "thcu"
  static constexpr uint16_t kVersion = 1;
  uint32_t magic = 0;
  uint16_t version = 0;
  uint16_t port_be = 0;   // network byte order
  uint32_t ipv4_be = 0;   // network byte order
  uint32_t reserved = 0;
  uint64_t nonce = 0;     // the connector proves it read this Address (its hello carries it)
};
static_assert(sizeof(Address) == 24, "Address is 24 bytes");

// One ucp_context per device; shared (thread-safe) by every listener and endpoint on it.
class Context {
 public:
  // overrides: UCX configuration (name without the UCX_ prefix, value) applied unless the
  // environment sets that variable (UCX_<name>), which always wins.
  explicit Context(const Device& dev, const std::vector<std::pair<std::string, std::string>>& overrides = {});  // throws thc::Error
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ucp_context_h get() const { return ctx_; }
  const Device& device() const { return dev_; }
  // What UCX_NET_DEVICES the context runs with ("(environment)" when the user set it).
  const std::string& net_devices() const { return net_devices_; }

 private:
  Device dev_;
  std::string net_devices_;
  ucp_context_h ctx_ = nullptr;
};

struct Limits {
  int max_requests = 256;     // requests in flight per endpoint (a grouped receive is one)
  int max_recvs = 8;          // buffers per grouped receive
  long timeout_ms = 120000;   // connection setup; also bounds the flush at close
};

class Request;
class Endpoint;

// Hands the endpoint to the process's closer thread and returns at once: the flush and close
// finish there (each bounded), so a caller never waits for the peer's progress. Closers still
// running when the process exits are forced closed.
void close_in_background(std::unique_ptr<Endpoint> ep);

// The endpoint a request (from Endpoint::send/recv, not yet completed) belongs to, and its number
// of buffers (1 for a send). Null / 0 for anything else.
Endpoint* endpoint_of(const Request* r);
int buffers_of(const Request* r);

class Listener {
 public:
  // Binds the device's IPv4 address on an ephemeral port. Throws thc::Error.
  Listener(std::shared_ptr<Context> ctx, const Limits& limits);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
  const Address& address() const { return addr_; }
  // The next connection whose hello arrived and matched, or null. Never blocks. Connections whose
  // hello is wrong are dropped. Throws thc::Error if UCX fails.
  std::unique_ptr<Endpoint> poll_accept();

  struct Pending;

 private:
  static void on_conn_request(ucp_conn_request_h req, void* arg);
  std::shared_ptr<Context> ctx_;
  Limits limits_;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  Address addr_;
  std::deque<ucp_conn_request_h> requests_;
  std::vector<std::unique_ptr<Pending>> pending_;
};

class Connector {
 public:
  // Starts connecting (never blocks). Throws thc::Error on a malformed address.
  Connector(std::shared_ptr<Context> ctx, const Address& to, const Limits& limits);
  ~Connector();
  Connector(const Connector&) = delete;
  Connector& operator=(const Connector&) = delete;
  // The endpoint once its hello reached the peer, else null. Throws thc::Error (kTransport,
  // kTimeout) when the connection failed.
  std::unique_ptr<Endpoint> poll();

  struct State;

 private:
  std::unique_ptr<State> s_;
};

class Endpoint {
 public:
  // Cancels what is in flight, flushes what it sent (bounded by the timeout; the flush waits for
  // the peer's progress), closes. close_in_background() does the same without waiting.
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // Null when max_requests are in flight (try again after testing some). Throws thc::Error.
  Request* send(const void* data, size_t size, uint32_t tag);
  // n buffers (1..max_recvs), each matched by its tag. Null when max_requests are in flight.
  Request* recv(int n, void* const* data, const size_t* sizes, const uint32_t* tags);
  // Progresses the worker; true when r completed, then sizes[i] holds the bytes of buffer i (sends:
  // sizes[0] = bytes sent) and r is released. A failed request is released and thrown as
  // thc::Error (kTransport). Never blocks.
  bool test(Request* r, size_t* sizes);
  // UCX's description of the endpoint's lanes (which transports carry what).
  std::string describe() const;
  int max_recvs() const { return limits_.max_recvs; }
  // One non-blocking step of closing; true once closed (then only destruction is left).
  static bool poll_close(Endpoint& e);
  // Closing from now on waits for nothing (the process is going away).
  static void hurry(Endpoint& e);

  struct Impl;

 private:
  friend class Listener;
  friend class Connector;
  Endpoint(std::shared_ptr<Context> ctx, ucp_worker_h worker, ucp_ep_h ep, const Limits& limits,
           std::shared_ptr<ucs_status_t> ep_status, std::string peer);
  std::unique_ptr<Impl> d_;
  Limits limits_;
};

}  // namespace thc::transport::ucx
