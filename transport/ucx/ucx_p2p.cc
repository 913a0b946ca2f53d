#include "transport/ucx/ucx_p2p.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

namespace thc::transport::ucx {

void check_ucs(ucs_status_t st, const char* call, const char* file, int line) {
  if (st == UCS_OK) return;
  fail(Status::kTransport, std::string(call) + " at " + file + ":" + std::to_string(line) + ": " + ucs_status_string(st));
}

namespace {

using Clock = std::chrono::steady_clock;

// Tags: the high word tells a connection's hello from data; NCCL's int tag is the low word.
constexpr ucp_tag_t kHelloTag = 0x7468630068656c6cull;  // "thc\0hell"
constexpr ucp_tag_t kAckTag = 0x746863006f6b6179ull;    // "thc\0okay"
constexpr ucp_tag_t kDataTagBase = 0x1ull << 32;
constexpr ucp_tag_t kFullMask = ~ucp_tag_t{0};
constexpr long kGraceMs = 1000;  // receives outlive a closed peer this long (see Endpoint::test)
ucp_tag_t data_tag(uint32_t tag) { return kDataTagBase | tag; }

struct Hello {
  uint64_t magic;  // Address::kMagic
  uint64_t nonce;  // the listener's Address::nonce
};

std::string read_first_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

std::string ipv4_string(in_addr a) {
  char b[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &a, b, sizeof b);
  return b;
}

ucp_worker_h make_worker(ucp_context_h ctx) {
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucp_worker_h w = nullptr;
  THC_CHECK_UCS(ucp_worker_create(ctx, &wp, &w));
  return w;
}

// The completion of one UCX operation, written by its callback (which also frees the UCX request).
struct Op {
  void* req = nullptr;  // UCX request while in progress
  bool done = false;
  ucs_status_t status = UCS_OK;
  size_t length = 0;
};

void op_send_done(void* request, ucs_status_t status, void* user) {
  auto* op = static_cast<Op*>(user);
  op->status = status;
  op->done = true;
  op->req = nullptr;
  ucp_request_free(request);
}

void op_recv_done(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
  auto* op = static_cast<Op*>(user);
  op->status = status;
  op->length = status == UCS_OK && info ? info->length : 0;
  op->done = true;
  op->req = nullptr;
  ucp_request_free(request);
}

// Result of ucp_*_nbx: completed now, in progress (op->req set), or failed at once.
void start_op(Op* op, ucs_status_ptr_t p) {
  if (p == nullptr) {
    op->done = true;
    op->status = UCS_OK;
  } else if (UCS_PTR_IS_ERR(p)) {
    op->done = true;
    op->status = UCS_PTR_STATUS(p);
  } else {
    op->req = p;
  }
}

ucp_request_param_t send_param(Op* op) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = op_send_done;
  p.user_data = op;
  return p;
}

// Receives always complete through the callback (UCP_OP_ATTR_FLAG_NO_IMM_CMPL): UCX 1.13 completes
// a receive of an already arrived (unexpected) eager message immediately without filling
// recv_info, which would lose the received length.
ucp_request_param_t recv_param(Op* op) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.cb.recv = op_recv_done;
  p.user_data = op;
  return p;
}

void post_recv(Op* op, ucp_worker_h w, void* buf, size_t size, ucp_tag_t tag) {
  *op = Op{};
  ucp_request_param_t p = recv_param(op);
  start_op(op, ucp_tag_recv_nbx(w, buf, size, tag, kFullMask, &p));
}

void on_ep_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* st = static_cast<ucs_status_t*>(arg);
  if (*st == UCS_OK) *st = status;
}

// Progress w until pred() or the deadline; true if pred() held.
template <typename Pred>
bool progress_until(ucp_worker_h w, Clock::time_point deadline, Pred pred) {
  while (!pred()) {
    if (ucp_worker_progress(w) == 0) {
      if (Clock::now() > deadline) return false;
      std::this_thread::yield();
    }
  }
  return true;
}

// Close ep without waiting for the peer (the caller flushed what mattered), then destroy w.
void close_and_destroy(ucp_worker_h w, ucp_ep_h ep, long timeout_ms) {
  if (ep) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
      const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
      progress_until(w, deadline, [&] { return ucp_request_check_status(r) != UCS_INPROGRESS; });
      ucp_request_free(r);
    }
  }
  if (w) ucp_worker_destroy(w);
}

uint64_t random64() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace

// ---- devices ------------------------------------------------------------------------------------

Discovery discover_devices() {
  Discovery d;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) {
    d.note = std::string("getifaddrs: ") + std::strerror(errno);
    return d;
  }
  std::vector<Device> all;
  std::set<std::string> seen;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    if (!(i->ifa_flags & IFF_UP) || !(i->ifa_flags & IFF_RUNNING)) continue;
    if (!seen.insert(i->ifa_name).second) continue;  // first IPv4 address of each interface
    Device dev;
    dev.name = i->ifa_name;
    dev.ipv4 = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr;
    dev.is_loopback = (i->ifa_flags & IFF_LOOPBACK) != 0;
    all.push_back(dev);
  }
  freeifaddrs(ifs);

  const char* env = std::getenv("UCX_NET_DEVICES");
  const std::string want = env ? env : "";
  if (!want.empty() && want != "all") {
    // Entries are UCX device names: interfaces ("eth0") or RDMA ports ("mlx5_0:1"); only the
    // interfaces can be listened on.
    const std::vector<std::string> names = split_commas(want);
    for (const Device& dev : all)
      for (const std::string& n : names)
        if (n == dev.name) d.devices.push_back(dev);
    if (!d.devices.empty()) {
      d.note = "interfaces named by UCX_NET_DEVICES=" + want;
    } else {
      d.note = "UCX_NET_DEVICES=" + want + " names no IPv4 interface: listening on the default interfaces, UCX carries "
               "data over the devices it names";
    }
  }
  if (d.devices.empty()) {
    for (const Device& dev : all) {
      const bool bridge = dev.name.rfind("docker", 0) == 0 || dev.name.rfind("virbr", 0) == 0;
      if (!dev.is_loopback && !bridge) d.devices.push_back(dev);
    }
    if (d.note.empty()) d.note = "every UP IPv4 interface except loopback and container bridges";
    if (d.devices.empty()) {
      for (const Device& dev : all)
        if (dev.is_loopback) d.devices.push_back(dev);
      d.note += d.devices.empty() ? " (none found)" : " (none found: loopback only)";
    }
  }
  for (Device& dev : d.devices) {
    const std::string sys = "/sys/class/net/" + dev.name;
    char resolved[PATH_MAX];
    if (realpath((sys + "/device").c_str(), resolved)) dev.pci_path = resolved;
    const std::string sp = read_first_line(sys + "/speed");
    const long mbps = sp.empty() ? -1 : std::strtol(sp.c_str(), nullptr, 10);
    dev.speed_known = mbps > 0;
    dev.speed_mbps = mbps > 0 && mbps < INT_MAX ? static_cast<int>(mbps) : 10000;
  }
  return d;
}

// ---- context ------------------------------------------------------------------------------------

Context::Context(const Device& dev, const std::vector<std::pair<std::string, std::string>>& overrides) : dev_(dev) {
  ucp_config_t* cfg = nullptr;
  THC_CHECK_UCS(ucp_config_read(nullptr, nullptr, &cfg));
  for (const auto& [name, value] : overrides) {
    const char* set = std::getenv(("UCX_" + name).c_str());
    if (set && *set) continue;
    const ucs_status_t st = ucp_config_modify(cfg, name.c_str(), value.c_str());
    if (st != UCS_OK) {
      ucp_config_release(cfg);
      THC_CHECK_UCS(st);
    }
  }
  const char* env = std::getenv("UCX_NET_DEVICES");
  if (env && *env) {
    net_devices_ = std::string(env) + " (environment)";
  } else {
    net_devices_ = dev.name;
    const ucs_status_t st = ucp_config_modify(cfg, "NET_DEVICES", dev.name.c_str());
    if (st != UCS_OK) {
      ucp_config_release(cfg);
      THC_CHECK_UCS(st);
    }
  }
  ucp_params_t p{};
  p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
  p.features = UCP_FEATURE_TAG;
  p.mt_workers_shared = 1;  // workers are created from NCCL's connection thread and its progress thread
  p.name = "thc";
  const ucs_status_t st = ucp_init(&p, cfg, &ctx_);
  ucp_config_release(cfg);
  THC_CHECK_UCS(st);
}

Context::~Context() {
  if (ctx_) ucp_cleanup(ctx_);
}

// ---- endpoint -----------------------------------------------------------------------------------

class Request {
 public:
  Endpoint::Impl* owner = nullptr;
  bool in_use = false;
  bool is_recv = false;
  int n = 0;
  std::vector<Op> ops;
};

struct Endpoint::Impl {
  Endpoint* self = nullptr;
  std::shared_ptr<Context> ctx;
  ucp_worker_h worker = nullptr;
  ucp_ep_h ep = nullptr;
  std::shared_ptr<ucs_status_t> ep_status;  // written by on_ep_error (peer failure)
  std::string peer;
  std::vector<Request> pool;
  std::vector<int> free_ids;
  bool sent = false;  // a flush at close matters only for an endpoint that sent data
  Clock::time_point failed_at{};  // when test() first saw the peer gone
  long timeout_ms = 0;

  // Closing, one non-blocking step per poll_close() (see Endpoint::~Endpoint for the why).
  enum class Close { kOpen, kCancelling, kFlushing, kClosing, kClosed };
  Close close = Close::kOpen;
  Clock::time_point close_deadline{};
  Op flush;
  ucs_status_ptr_t close_req = nullptr;

  bool requests_done() const {
    for (const Request& r : pool)
      if (r.in_use)
        for (int i = 0; i < r.n; ++i)
          if (!r.ops[static_cast<size_t>(i)].done) return false;
    return true;
  }
  void set_deadline(long ms) { close_deadline = Clock::now() + std::chrono::milliseconds(std::min(timeout_ms, ms)); }
  // True once the endpoint and its worker are gone.
  bool poll_close() {
    if (close == Close::kClosed) return true;
    if (close == Close::kOpen) {
      for (Request& r : pool)
        if (r.in_use)
          for (int i = 0; i < r.n; ++i)
            if (r.ops[static_cast<size_t>(i)].req) ucp_request_cancel(worker, r.ops[static_cast<size_t>(i)].req);
      close = Close::kCancelling;
      set_deadline(2000);
    }
    ucp_worker_progress(worker);
    const bool late = Clock::now() > close_deadline;
    if (close == Close::kCancelling && (requests_done() || late)) {
      if (sent && *ep_status == UCS_OK) {
        ucp_request_param_t p = send_param(&flush);
        start_op(&flush, ucp_ep_flush_nbx(ep, &p));
        close = Close::kFlushing;
        set_deadline(10000);
        return false;
      }
      close = Close::kFlushing;
    }
    if (close == Close::kFlushing && (flush.done || !sent || *ep_status != UCS_OK || late)) {
      // Force: the flush (if any) is over or given up; the peer owes nothing more.
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      close_req = ucp_ep_close_nbx(ep, &p);
      if (close_req == nullptr || UCS_PTR_IS_ERR(close_req)) close_req = nullptr;
      close = Close::kClosing;
      set_deadline(2000);
      return false;
    }
    if (close == Close::kClosing) {
      const bool over = close_req == nullptr || ucp_request_check_status(close_req) != UCS_INPROGRESS;
      if (!over && !late) return false;
      if (close_req) ucp_request_free(close_req);
      close_req = nullptr;
      ucp_worker_destroy(worker);  // completes (cancels) whatever UCX still held
      worker = nullptr;
      ep = nullptr;
      close = Close::kClosed;
      return true;
    }
    return false;
  }

  Request* take() {
    if (free_ids.empty()) return nullptr;
    Request* r = &pool[static_cast<size_t>(free_ids.back())];
    free_ids.pop_back();
    r->in_use = true;
    return r;
  }
  void release(Request* r) {
    r->in_use = false;
    free_ids.push_back(static_cast<int>(r - pool.data()));
  }
  void check_peer() const {
    if (*ep_status != UCS_OK)
      fail(Status::kTransport, "ucx connection to " + peer + " failed: " + ucs_status_string(*ep_status));
  }
};

Endpoint* endpoint_of(const Request* r) { return r && r->in_use && r->owner ? r->owner->self : nullptr; }
int buffers_of(const Request* r) { return r && r->in_use ? r->n : 0; }

Endpoint::Endpoint(std::shared_ptr<Context> ctx, ucp_worker_h worker, ucp_ep_h ep, const Limits& limits,
                   std::shared_ptr<ucs_status_t> ep_status, std::string peer)
    : d_(std::make_unique<Impl>()), limits_(limits) {
  d_->self = this;
  d_->ctx = std::move(ctx);
  d_->worker = worker;
  d_->ep = ep;
  d_->ep_status = std::move(ep_status);
  d_->peer = std::move(peer);
  d_->timeout_ms = limits.timeout_ms;
  d_->pool.resize(static_cast<size_t>(limits.max_requests));
  for (int i = limits.max_requests - 1; i >= 0; --i) {
    d_->pool[static_cast<size_t>(i)].owner = d_.get();
    d_->pool[static_cast<size_t>(i)].ops.resize(static_cast<size_t>(limits.max_recvs));
    d_->free_ids.push_back(i);
  }
}

Endpoint::~Endpoint() {
  // What NCCL left in flight is cancelled; then, on an endpoint that sent, a flush, so that data
  // whose send completed locally (eager: possibly still in UCX's buffers) reaches the peer before
  // the connection goes. The flush needs the peer's progress (UCX completes it with a round trip),
  // which a peer that only closes later gives late: close_in_background() does this off the
  // caller's thread. An endpoint that only received skips the flush.
  while (!d_->poll_close()) std::this_thread::yield();
}

namespace {

// The process's closer: endpoints handed over by close_in_background(), each stepped until
// closed. Stopped (everything forced closed) when the library is unloaded or the process exits,
// before UCX's own finalisation.
class Closer {
 public:
  ~Closer() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }
  void add(std::unique_ptr<Endpoint> ep) {
    std::lock_guard<std::mutex> lk(mu_);
    incoming_.push_back(std::move(ep));
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    cv_.notify_one();
  }

 private:
  void run() {
    std::vector<std::unique_ptr<Endpoint>> closing;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !incoming_.empty() || !closing.empty(); });
        for (auto& e : incoming_) closing.push_back(std::move(e));
        incoming_.clear();
        if (stop_) break;
      }
      for (size_t i = 0; i < closing.size(); ++i)
        if (Endpoint::poll_close(*closing[i])) {
          closing.erase(closing.begin() + static_cast<long>(i));
          --i;
        }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    // Exiting: no more waiting for peers, only what UCX needs to let go.
    for (auto& e : closing) Endpoint::hurry(*e);
    closing.clear();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<std::unique_ptr<Endpoint>> incoming_;
  std::thread thread_;
};

Closer& closer() {
  static Closer c;
  return c;
}

}  // namespace

bool Endpoint::poll_close(Endpoint& e) { return e.d_->poll_close(); }
void Endpoint::hurry(Endpoint& e) {
  e.d_->timeout_ms = 0;
  e.d_->close_deadline = Clock::now();
}

void close_in_background(std::unique_ptr<Endpoint> ep) {
  if (ep) closer().add(std::move(ep));
}

Request* Endpoint::send(const void* data, size_t size, uint32_t tag) {
  d_->check_peer();
  Request* r = d_->take();
  if (!r) return nullptr;
  r->n = 1;
  r->is_recv = false;
  d_->sent = true;
  Op* op = &r->ops[0];
  *op = Op{};
  ucp_request_param_t p = send_param(op);
  start_op(op, ucp_tag_send_nbx(d_->ep, data, size, data_tag(tag), &p));
  op->length = size;
  if (op->done && op->status != UCS_OK) {
    const ucs_status_t st = op->status;
    d_->release(r);
    fail(Status::kTransport, "ucx send of " + std::to_string(size) + " bytes to " + d_->peer + ": " + ucs_status_string(st));
  }
  return r;
}

Request* Endpoint::recv(int n, void* const* data, const size_t* sizes, const uint32_t* tags) {
  if (n < 1 || n > limits_.max_recvs)
    fail(Status::kInvalidArgument, "ucx recv of " + std::to_string(n) + " buffers (1.." + std::to_string(limits_.max_recvs) + ")");
  // No check of the peer here: messages it sent before closing may wait in the worker's
  // unexpected queue, and test() decides (after a grace period) what never came.
  Request* r = d_->take();
  if (!r) return nullptr;
  r->n = n;
  r->is_recv = true;
  // A buffer that cannot be posted fails its own slot; test() reports it once the others are
  // done (cancelling the posted ones here could race with their completion).
  for (int i = 0; i < n; ++i) post_recv(&r->ops[static_cast<size_t>(i)], d_->worker, data[i], sizes[i], data_tag(tags[i]));
  return r;
}

bool Endpoint::test(Request* r, size_t* sizes) {
  if (!r || r->owner != d_.get() || !r->in_use) fail(Status::kInvalidArgument, "ucx test: not a request of this endpoint");
  for (int spin = 0; spin < 4 && ucp_worker_progress(d_->worker) != 0; ++spin) {
  }
  bool done = true;
  for (int i = 0; i < r->n; ++i) done = done && r->ops[static_cast<size_t>(i)].done;
  if (!done && *d_->ep_status != UCS_OK) {
    // A peer that sent everything and closed is not a failure for messages already on their
    // way: UCX may report the disconnect before it has delivered the last data, so a receive
    // gets a grace period to match before it is declared lost.
    const auto now = Clock::now();
    if (d_->failed_at == Clock::time_point{}) d_->failed_at = now;
    if (now - d_->failed_at < std::chrono::milliseconds(std::min<long>(limits_.timeout_ms, kGraceMs))) return false;
    // Tag receives belong to the worker, not to the endpoint: UCX does not fail them when the
    // peer goes, so they are cancelled here (their callbacks run during the progress below).
    for (int i = 0; i < r->n; ++i)
      if (r->ops[static_cast<size_t>(i)].req) ucp_request_cancel(d_->worker, r->ops[static_cast<size_t>(i)].req);
    const auto deadline = Clock::now() + std::chrono::milliseconds(std::min<long>(limits_.timeout_ms, 2000));
    progress_until(d_->worker, deadline, [&] {
      for (int i = 0; i < r->n; ++i)
        if (!r->ops[static_cast<size_t>(i)].done) return false;
      return true;
    });
    done = true;
    for (int i = 0; i < r->n; ++i) done = done && r->ops[static_cast<size_t>(i)].done;
    if (!done) return false;  // (a cancel that never completes: keep the slot, report later)
    d_->release(r);
    d_->check_peer();
  }
  if (!done) return false;
  std::string err;
  for (int i = 0; i < r->n; ++i) {
    const Op& op = r->ops[static_cast<size_t>(i)];
    if (sizes) sizes[i] = op.length;
    if (op.status != UCS_OK && err.empty()) {
      err = op.status == UCS_ERR_MESSAGE_TRUNCATED ? "message larger than the receive buffer" : ucs_status_string(op.status);
      err = std::string(r->is_recv ? "ucx receive from " : "ucx send to ") + d_->peer + " (buffer " + std::to_string(i) +
            " of " + std::to_string(r->n) + "): " + err;
    }
  }
  d_->release(r);
  if (!err.empty()) fail(Status::kTransport, err);
  return true;
}

std::string Endpoint::describe() const {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  if (!f) return "";
  ucp_ep_print_info(d_->ep, f);
  std::fclose(f);
  std::string s(buf, len);
  std::free(buf);
  return s;
}

// ---- listener -----------------------------------------------------------------------------------

struct Listener::Pending {
  ucp_worker_h worker = nullptr;
  ucp_ep_h ep = nullptr;
  std::shared_ptr<ucs_status_t> ep_status = std::make_shared<ucs_status_t>(UCS_OK);
  Hello hello{};
  Hello ack{};
  Op op;       // the hello's receive
  Op ack_op;   // the answer's send
  bool acking = false;
  Clock::time_point deadline;
  std::string peer;
  long timeout_ms = 0;

  ~Pending() {
    for (Op* o : {&op, &ack_op})
      if (o->req) {
        ucp_request_cancel(worker, o->req);
        progress_until(worker, Clock::now() + std::chrono::milliseconds(100), [&] { return o->done; });
      }
    close_and_destroy(worker, ep, std::min<long>(timeout_ms, 2000));
  }
};

Listener::Listener(std::shared_ptr<Context> ctx, const Limits& limits) : ctx_(std::move(ctx)), limits_(limits) {
  worker_ = make_worker(ctx_->get());
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr = ctx_->device().ipv4;
  sa.sin_port = 0;
  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
  lp.sockaddr.addrlen = sizeof sa;
  lp.conn_handler.cb = &Listener::on_conn_request;
  lp.conn_handler.arg = this;
  ucs_status_t st = ucp_listener_create(worker_, &lp, &listener_);
  if (st != UCS_OK) {
    ucp_worker_destroy(worker_);
    fail(Status::kTransport, "ucp_listener_create on " + ctx_->device().name + " (" + ipv4_string(sa.sin_addr) +
                                 "): " + ucs_status_string(st));
  }
  ucp_listener_attr_t la{};
  la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  st = ucp_listener_query(listener_, &la);
  if (st != UCS_OK || la.sockaddr.ss_family != AF_INET) {
    ucp_listener_destroy(listener_);
    ucp_worker_destroy(worker_);
    fail(Status::kTransport, std::string("ucp_listener_query: ") + ucs_status_string(st));
  }
  const auto* bound = reinterpret_cast<const sockaddr_in*>(&la.sockaddr);
  addr_.magic = Address::kMagic;
  addr_.version = Address::kVersion;
  addr_.port_be = bound->sin_port;
  addr_.ipv4_be = sa.sin_addr.s_addr;
  addr_.nonce = random64();
}

Listener::~Listener() {
  pending_.clear();
  for (ucp_conn_request_h r : requests_) ucp_listener_reject(listener_, r);
  ucp_listener_destroy(listener_);
  ucp_worker_destroy(worker_);
}

void Listener::on_conn_request(ucp_conn_request_h req, void* arg) { static_cast<Listener*>(arg)->requests_.push_back(req); }

std::unique_ptr<Endpoint> Listener::poll_accept() {
  for (int spin = 0; spin < 4 && ucp_worker_progress(worker_) != 0; ++spin) {
  }
  while (!requests_.empty()) {
    ucp_conn_request_h req = requests_.front();
    requests_.pop_front();
    auto p = std::make_unique<Pending>();
    p->timeout_ms = limits_.timeout_ms;
    p->deadline = Clock::now() + std::chrono::milliseconds(limits_.timeout_ms);
    ucp_conn_request_attr_t ca{};
    ca.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    if (ucp_conn_request_query(req, &ca) == UCS_OK && ca.client_address.ss_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(&ca.client_address);
      p->peer = ipv4_string(a->sin_addr) + ":" + std::to_string(ntohs(a->sin_port));
    } else {
      p->peer = "a peer";
    }
    // The endpoint gets a worker of its own (UCX allows accepting on any worker), so that the
    // connection can move to another thread independently of this listener.
    p->worker = make_worker(ctx_->get());
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.conn_request = req;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = on_ep_error;
    ep.err_handler.arg = p->ep_status.get();
    const ucs_status_t st = ucp_ep_create(p->worker, &ep, &p->ep);
    if (st != UCS_OK) {
      // The request is consumed either way; a connection that cannot be accepted is dropped,
      // like one whose hello is wrong.
      p->ep = nullptr;
      continue;
    }
    post_recv(&p->op, p->worker, &p->hello, sizeof p->hello, kHelloTag);
    pending_.push_back(std::move(p));
  }
  for (size_t i = 0; i < pending_.size(); ++i) {
    Pending& p = *pending_[i];
    for (int spin = 0; spin < 4 && ucp_worker_progress(p.worker) != 0; ++spin) {
    }
    const bool hello_ok = p.op.done && p.op.status == UCS_OK && p.op.length == sizeof(Hello) &&
                          p.hello.magic == Address::kMagic && p.hello.nonce == addr_.nonce;
    // The answer travels back over this endpoint: once it is sent, both directions of the
    // connection are wired up, so that no later flush waits on a half-finished wireup (which
    // would need the peer's progress at an arbitrary moment, e.g. while it is closing).
    if (hello_ok && !p.acking && *p.ep_status == UCS_OK) {
      p.acking = true;
      p.ack = p.hello;
      ucp_request_param_t sp = send_param(&p.ack_op);
      start_op(&p.ack_op, ucp_tag_send_nbx(p.ep, &p.ack, sizeof p.ack, kAckTag, &sp));
    }
    if (p.acking && p.ack_op.done && p.ack_op.status == UCS_OK && *p.ep_status == UCS_OK) {
      std::unique_ptr<Endpoint> e(new Endpoint(ctx_, p.worker, p.ep, limits_, p.ep_status, p.peer));
      p.worker = nullptr;
      p.ep = nullptr;
      pending_.erase(pending_.begin() + static_cast<long>(i));
      return e;
    }
    if ((p.op.done && !hello_ok) || (p.ack_op.done && p.ack_op.status != UCS_OK) || *p.ep_status != UCS_OK ||
        Clock::now() > p.deadline) {
      pending_.erase(pending_.begin() + static_cast<long>(i));
      --i;
    }
  }
  return nullptr;
}

// ---- connector ----------------------------------------------------------------------------------

struct Connector::State {
  std::shared_ptr<Context> ctx;
  Limits limits;
  ucp_worker_h worker = nullptr;
  ucp_ep_h ep = nullptr;
  std::shared_ptr<ucs_status_t> ep_status = std::make_shared<ucs_status_t>(UCS_OK);
  Hello hello{};
  Hello ack{};
  Op send;  // the hello
  Op recv;  // the listener's answer
  Clock::time_point deadline;
  std::string peer;

  ~State() {
    for (Op* op : {&send, &recv})
      if (op->req) {
        ucp_request_cancel(worker, op->req);
        progress_until(worker, Clock::now() + std::chrono::milliseconds(100), [&] { return op->done; });
      }
    close_and_destroy(worker, ep, std::min<long>(limits.timeout_ms, 2000));
  }
};

Connector::Connector(std::shared_ptr<Context> ctx, const Address& to, const Limits& limits)
    : s_(std::make_unique<State>()) {
  if (to.magic != Address::kMagic || to.version != Address::kVersion)
    fail(Status::kInvalidArgument, "ucx connect: not a thc UCX address (magic/version mismatch)");
  s_->ctx = std::move(ctx);
  s_->limits = limits;
  s_->deadline = Clock::now() + std::chrono::milliseconds(limits.timeout_ms);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = to.port_be;
  sa.sin_addr.s_addr = to.ipv4_be;
  s_->peer = ipv4_string(sa.sin_addr) + ":" + std::to_string(ntohs(to.port_be));
  s_->worker = make_worker(s_->ctx->get());
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
  ep.sockaddr.addrlen = sizeof sa;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = on_ep_error;
  ep.err_handler.arg = s_->ep_status.get();
  const ucs_status_t st = ucp_ep_create(s_->worker, &ep, &s_->ep);
  if (st != UCS_OK) {
    s_->ep = nullptr;
    fail(Status::kTransport, "ucp_ep_create to " + s_->peer + ": " + ucs_status_string(st));
  }
  s_->hello.magic = Address::kMagic;
  s_->hello.nonce = to.nonce;
  post_recv(&s_->recv, s_->worker, &s_->ack, sizeof s_->ack, kAckTag);
  ucp_request_param_t p = send_param(&s_->send);
  start_op(&s_->send, ucp_tag_send_nbx(s_->ep, &s_->hello, sizeof s_->hello, kHelloTag, &p));
}

Connector::~Connector() = default;

std::unique_ptr<Endpoint> Connector::poll() {
  State& s = *s_;
  for (int spin = 0; spin < 4 && ucp_worker_progress(s.worker) != 0; ++spin) {
  }
  if (*s.ep_status != UCS_OK)
    fail(Status::kTransport, "ucx connect to " + s.peer + ": " + ucs_status_string(*s.ep_status));
  if (s.send.done && s.send.status != UCS_OK)
    fail(Status::kTransport, "ucx connect to " + s.peer + " (hello): " + ucs_status_string(s.send.status));
  if (s.recv.done && s.recv.status != UCS_OK)
    fail(Status::kTransport, "ucx connect to " + s.peer + " (answer): " + ucs_status_string(s.recv.status));
  // Up once the listener answered the hello over this endpoint: both directions are wired.
  if (s.send.done && s.recv.done) {
    if (s.recv.length != sizeof(Hello) || s.ack.magic != Address::kMagic || s.ack.nonce != s.hello.nonce)
      fail(Status::kTransport, "ucx connect to " + s.peer + ": the listener's answer does not match the hello");
    std::unique_ptr<Endpoint> e(new Endpoint(s.ctx, s.worker, s.ep, s.limits, s.ep_status, s.peer));
    s.worker = nullptr;
    s.ep = nullptr;
    return e;
  }
  if (Clock::now() > s.deadline)
    fail(Status::kTimeout, "ucx connect to " + s.peer + ": no connection after " + std::to_string(s.limits.timeout_ms) +
                               " ms (THC_TIMEOUT_MS)");
  return nullptr;
}

}  // namespace thc::transport::ucx
