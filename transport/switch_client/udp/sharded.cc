// make_aggregator_reducer: one job over several aggregator job instances (addresses x shards).
// Every operation is split into contiguous parts at multiples of the engine's granule, one part
// per instance (rotating which instance takes the first part, so small operations spread too);
// every worker splits identically, so each instance sees the same operation sequence from all
// workers. Each part completes with its own contributor set (partial aggregation is decided per
// instance), which Request::parts() reports to the engine.
#include <poll.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <sstream>

#include "common/net.h"
#include "common/status.h"
#include "common/sys_check.h"
#include "switch_offload/protocol/wire.h"
#include "transport/switch_client/udp/udp_client.h"

namespace thc::transport {

namespace proto = switch_offload::proto;

namespace {

// Bytes of one integer of type t (the transport layer does not link the codec).
size_t width(IntType t) {
  switch (t) {
    case IntType::kU8: case IntType::kI8: return 1;
    case IntType::kU16: case IntType::kI16: return 2;
    default: return 4;
  }
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t b = item.find_first_not_of(" \t");
    const size_t e = item.find_last_not_of(" \t");
    if (b == std::string::npos) continue;
    out.push_back(item.substr(b, e - b + 1));
  }
  return out;
}

class ShardedReducer;

class ShardedRequest final : public Request {
 public:
  ShardedRequest(ShardedReducer* r, std::vector<Part> parts, std::vector<std::unique_ptr<Request>> reqs)
      : r_(r), parts_(std::move(parts)), reqs_(std::move(reqs)) {}
  bool test() override;
  void wait() override;
  int contributors() const override {
    int c = std::numeric_limits<int>::max();
    for (const Part& p : parts_) c = std::min(c, p.contributors);
    return parts_.empty() ? -1 : c;
  }
  bool self_counted() const override {
    for (const Part& p : parts_)
      if (!p.self_counted) return false;
    return true;
  }
  std::vector<Part> parts() const override { return parts_; }

 private:
  void collect() {
    for (size_t i = 0; i < reqs_.size(); ++i) {
      parts_[i].contributors = reqs_[i]->contributors();
      parts_[i].self_counted = reqs_[i]->self_counted();
    }
  }
  ShardedReducer* r_;
  std::vector<Part> parts_;
  std::vector<std::unique_ptr<Request>> reqs_;
  bool done_ = false;
};

class ShardedReducer final : public Reducer {
 public:
  explicit ShardedReducer(std::vector<std::unique_ptr<UdpReducer>> subs) : subs_(std::move(subs)) {}

  int rank() const override { return subs_[0]->rank(); }
  int size() const override { return subs_[0]->size(); }
  std::string name() const override {
    return subs_[0]->name() + " x" + std::to_string(subs_.size());
  }
  bool prefers_index_form() const override { return true; }
  bool partial_results() const override { return true; }
  void set_part_granule(uint64_t g) override { granule_ = g; }

  void max_u32(uint32_t* data, size_t n) override {
    // Small (block statistics), and the op that starts every collective call: every instance
    // takes all of it (a worker that rejoins an instance comes back at such an op), and all give
    // the same maximum.
    std::vector<std::vector<uint32_t>> copies(subs_.size() - 1, std::vector<uint32_t>(data, data + n));
    for (size_t i = 1; i < subs_.size(); ++i) subs_[i]->max_u32(copies[i - 1].data(), n);
    subs_[0]->max_u32(data, n);
  }

  std::unique_ptr<Request> start_sum(void* data, uint64_t count, IntType type) override {
    const size_t w = width(type);
    return start(count, 0, [&](UdpReducer& s, uint64_t first, uint64_t cnt) {
      return s.start_sum(static_cast<uint8_t*>(data) + first * w, cnt, type);
    });
  }

  std::unique_ptr<Request> start_lookup_sum(const uint8_t* packed, uint64_t count, const LookupTable& table, void* sums,
                                            IntType type, const DownstreamCodec* down) override {
    const size_t w = width(type);
    return start(count, table.bits, [&](UdpReducer& s, uint64_t first, uint64_t cnt) {
      return s.start_lookup_sum(packed + first * static_cast<uint64_t>(table.bits) / 8, cnt, table,
                                static_cast<uint8_t*>(sums) + first * w, type, down);
    });
  }

  bool wire_counters(WireCounters* out) const override {
    WireCounters t;
    for (const auto& x : subs_) {
      WireCounters c;
      x->wire_counters(&c);
      t.bytes_sent += c.bytes_sent;
      t.bytes_received += c.bytes_received;
      t.packets += c.packets;
      t.retransmissions += c.retransmissions;
    }
    *out = t;
    return true;
  }
  std::string wire_stats() const override {
    std::string out;
    for (size_t i = 0; i < subs_.size(); ++i) out += (i ? "; " : "") + std::string("[") + std::to_string(i) + "] " + subs_[i]->wire_stats();
    return out;
  }

  // Progress every instance, then sleep until one of them needs attention (or max_us).
  void progress_all() {
    for (auto& s : subs_) InstanceView::progress(*s);
  }
  void wait_any(uint64_t max_us) {
    const uint64_t now = mono_us();
    uint64_t due = now + max_us;
    std::vector<pollfd> fds;
    for (auto& s : subs_) {
      if (InstanceView::pending(*s)) return;
      due = std::min(due, InstanceView::next_due(*s, now));
      const int fd = InstanceView::fd(*s);
      if (fd >= 0) fds.push_back(pollfd{fd, POLLIN, 0});
    }
    const uint64_t t = due <= now ? 0 : due - now;
    if (fds.size() != subs_.size()) {
      // A channel without a descriptor (DPDK) is polled: nap briefly.
      timespec ts{0, static_cast<long>(std::min<uint64_t>(t, 50) * 1000)};
      (void)THC_SYS(::ppoll(fds.data(), fds.size(), &ts, nullptr));
      return;
    }
    timespec ts{static_cast<time_t>(t / 1'000'000), static_cast<long>((t % 1'000'000) * 1000)};
    (void)THC_SYS(::ppoll(fds.data(), fds.size(), &ts, nullptr));
  }

 private:
  template <typename StartFn>
  std::unique_ptr<Request> start(uint64_t count, int bits, StartFn fn) {
    const size_t n = subs_.size();
    const uint32_t rot = calls_++;
    std::vector<Request::Part> parts;
    std::vector<std::unique_ptr<Request>> reqs;
    uint64_t g = granule_;
    // Parts must start on a byte of the packed indices and on a granule (a codec block).
    if (g == 0 || (bits && (g * static_cast<uint64_t>(bits)) % 8 != 0)) g = count ? count : 1;
    const uint64_t granules = (count + g - 1) / g;
    const uint64_t nparts = std::max<uint64_t>(1, std::min<uint64_t>(n, granules));
    const uint64_t per = (granules + nparts - 1) / nparts;
    uint64_t first = 0;
    for (uint64_t i = 0; i < nparts && (first < count || i == 0); ++i) {
      const uint64_t cnt = std::min(count - first, per * g);
      UdpReducer& s = *subs_[(rot + i) % n];
      Request::Part p;
      p.first = first;
      p.count = cnt;
      parts.push_back(p);
      reqs.push_back(fn(s, first, cnt));
      first += cnt;
    }
    return std::make_unique<ShardedRequest>(this, std::move(parts), std::move(reqs));
  }

  std::vector<std::unique_ptr<UdpReducer>> subs_;
  uint64_t granule_ = 0;
  uint32_t calls_ = 0;
};

bool ShardedRequest::test() {
  if (done_) return true;
  // Every instance, not only this request's: retransmissions and pacing of earlier operations
  // (and of parts of other requests) are due too.
  r_->progress_all();
  bool all = true;
  for (auto& q : reqs_) all = q->test() && all;
  if (all) {
    // Raise a part's failure now rather than report success.
    for (auto& q : reqs_) q->wait();
    collect();
    done_ = true;
  }
  return done_;
}

void ShardedRequest::wait() {
  while (!done_) {
    r_->progress_all();
    bool all = true;
    for (auto& q : reqs_) all = q->test() && all;
    if (all) break;
    r_->wait_any(20'000);
  }
  for (auto& q : reqs_) q->wait();
  collect();
  done_ = true;
}

}  // namespace

std::unique_ptr<Reducer> make_aggregator_reducer(const UdpClientOptions& opt, ChannelFactory dpdk, const void* ctx) {
  const std::vector<std::string> addrs = split_list(opt.address);
  if (addrs.empty()) fail(Status::kInvalidArgument, "aggregator address list '" + opt.address + "' is empty");
  std::vector<std::unique_ptr<UdpReducer>> subs;
  for (const std::string& a : addrs) {
    const bool is_dpdk = a.rfind("dpdk://", 0) == 0;
    if (!is_dpdk && a.rfind("udp://", 0) != 0)
      fail(Status::kInvalidArgument,
           "unsupported aggregator address '" + a + "' (expected udp://HOST:PORT or dpdk://IPv4:PORT, comma-separated)");
    if (is_dpdk && !dpdk)
      fail(Status::kUnsupported, "dpdk:// aggregator '" + a + "': this build has no DPDK client (THC_WITH_DPDK)");
    UdpClientOptions o = opt;
    o.address = a;
    o.shard = 0;
    auto first = std::make_unique<UdpReducer>(o, is_dpdk ? dpdk(a, ctx) : nullptr);
    int shards = first->shards_offered();
    // The DPDK client has one channel per process: it uses one instance per address.
    if (is_dpdk) shards = 1;
    if (opt.max_shards > 0) shards = std::min(shards, opt.max_shards);
    subs.push_back(std::move(first));
    for (int s = 1; s < shards; ++s) {
      o.shard = static_cast<uint16_t>(s);
      subs.push_back(std::make_unique<UdpReducer>(o));
    }
  }
  if (subs.size() == 1) return std::move(subs[0]);
  return std::make_unique<ShardedReducer>(std::move(subs));
}

std::unique_ptr<Reducer> make_udp_client(const UdpClientOptions& opt) { return make_aggregator_reducer(opt); }

}  // namespace thc::transport
