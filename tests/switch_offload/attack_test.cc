// Attacks on the authenticated aggregation protocol (protocol version 3) by a stranger on the same
// network as a running job (issue 15, "Hardening"; replays, restarts and tenants: issue 19). Every
// test runs a real thc-aggregator process and real workers (UdpReducer on threads, the shared
// workload plan of workload.h with its exact expected result) while an attacker without the job's
// key works against them. The attacker sees copies of the job's datagrams, as a sniffer on the
// path would: each worker's channel is a tap around the real UDP channel that records what the
// worker sends and receives. Where the test has CAP_NET_RAW, the attacker also forges source
// addresses (raw IPv4 socket on loopback), as anyone on a LAN can; those tests skip, saying so,
// without it.
//
// Each attack checks that the workers' results stay bit-identical to the exact sums and no worker
// fails, that the aggregator counts what it dropped under the reason, and that the attacker (or a
// victim whose address it claims) receives nothing, or no more bytes than it sent.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "switch_offload/aggregator/stats.h"
#include "switch_offload/protocol/auth.h"
#include "switch_offload/protocol/builder.h"
#include "switch_offload/protocol/wire.h"
#include "tests/barrier.h"
#include "tests/switch_offload/aggregator_process.h"
#include "tests/transport/switch_client/workload.h"
#include "transport/switch_client/channel.h"
#include "transport/switch_client/udp/udp_client.h"

namespace {

namespace proto = thc::switch_offload::proto;
namespace auth = thc::switch_offload::auth;
using proto::MsgType;
using thc::test::AggregatorProcess;
using thc::test::stats_nonce;
using thc::test::test_key;
using thc::transport::DatagramChannel;
using thc::transport::IntType;
using thc::transport::LookupTable;
using thc::transport::Reducer;
using thc::transport::UdpClientOptions;
using thc::transport::UdpClientStats;
using thc::transport::UdpReducer;
using Bytes = std::vector<uint8_t>;

constexpr int kSlots = 32;  // the workers ask for 32 slots (the aggregator grants up to 4096)

sockaddr_in sin4(const std::string& ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1) throw std::runtime_error("not an IPv4 address: " + ip);
  return a;
}

// ---- the attacker's sockets ---------------------------------------------------------------------

// An unconnected UDP socket: the attacker's own endpoint, or a victim's whose address the attacker
// claims. Counts what it sends and what it receives.
class Sock {
 public:
  explicit Sock(const std::string& ip = "127.0.0.1") : ip_(ip) {
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_in a = sin4(ip, 0);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      throw std::runtime_error("bind " + ip + ": " + std::strerror(errno));
    const int big = 4 << 20;
    (void)::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~Sock() { ::close(fd_); }
  Sock(const Sock&) = delete;
  Sock& operator=(const Sock&) = delete;

  uint16_t port() const { return port_; }
  const std::string& ip() const { return ip_; }

  void send(const std::string& ip, uint16_t port, const Bytes& p) {
    const sockaddr_in a = sin4(ip, port);
    for (int tries = 0; tries < 1000; ++tries) {
      if (::sendto(fd_, p.data(), p.size(), 0, reinterpret_cast<const sockaddr*>(&a), sizeof a) >= 0) break;
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOBUFS) break;
      pollfd w{fd_, POLLOUT, 0};
      ::poll(&w, 1, 10);
    }
    sent_bytes += p.size();
    ++sent;
  }
  // Receive until one more datagram arrived, or ms passed; whether one did.
  bool wait_one(int ms) {
    const size_t before = got.size();
    return wait_for([&] { return got.size() > before; }, ms);
  }
  // Receive until pred() holds, or ms passed; whether it holds. (Replies are awaited, never
  // assumed to arrive within a fixed time: the machine may be slow, e.g. under a sanitizer.)
  bool wait_for(const std::function<bool()>& pred, int ms) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (!pred()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now()).count();
      if (left <= 0) return false;
      pollfd r{fd_, POLLIN, 0};
      if (::poll(&r, 1, static_cast<int>(left)) <= 0) continue;
      Bytes b(70000);
      const ssize_t n = ::recv(fd_, b.data(), b.size(), 0);
      if (n < 0) continue;
      got.emplace_back(b.begin(), b.begin() + n);
      recv_bytes += static_cast<uint64_t>(n);
    }
    return true;
  }
  // Receive until nothing arrives for quiet_ms.
  void drain(int quiet_ms) {
    Bytes b(70000);
    for (;;) {
      pollfd r{fd_, POLLIN, 0};
      if (::poll(&r, 1, quiet_ms) <= 0) return;
      for (;;) {
        const ssize_t n = ::recv(fd_, b.data(), b.size(), 0);
        if (n < 0) break;
        got.emplace_back(b.begin(), b.begin() + n);
        recv_bytes += static_cast<uint64_t>(n);
      }
    }
  }

  uint64_t sent = 0, sent_bytes = 0, recv_bytes = 0;
  std::vector<Bytes> got;

 private:
  std::string ip_;
  int fd_ = -1;
  uint16_t port_ = 0;
};

// Datagrams with a forged IPv4 source (raw socket, IP_HDRINCL). Needs CAP_NET_RAW.
class Spoofer {
 public:
  Spoofer() : fd_(::socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW)), err_(fd_ < 0 ? errno : 0) {}
  ~Spoofer() {
    if (fd_ >= 0) ::close(fd_);
  }
  Spoofer(const Spoofer&) = delete;
  Spoofer& operator=(const Spoofer&) = delete;
  bool ok() const { return fd_ >= 0; }
  std::string why() const { return std::strerror(err_); }

  // Thread-safe (one sendto per datagram).
  void send(const std::string& src_ip, uint16_t src_port, const std::string& dst_ip, uint16_t dst_port,
            const Bytes& p) {
    const sockaddr_in src = sin4(src_ip, src_port), dst = sin4(dst_ip, dst_port);
    Bytes f(28 + p.size());
    f[0] = 0x45;                                  // IPv4, 20-byte header
    proto::store_be16(&f[2], static_cast<uint16_t>(f.size()));
    f[6] = 0x40;                                  // don't fragment
    f[8] = 64;                                    // TTL
    f[9] = IPPROTO_UDP;                           // the kernel fills id and header checksum
    std::memcpy(&f[12], &src.sin_addr, 4);
    std::memcpy(&f[16], &dst.sin_addr, 4);
    std::memcpy(&f[20], &src.sin_port, 2);
    std::memcpy(&f[22], &dst.sin_port, 2);
    proto::store_be16(&f[24], static_cast<uint16_t>(8 + p.size()));
    // UDP checksum 0: none (IPv4).
    std::copy(p.begin(), p.end(), f.begin() + 28);
    (void)::sendto(fd_, f.data(), f.size(), 0, reinterpret_cast<const sockaddr*>(&dst), sizeof dst);
    ++sent;
  }
  std::atomic<uint64_t> sent{0};

 private:
  int fd_ = -1;
  int err_ = 0;
};

#define REQUIRE_SPOOFING(sp) \
  if (!(sp).ok()) GTEST_SKIP() << "forging source addresses needs CAP_NET_RAW (raw socket: " << (sp).why() << ")"

// ---- the sniffer --------------------------------------------------------------------------------

struct Seen {
  int rank = 0;
  bool up = true;  // worker -> aggregator
  Bytes b;
  proto::Header h;
  bool parsed = false;
};

class Capture {
 public:
  void add(int rank, bool up, const uint8_t* p, size_t n) {
    Seen s;
    s.rank = rank;
    s.up = up;
    s.b.assign(p, p + n);
    const uint8_t* pl;
    size_t plen;
    s.parsed = proto::parse(p, n, &s.h, &pl, &plen) == proto::ParseError::kOk;
    std::lock_guard<std::mutex> lk(mu_);
    v_.push_back(std::move(s));
  }
  size_t size() const {
    std::lock_guard<std::mutex> lk(mu_);
    return v_.size();
  }
  // Parsed datagrams from index `from` on, of the given direction and types (empty: any), of
  // `rank` (-1: any).
  std::vector<Seen> select(bool up, std::vector<MsgType> types, int rank = -1, size_t from = 0) const {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<Seen> out;
    for (size_t i = from; i < v_.size(); ++i) {
      const Seen& s = v_[i];
      if (!s.parsed || s.up != up || (rank >= 0 && s.rank != rank)) continue;
      if (!types.empty() && std::find(types.begin(), types.end(), s.h.type) == types.end()) continue;
      out.push_back(s);
    }
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::vector<Seen> v_;
};

const std::vector<MsgType> kDataTypes = {MsgType::kDataValue, MsgType::kDataIndex, MsgType::kDataMax};

// The real UDP channel with a tap: everything the worker sends or receives is also recorded.
// on_send (optional) sees each datagram as the worker hands it over, before it leaves: an attacker
// that reacts to what it sees and whose answer arrives before the aggregator's.
class TapChannel final : public DatagramChannel {
 public:
  using OnSend = std::function<void(int rank, const Bytes& sent)>;
  TapChannel(const std::string& url, Capture* cap, int rank, OnSend on_send = nullptr)
      : in_(thc::transport::make_udp_channel(url)), cap_(cap), rank_(rank), on_send_(std::move(on_send)) {}
  void send(const uint8_t* p, size_t n) override {
    cap_->add(rank_, true, p, n);
    if (on_send_) on_send_(rank_, Bytes(p, p + n));
    in_->send(p, n);
  }
  void flush() override { in_->flush(); }
  size_t recv(uint8_t* buf, size_t cap) override {
    const size_t n = in_->recv(buf, cap);
    if (n) cap_->add(rank_, false, buf, n);
    return n;
  }
  void wait_us(uint64_t t) override { in_->wait_us(t); }
  int poll_fd() const override { return in_->poll_fd(); }
  bool pending() const override { return in_->pending(); }
  int payload_budget() const override { return in_->payload_budget(); }
  std::string kind() const override { return in_->kind(); }
  std::string peer() const override { return in_->peer(); }
  std::string last_error() const override { return in_->last_error(); }
  // The worker's local port (what a sniffer reads off its datagrams).
  uint16_t port() const {
    sockaddr_in a{};
    socklen_t len = sizeof a;
    ::getsockname(in_->poll_fd(), reinterpret_cast<sockaddr*>(&a), &len);
    return ntohs(a.sin_port);
  }

 private:
  std::unique_ptr<DatagramChannel> in_;
  Capture* cap_;
  int rank_;
  OnSend on_send_;
};

// ---- counters -----------------------------------------------------------------------------------

struct Counters {
  std::vector<uint64_t> v;
  uint64_t operator[](const std::string& name) const {
    const uint64_t x = thc::switch_offload::stats_get(v, name);
    if (x == UINT64_MAX) ADD_FAILURE() << "the aggregator has no counter " << name;
    return x;
  }
};
Counters snap(AggregatorProcess& a) { return Counters{a.stats()}; }
uint64_t delta(const Counters& after, const Counters& before, const std::string& name) {
  return after[name] - before[name];
}
// Bytes of the STATS_REPLY that a snapshot's request drew (counted in tx_bytes by the next one).
uint64_t stats_reply_bytes(const Counters& c) { return proto::kHeaderBytes + 8 * c.v.size(); }

// ---- the job: real workers on threads, two phases with the attack in between and during ------

using Barrier = thc_testing::Barrier;

struct JobSpec {
  int world = 4;
  uint32_t label = 1;
  auth::Key key = test_key(1);
  uint64_t count = 1000;
  double max_wait_ms = 3000;  // an attack that stalls a worker fails the test in this time
  double rank0_drop = 0;      // client-side loss on rank 0: the capture then holds genuine retransmissions
  // Phase work (phase 0 or 1) and its exact result for a rank; default: the workload plan with salt
  // 7 + phase.
  std::function<Bytes(Reducer&, int rank, int phase)> work;
  std::function<Bytes(int rank, int phase)> expected;
};

struct JobRun {
  explicit JobRun(int world) : err(world), out(world), cstats(world), port(world, 0) {}
  std::vector<std::string> err;
  std::vector<std::array<Bytes, 2>> out;
  std::vector<UdpClientStats> cstats;
  std::vector<uint16_t> port;
  Capture cap;
};

struct Hooks {
  TapChannel::OnSend on_send;                                           // on the worker's thread
  std::function<void(int rank, uint16_t port)> before_join;             // on the worker's thread
  std::function<void(JobRun&)> after_join;                              // every worker joined
  std::function<void(JobRun&)> between;                                 // workers idle, job alive
  std::function<void(JobRun&, const std::atomic<bool>& stop)> during;   // concurrently with phase 2
};

uint64_t wl_elements(uint64_t count) {
  uint64_t n = 0;
  for (const auto& op : thc::test::wl_plan(count)) n += op.count;
  return n;
}

void run_job(const AggregatorProcess& agg, const JobSpec& spec, JobRun* run, const Hooks& hooks = {}) {
  const int W = spec.world;
  Barrier bar(W + 1);
  std::vector<std::thread> ts;
  for (int r = 0; r < W; ++r)
    ts.emplace_back([&, r] {
      std::unique_ptr<UdpReducer> red;
      auto step = [&](const std::function<void()>& fn) {
        if (!run->err[r].empty()) return;
        try {
          fn();
        } catch (const std::exception& e) {
          run->err[r] = e.what();
        }
      };
      step([&] {
        UdpClientOptions o;
        o.address = agg.url();
        o.rank = r;
        o.world = W;
        o.job_label = spec.label;
        o.key = spec.key;
        o.slots = kSlots;
        o.max_lanes = 256;
        o.max_wait_ms = spec.max_wait_ms;
        o.fault_from_env = false;
        if (r == 0 && spec.rank0_drop > 0) {
          o.fault.drop = spec.rank0_drop;
          o.fault.seed = 99;
        }
        auto ch = std::make_unique<TapChannel>(agg.url(), &run->cap, r, hooks.on_send);
        run->port[r] = ch->port();
        if (hooks.before_join) hooks.before_join(r, run->port[r]);
        red = std::make_unique<UdpReducer>(o, std::move(ch));
      });
      bar.arrive_and_wait();  // joined
      for (int phase = 0; phase < 2; ++phase) {
        if (phase == 1) bar.arrive_and_wait();  // the attack between the phases is over
        step([&] {
          run->out[r][phase] = spec.work ? spec.work(*red, r, phase) : thc::test::wl_run(*red, spec.count, 7 + phase).bytes;
        });
        bar.arrive_and_wait();
      }
      bar.arrive_and_wait();  // the attack during phase 1 stopped: nothing of it arrives after a LEAVE
      if (red) run->cstats[r] = red->stats();
      step([&] { red.reset(); });  // LEAVE
    });
  bar.arrive_and_wait();
  if (hooks.after_join) hooks.after_join(*run);
  bar.arrive_and_wait();  // phase 0 done
  if (hooks.between) hooks.between(*run);
  std::atomic<bool> stop{false};
  std::thread during;
  if (hooks.during) during = std::thread([&] { hooks.during(*run, stop); });
  bar.arrive_and_wait();  // phase 1 starts
  bar.arrive_and_wait();  // phase 1 done
  stop = true;
  if (during.joinable()) during.join();
  bar.arrive_and_wait();
  for (auto& t : ts) t.join();
}

Bytes expected_for(const JobSpec& spec, int rank, int phase) {
  return spec.expected ? spec.expected(rank, phase) : thc::test::wl_expected(spec.world, spec.count, 7 + phase);
}

// Every worker finished both phases with the exact result.
void expect_exact(const JobSpec& spec, const JobRun& run) {
  for (int r = 0; r < spec.world; ++r) {
    EXPECT_EQ(run.err[r], "") << "rank " << r << " failed";
    for (int ph = 0; ph < 2; ++ph)
      EXPECT_TRUE(run.out[r][ph] == expected_for(spec, r, ph)) << "rank " << r << " phase " << ph
                                                               << ": result differs from the exact sum";
  }
}

Bytes flip(Bytes p, size_t bit) {
  p[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  return p;
}
void set_tag(Bytes& p, uint64_t t) { proto::store_be64(p.data() + proto::kTagOffset, t); }

// A key nobody gave the aggregator, under the id of one it holds (forging under that id).
auth::Key stranger_key(uint32_t id) { return auth::generate_key(id); }

// A key holder's worker made by hand (a legitimate worker whose datagrams the attacker records):
// joins through the cookie challenge and sends value packets and control requests. Its control
// nonces grow from 1, like a real worker's within one life. Its socket also stands for an attacker
// that forges the worker's source address (a sniffer on the path can), once the worker is gone.
class HandWorker {
 public:
  HandWorker(AggregatorProcess& agg, uint32_t label, uint16_t world, uint16_t rank, const auth::Key& key = test_key(1),
             const std::string& ip = "127.0.0.1")
      : sock(ip), agg_(agg), j_(proto::JobId::make(key, label, world)), rank_(rank) {}
  // JOIN, CHALLENGE, JOIN with the cookie, JOIN_ACK.
  void join(const proto::JoinParams& jp) {
    sock.send(agg_.host(), agg_.port(), proto::make_join(j_, rank_, jp, ++nonce_));
    ASSERT_TRUE(sock.wait_one(5000));
    ASSERT_EQ(sock.got[0][5], static_cast<uint8_t>(MsgType::kChallenge));
    cookie_.assign(sock.got[0].begin() + proto::kHeaderBytes, sock.got[0].begin() + proto::kHeaderBytes + proto::kCookieBytes);
    jp_ = jp;
    const Bytes reply = join_again(0);
    ASSERT_FALSE(reply.empty());
    ASSERT_EQ(reply[5], static_cast<uint8_t>(MsgType::kJoinAck)) << "error " << proto::load_be32(reply.data() + 44);
    sock.got.clear();
  }
  // A JOIN with the cookie this worker holds (flags: e.g. kJoinRejoin) under the next nonce; the
  // reply (empty if none). A JOIN_ACK sets the seed and the job's shape.
  Bytes join_again(uint32_t flags) {
    proto::JoinParams withc = jp_;
    withc.cookie = cookie_.data();
    withc.flags = flags;
    last_join = proto::make_join(j_, rank_, withc, ++nonce_);
    const size_t from = sock.got.size();
    Bytes r;
    auto answer = [&] {  // the reply to this JOIN (results of earlier packets may come first)
      for (size_t i = from; i < sock.got.size(); ++i) {
        const Bytes& b = sock.got[i];
        if (b.size() >= proto::kHeaderBytes && proto::load_be64(b.data() + 32) == nonce_ &&
            (b[5] == static_cast<uint8_t>(MsgType::kJoinAck) || b[5] == static_cast<uint8_t>(MsgType::kError) ||
             b[5] == static_cast<uint8_t>(MsgType::kChallenge))) {
          r = b;
          return true;
        }
      }
      return false;
    };
    sock.send(agg_.host(), agg_.port(), last_join);
    if (!sock.wait_for(answer, 5000)) return {};
    if (r[5] == static_cast<uint8_t>(MsgType::kJoinAck)) {
      EXPECT_EQ(proto::parse_join_ack(r.data() + proto::kHeaderBytes, r.size() - proto::kHeaderBytes, &ack),
                proto::ParseError::kOk);
      j_.with_seed(ack.seed);
      slots_ = ack.slots;
      lanes_ = static_cast<uint16_t>(proto::lanes_for(MsgType::kDataValue, proto::WireInt::kU32, 0, ack.max_lanes, ack.payload_budget));
    }
    return r;
  }
  Bytes values(uint64_t seq, uint32_t op, uint32_t v, MsgType type = MsgType::kDataValue, bool first = false) const {
    Bytes p = proto::make_values(j_, rank_, slots_, seq, op, proto::WireInt::kU32, {v}, type,
                                 type == MsgType::kDataMax ? static_cast<uint16_t>(proto::lanes_for(type, proto::WireInt::kU32, 0, ack.max_lanes, ack.payload_budget)) : lanes_);
    if (first) {
      proto::store_be16(p.data() + 6, static_cast<uint16_t>(proto::load_be16(p.data() + 6) | proto::kFlagFirst));
      auth::sign(j_.dkey, p.data(), p.size());
    }
    return p;
  }
  Bytes resend(const Bytes& p, uint16_t attempt) const { return proto::as_resend(p, attempt, j_); }
  Bytes table(const proto::TableSpec& t) { return last_table = proto::make_table(j_, rank_, t, ++nonce_); }
  Bytes leave() { return last_leave = proto::make_leave(j_, rank_, ++nonce_); }
  void send(const Bytes& p) { sock.send(agg_.host(), agg_.port(), p); }
  // The RESULT for seq among what arrived (empty if none).
  Bytes result(uint64_t seq) const {
    for (const Bytes& b : sock.got) {
      proto::Header h;
      const uint8_t* pl;
      size_t plen;
      if (proto::parse(b.data(), b.size(), &h, &pl, &plen) == proto::ParseError::kOk && h.type == MsgType::kResult &&
          h.seq == seq)
        return b;
    }
    return {};
  }
  // The RESULT for seq, waiting for it up to ms (empty if none came).
  Bytes result_wait(uint64_t seq, int ms = 5000) {
    sock.wait_for([&] { return !result(seq).empty(); }, ms);
    return result(seq);
  }
  // Whether n replies of a type arrived within ms.
  bool wait_count(MsgType t, size_t n, int ms = 5000) {
    return sock.wait_for([&] { return count(t) >= n; }, ms);
  }
  // Replies of a type among what arrived.
  size_t count(MsgType t) const {
    size_t n = 0;
    for (const Bytes& b : sock.got) n += b.size() > 5 && b[5] == static_cast<uint8_t>(t);
    return n;
  }
  uint64_t seed() const { return ack.seed; }
  Sock sock;
  proto::JoinAckBody ack;
  Bytes last_join, last_table, last_leave;  // what a sniffer recorded of this worker

 private:
  AggregatorProcess& agg_;
  proto::JobId j_;
  uint16_t rank_;
  uint64_t nonce_ = 0;
  proto::JoinParams jp_;
  Bytes cookie_;
  uint16_t slots_ = 0, lanes_ = 0;
};

// Lane 0 of a u32 RESULT and its bitmap.
uint32_t lane0(const Bytes& result) { return proto::load_be32(result.data() + proto::kHeaderBytes); }
uint64_t bitmap_of(const Bytes& result) { return proto::load_be64(result.data() + 48); }

// ---- the attacks --------------------------------------------------------------------------------

// The harness itself: without an attacker, exact results and nothing dropped but each worker's
// first JOIN (answered with the cookie challenge). Anchors the counter checks of the attacks.
TEST(Attack, BaselineWithoutAttacker) {
  AggregatorProcess agg;
  JobSpec spec;
  spec.label = 100;
  JobRun run(spec.world);
  run_job(agg, spec, &run);
  expect_exact(spec, run);
  const Counters c = snap(agg);
  // Each worker's first JOIN draws a CHALLENGE (again if the machine is slow enough for the worker
  // to resend it); the only other drops are what the workers' own resends explain (a duplicate of
  // a data packet, a LEAVE resent after the last one freed the job).
  EXPECT_GE(c["drop_cookie"], static_cast<uint64_t>(spec.world));
  EXPECT_EQ(c["drop_cookie"], c["challenges"]);
  EXPECT_EQ(c["drops_total"], c["drop_cookie"] + c["drop_replay"] + c["drop_stale"] + c["drop_slot_busy"] +
                                  c["drop_unknown_job"])
      << thc::switch_offload::stats_line(c.v);
  EXPECT_EQ(c["elements"], 2 * spec.world * wl_elements(spec.count));
  EXPECT_EQ(c["jobs_created"], 1u);
  EXPECT_EQ(c["jobs_freed"], 1u);
  EXPECT_FALSE(run.cap.select(true, kDataTypes).empty());
}

// Forging: every captured data packet, altered (a payload bit, a tag bit, a header bit, the
// RETRANSMIT flag, moved to a future use of its slot, another worker's payload under its header),
// sent between the phases; and packets of the running phase altered as they go by. None may count.
TEST(Attack, AlteredDataPacketsAreDroppedAndChangeNoResult) {
  AggregatorProcess agg;
  JobSpec spec;
  spec.label = 101;
  JobRun run(spec.world);
  Sock attacker;
  uint64_t must_fail_tag = 0, forged_total = 0;
  Counters c0;
  Hooks h;
  h.between = [&](JobRun& r) {
    c0 = snap(agg);
    const auto data = r.cap.select(true, kDataTypes);
    std::mt19937_64 rng(1);
    std::vector<Bytes> forged;
    for (size_t i = 0; i < data.size(); ++i) {
      const Bytes& p = data[i].b;
      const size_t pay_bits = (p.size() - proto::kHeaderBytes) * 8;
      forged.push_back(flip(p, proto::kHeaderBytes * 8 + rng() % pay_bits));  // payload
      forged.push_back(flip(p, proto::kTagOffset * 8 + rng() % 64));          // tag
      Bytes q = p;
      // The RETRANSMIT flag and the attempt number (bytes 28..29) both covered by the tag.
      proto::store_be16(&q[6], static_cast<uint16_t>(proto::load_be16(&q[6]) ^ proto::kFlagRetransmit));
      proto::store_be16(&q[28], static_cast<uint16_t>((proto::load_be16(&q[6]) & proto::kFlagRetransmit) ? 1 : 0));
      forged.push_back(q);
      // The same slot and shadow set one round later: the seq the next phase will use.
      q = p;
      proto::store_be64(&q[32], data[i].h.seq + 2 * kSlots);
      forged.push_back(q);
      must_fail_tag += 4;
      // Another worker's contribution (same shape) under this worker's header.
      for (size_t j = i + 1; j < data.size() && j < i + 8; ++j)
        if (data[j].rank != data[i].rank && data[j].b.size() == p.size()) {
          q = p;
          std::copy(data[j].b.begin() + proto::kHeaderBytes, data[j].b.end(), q.begin() + proto::kHeaderBytes);
          if (q != p) {
            forged.push_back(q);
            ++must_fail_tag;
          }
          break;
        }
      // Any header bit (some of these fail parsing, name another job or shard, or fail the tag).
      forged.push_back(flip(p, (i % proto::kTagOffset) * 8 + rng() % 8));
    }
    for (const Bytes& f : forged) attacker.send(agg.host(), agg.port(), f);
    forged_total += forged.size();
  };
  h.during = [&](JobRun& r, const std::atomic<bool>& stop) {
    size_t seen = r.cap.size();
    std::mt19937_64 rng(2);
    while (!stop) {
      const auto fresh = r.cap.select(true, kDataTypes, -1, seen);
      seen = r.cap.size();
      for (const Seen& s : fresh) {
        const size_t pay_bits = (s.b.size() - proto::kHeaderBytes) * 8;
        attacker.send(agg.host(), agg.port(), flip(s.b, proto::kHeaderBytes * 8 + rng() % pay_bits));
        attacker.send(agg.host(), agg.port(), flip(s.b, proto::kTagOffset * 8 + rng() % 64));
        must_fail_tag += 2;
        forged_total += 2;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  };
  run_job(agg, spec, &run, h);
  attacker.drain(100);
  expect_exact(spec, run);
  const Counters c1 = snap(agg);
  EXPECT_GT(forged_total, 500u) << "the attack should have sent something";
  EXPECT_GE(delta(c1, c0, "drop_bad_tag"), must_fail_tag);
  EXPECT_GE(delta(c1, c0, "drops_total"), forged_total) << "every forged datagram is dropped";
  EXPECT_EQ(c1["elements"], 2 * spec.world * wl_elements(spec.count)) << "no forged lane was added";
  EXPECT_EQ(attacker.recv_bytes, 0u) << "the forger gets no reply";
}

// Replay: every captured data packet (also genuine retransmissions, which carry the RETRANSMIT
// flag) sent again, from the attacker's and from a victim's address, between the phases; and the
// running phase's packets replayed as they go by. A replay is the worker's own contribution, so it
// may neither add it twice nor subtract it (the retraction path), and replies go to the worker.
TEST(Attack, ReplayedDataIsNeitherAddedTwiceNorSubtracted) {
  AggregatorProcess agg;
  JobSpec spec;
  spec.label = 102;
  spec.rank0_drop = 0.05;
  JobRun run(spec.world);
  Sock attacker, victim;
  uint64_t replayed = 0, reflagged = 0, genuine_retx = 0;
  Counters c0, c1;
  Hooks h;
  h.between = [&](JobRun& r) {
    c0 = snap(agg);
    for (const Seen& s : r.cap.select(true, kDataTypes)) {
      attacker.send(agg.host(), agg.port(), s.b);
      victim.send(agg.host(), agg.port(), s.b);
      replayed += 2;
      if (s.h.flags & proto::kFlagRetransmit) {
        ++genuine_retx;
      } else {
        Bytes q = s.b;  // a retransmission made up from an original: the flag is under the tag
        proto::store_be16(&q[6], static_cast<uint16_t>(proto::load_be16(&q[6]) | proto::kFlagRetransmit));
        proto::store_be16(&q[28], 7);  // a made-up attempt number
        attacker.send(agg.host(), agg.port(), q);
        ++reflagged;
      }
    }
    attacker.drain(100);
    c1 = snap(agg);
  };
  uint64_t live = 0;
  h.during = [&](JobRun& r, const std::atomic<bool>& stop) {
    size_t seen = r.cap.size();
    while (!stop) {
      const auto fresh = r.cap.select(true, kDataTypes, -1, seen);
      seen = r.cap.size();
      for (const Seen& s : fresh) {
        attacker.send(agg.host(), agg.port(), s.b);
        victim.send(agg.host(), agg.port(), s.b);
        live += 2;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  };
  run_job(agg, spec, &run, h);
  attacker.drain(100);
  victim.drain(0);
  expect_exact(spec, run);
  const Counters c2 = snap(agg);
  EXPECT_GT(genuine_retx, 0u) << "rank 0 lost packets, so its capture holds genuine retransmissions";
  EXPECT_GT(live, 100u);
  EXPECT_EQ(delta(c1, c0, "drop_bad_tag"), reflagged);
  // Each valid replay of a finished packet is stale (its slot moved on) or a copy of an attempt the
  // aggregator answered already (no reply); only an attempt whose genuine copy was lost on the
  // way draws the stored result, once, to the worker's registered address.
  EXPECT_EQ(delta(c1, c0, "drop_stale") + delta(c1, c0, "drop_replay") + delta(c1, c0, "result_resends"), replayed);
  EXPECT_EQ(delta(c1, c0, "elements"), 0u);
  EXPECT_EQ(c2["elements"], 2 * spec.world * wl_elements(spec.count)) << "a replay was counted as a contribution";
  EXPECT_EQ(c2["retractions"], 0u) << "a replay took a contribution back out";
  EXPECT_EQ(attacker.recv_bytes, 0u);
  EXPECT_EQ(victim.recv_bytes, 0u);
}

// Redirect: the captured JOINs (the first, cookie-less one and the one with the cookie) replayed
// from the attacker's address and from a victim's, between and during the phases. Only a CHALLENGE
// (no larger than the JOIN) may come back; the job's results keep going to the workers.
TEST(Attack, ReplayedJoinsCannotRedirectResults) {
  AggregatorProcess agg;
  JobSpec spec;
  spec.label = 103;
  JobRun run(spec.world);
  Sock attacker, victim;
  uint64_t joins = 0;
  Counters c0;
  Hooks h;
  h.between = [&](JobRun& r) {
    c0 = snap(agg);
    const auto js = r.cap.select(true, {MsgType::kJoin});
    ASSERT_GE(js.size(), static_cast<size_t>(2 * spec.world)) << "each worker: JOIN, CHALLENGE, JOIN with cookie";
    for (const Seen& s : js) {
      attacker.send(agg.host(), agg.port(), s.b);
      victim.send(agg.host(), agg.port(), s.b);
      joins += 2;
    }
  };
  h.during = [&](JobRun& r, const std::atomic<bool>& stop) {
    const auto js = r.cap.select(true, {MsgType::kJoin});
    while (!stop) {
      for (const Seen& s : js) {
        attacker.send(agg.host(), agg.port(), s.b);
        ++joins;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  };
  run_job(agg, spec, &run, h);
  attacker.drain(100);
  victim.drain(0);
  expect_exact(spec, run);
  const Counters c1 = snap(agg);
  EXPECT_EQ(delta(c1, c0, "drop_cookie"), joins) << "a replayed JOIN never passes the address cookie";
  EXPECT_EQ(delta(c1, c0, "challenges"), joins);
  EXPECT_EQ(c1["jobs_created"], 1u);
  for (Sock* s : {&attacker, &victim}) {
    EXPECT_LE(s->recv_bytes, s->sent_bytes) << "amplification towards " << s->port();
    for (const Bytes& b : s->got) {
      proto::Header rh;
      const uint8_t* pl;
      size_t plen;
      ASSERT_EQ(proto::parse(b.data(), b.size(), &rh, &pl, &plen), proto::ParseError::kOk);
      EXPECT_EQ(rh.type, MsgType::kChallenge) << "a replayed JOIN drew " << proto::msg_type_name(rh.type);
    }
  }
}

// Control replays: a finished incarnation's LEAVEs, TABLEs and data against the next incarnation
// of the same job id (another seed, so another data key), and this incarnation's own TABLEs with
// old nonces. Neither frees the job nor swaps a table.
TEST(Attack, ReplayedLeaveAndTableAreRejected) {
  AggregatorProcess agg;
  JobSpec spec;
  spec.label = 104;
  JobRun first(spec.world);
  run_job(agg, spec, &first);
  expect_exact(spec, first);
  const auto old_ctl = first.cap.select(true, {MsgType::kLeave, MsgType::kTable});
  const auto old_data = first.cap.select(true, kDataTypes);
  ASSERT_GE(first.cap.select(true, {MsgType::kLeave}).size(), static_cast<size_t>(spec.world));

  JobRun run(spec.world);
  Sock attacker;
  uint64_t old_replays = 0, table_replays = 0, table_repeats = 0;
  Counters c0, c1;
  Hooks h;
  h.between = [&](JobRun& r) {
    c0 = snap(agg);
    for (const Seen& s : old_ctl) attacker.send(agg.host(), agg.port(), s.b);
    for (const Seen& s : old_data) attacker.send(agg.host(), agg.port(), s.b);
    old_replays = old_ctl.size() + old_data.size();
    // This incarnation's TABLEs: the newest nonce of each worker is a repeat (answered to the
    // worker, nothing installed); all older ones are replays.
    const auto tables = r.cap.select(true, {MsgType::kTable});
    std::map<int, uint64_t> newest;
    for (const Seen& s : tables) newest[s.rank] = std::max(newest[s.rank], s.h.seq);
    for (const Seen& s : tables) {
      attacker.send(agg.host(), agg.port(), s.b);
      (s.h.seq == newest[s.rank] ? table_repeats : table_replays) += 1;
    }
    attacker.drain(100);
    c1 = snap(agg);
  };
  run_job(agg, spec, &run, h);
  expect_exact(spec, run);
  EXPECT_GT(table_replays, 0u);
  EXPECT_EQ(delta(c1, c0, "drop_bad_tag"), old_replays) << "the old incarnation's key is not this one's";
  EXPECT_EQ(delta(c1, c0, "drop_replay"), table_replays);
  EXPECT_EQ(delta(c1, c0, "jobs_freed"), 0u);
  EXPECT_EQ(attacker.recv_bytes, 0u);
}

// Replay window rewind (needs forged source addresses): the worker's captured JOIN with its
// cookie, replayed from the worker's own address while the cookie is still valid, must not move
// the worker's control nonce back; otherwise a TABLE captured earlier in this incarnation is
// accepted again and swaps a lookup table under the running job.
TEST(Attack, ReplayedJoinFromTheWorkersAddressDoesNotReopenOldTables) {
  AggregatorProcess agg;
  Spoofer spoof;
  REQUIRE_SPOOFING(spoof);
  JobSpec spec;
  spec.label = 105;
  // Phase 1 uses a table the workload installed earlier and recycled: chosen between the phases.
  struct Chosen {
    int id = -1;
    proto::TableSpec fin;  // the table the aggregator holds under id (the workers think so too)
    Bytes old;             // an earlier TABLE of rank 0 for the same id, same shape, other values
  } ch;
  const uint64_t n2 = 700;
  auto table_of = [&] {
    LookupTable t;
    t.bits = ch.fin.bits;
    for (int z = 0; z < ch.fin.entries(); ++z) t.values.push_back(ch.fin.values[z]);
    return t;
  };
  auto int_type = [&] {
    switch (ch.fin.sum) {
      case proto::WireInt::kU8: return IntType::kU8;
      case proto::WireInt::kU16: return IntType::kU16;
      case proto::WireInt::kU32: return IntType::kU32;
      case proto::WireInt::kI8: return IntType::kI8;
      case proto::WireInt::kI16: return IntType::kI16;
      default: return IntType::kI32;
    }
  };
  auto indices = [&](int rank) {
    thc::test::WlOp op{thc::test::WlOp::kLookup, int_type(), n2, ch.fin.bits, 0, false};
    return thc::test::wl_input(op, 99, rank, 5);
  };
  spec.work = [&](Reducer& red, int rank, int phase) -> Bytes {
    if (phase == 0) return thc::test::wl_run(red, spec.count, 7).bytes;
    const LookupTable t = table_of();
    const Bytes in = indices(rank);
    const size_t w = proto::wire_int_bytes(ch.fin.sum);
    Bytes out(n2 * w);
    red.start_lookup_sum(in.data(), n2, t, out.data(), int_type(), nullptr)->wait();
    return out;
  };
  spec.expected = [&](int, int phase) -> Bytes {
    if (phase == 0) return thc::test::wl_expected(spec.world, spec.count, 7);
    const size_t w = proto::wire_int_bytes(ch.fin.sum);
    std::vector<uint32_t> acc(n2, 0);
    for (int r = 0; r < spec.world; ++r) {
      const Bytes in = indices(r);
      for (uint64_t i = 0; i < n2; ++i) acc[i] += static_cast<uint32_t>(ch.fin.values[proto::get_index(in.data(), i, ch.fin.bits)]);
    }
    Bytes out(n2 * w);
    for (uint64_t i = 0; i < n2; ++i) std::memcpy(out.data() + i * w, &acc[i], w);
    return out;
  };
  JobRun run(spec.world);
  Sock attacker;
  Counters c0, ca, cb, c1;
  Hooks h;
  h.between = [&](JobRun& r) {
    // Rank 0's TABLEs in nonce order: the last one per id is what the aggregator holds.
    const auto tables = r.cap.select(true, {MsgType::kTable}, 0);
    std::map<int, std::vector<std::pair<proto::TableSpec, Bytes>>> by_id;
    for (const Seen& s : tables) {
      proto::TableSpec t;
      ASSERT_EQ(proto::parse_table(s.b.data() + proto::kHeaderBytes, s.b.size() - proto::kHeaderBytes, &t),
                proto::ParseError::kOk);
      by_id[t.id].emplace_back(t, s.b);
    }
    for (auto& [id, v] : by_id) {
      const proto::TableSpec& fin = v.back().first;
      for (size_t i = 0; i + 1 < v.size() && ch.id < 0; ++i) {
        const proto::TableSpec& t = v[i].first;
        if (t.bits == fin.bits && t.sum == fin.sum && !std::equal(t.values, t.values + t.entries(), fin.values)) {
          ch.id = id;
          ch.fin = fin;
          ch.old = v[i].second;
        }
      }
    }
    ASSERT_GE(ch.id, 0) << "the workload recycles table ids: some id held two tables of one shape";
    Bytes join_with_cookie;  // rank 0's JOIN that carried its cookie
    for (const Seen& s : r.cap.select(true, {MsgType::kJoin}, 0)) {
      const uint8_t* c = s.b.data() + proto::kHeaderBytes;
      if (std::any_of(c, c + proto::kCookieBytes, [](uint8_t b) { return b != 0; })) join_with_cookie = s.b;
    }
    ASSERT_FALSE(join_with_cookie.empty());
    c0 = snap(agg);
    attacker.send(agg.host(), agg.port(), ch.old);  // plain replay: an old nonce
    attacker.drain(30);
    ca = snap(agg);
    spoof.send("127.0.0.1", r.port[0], agg.host(), agg.port(), join_with_cookie);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    cb = snap(agg);
    attacker.send(agg.host(), agg.port(), ch.old);  // the same replay after the JOIN replay
    attacker.drain(30);
    c1 = snap(agg);
  };
  run_job(agg, spec, &run, h);
  expect_exact(spec, run);
  EXPECT_EQ(delta(ca, c0, "drop_replay"), 1u) << "an old TABLE is a replay";
  EXPECT_EQ(delta(c1, cb, "drop_replay"), 1u) << "an old TABLE is still a replay after the JOIN replay (which "
                                                 "must not rewind the worker's control nonce)";
  EXPECT_EQ(attacker.recv_bytes, 0u);
}

// Squatting: before the workers come, JOINs for their job id without its key (a made-up key under
// the tenant's key id, a zero tag), with another tenant's real key, with the operator key and
// with an unknown key id. None creates or claims anything or draws a reply; the other tenant's
// own job of the same label is a different job.
TEST(Attack, JobIdsCannotBeSquattedWithoutTheirKey) {
  AggregatorProcess agg;
  const uint32_t label = 106;
  const int world = 4;
  Sock attacker, other_tenant;
  std::vector<Bytes> joins;
  proto::JoinParams jp;
  jp.quorum = world;
  uint8_t cookie[proto::kCookieBytes];
  for (size_t i = 0; i < sizeof cookie; ++i) cookie[i] = static_cast<uint8_t>(i * 37 + 1);
  for (int w = 0; w < world; ++w) {
    proto::JobId fake = proto::JobId::make(stranger_key(1), label, world);
    joins.push_back(proto::make_join(fake, static_cast<uint16_t>(w), jp));
    proto::JoinParams withc = jp;
    withc.cookie = cookie;
    joins.push_back(proto::make_join(fake, static_cast<uint16_t>(w), withc));
    Bytes zero = joins.back();
    set_tag(zero, 0);
    joins.push_back(zero);
    // Tenant 2's real key, tenant 1's job id.
    proto::JobId cross = proto::JobId::make(test_key(2), label, world);
    cross.job = proto::make_job_id(1, label);
    cross.jkey = auth::join_key(test_key(2), cross.job);
    joins.push_back(proto::make_join(cross, static_cast<uint16_t>(w), jp));
    joins.push_back(proto::make_join(proto::JobId::make(test_key(0), label, world), static_cast<uint16_t>(w), jp));
    joins.push_back(proto::make_join(proto::JobId::make(test_key(9), label, world), static_cast<uint16_t>(w), jp));
  }
  const Counters c0 = snap(agg);
  for (const Bytes& j : joins) attacker.send(agg.host(), agg.port(), j);
  // Tenant 2 creates its own job with the same label: JOIN, CHALLENGE, JOIN with the cookie.
  proto::JobId mine = proto::JobId::make(test_key(2), label, world);
  other_tenant.send(agg.host(), agg.port(), proto::make_join(mine, 0, jp, 1));
  other_tenant.drain(200);
  ASSERT_EQ(other_tenant.got.size(), 1u);
  proto::JoinParams withc = jp;
  withc.cookie = other_tenant.got[0].data() + proto::kHeaderBytes;
  other_tenant.send(agg.host(), agg.port(), proto::make_join(mine, 0, withc, 2));
  other_tenant.drain(200);
  ASSERT_EQ(other_tenant.got.size(), 2u);
  EXPECT_EQ(other_tenant.got[1][5], static_cast<uint8_t>(MsgType::kJoinAck));
  attacker.drain(50);
  const Counters c1 = snap(agg);
  EXPECT_EQ(delta(c1, c0, "drop_bad_tag"), joins.size());
  EXPECT_EQ(delta(c1, c0, "jobs_created"), 1u) << "only tenant 2's own job";
  EXPECT_EQ(attacker.recv_bytes, 0u);

  JobSpec spec;
  spec.label = label;
  JobRun run(spec.world);
  Hooks h;
  h.between = [&](JobRun&) {
    for (const Bytes& j : joins) attacker.send(agg.host(), agg.port(), j);
  };
  run_job(agg, spec, &run, h);
  attacker.drain(50);
  expect_exact(spec, run);
  const Counters c2 = snap(agg);
  EXPECT_EQ(delta(c2, c0, "drop_bad_tag"), 2 * joins.size());
  EXPECT_EQ(c2["jobs_created"], 2u);
  EXPECT_EQ(attacker.recv_bytes, 0u);
}

// Exhaustion: the aggregator holds 6 jobs (3 per tenant key: the test key file has two), 2 per
// source address. A stranger (127.0.0.2) sends JOINs for many job ids without a key: nothing is
// created. A key holder at 127.0.0.2 creates jobs until its per-source limit, and is refused with an
// ERROR no larger than its JOIN; another source may still create one, and the workers (127.0.0.1)
// still get theirs.
TEST(Attack, JobTableCannotBeExhaustedWithoutKeyNorFromOneSource) {
  AggregatorProcess agg({"--max-jobs", "6", "--max-jobs-per-source", "2"});
  const int world = 4;
  Sock stranger("127.0.0.2"), greedy("127.0.0.2"), other("127.0.0.3");
  proto::JoinParams jp;
  jp.quorum = world;
  const Counters c0 = snap(agg);
  uint64_t sent = 0;
  for (uint32_t label = 1; label <= 300; ++label) {
    proto::JobId fake = proto::JobId::make(stranger_key(1), label, world);
    stranger.send(agg.host(), agg.port(), proto::make_join(fake, 0, jp));
    proto::JobId fake2 = proto::JobId::make(stranger_key(2), label, world);
    stranger.send(agg.host(), agg.port(), proto::make_join(fake2, 0, jp));
    sent += 2;
  }
  stranger.drain(100);
  Counters c1 = snap(agg);
  EXPECT_EQ(delta(c1, c0, "drop_bad_tag"), sent);
  EXPECT_EQ(delta(c1, c0, "jobs_created"), 0u);
  EXPECT_EQ(stranger.recv_bytes, 0u);

  // join(sock, label): the reply type to the cookie-carrying JOIN.
  auto join = [&](Sock& s, uint32_t label) -> MsgType {
    proto::JobId j = proto::JobId::make(test_key(2), label, world);
    const size_t before = s.got.size();
    s.send(agg.host(), agg.port(), proto::make_join(j, 0, jp, 1));
    s.wait_one(5000);
    if (s.got.size() != before + 1 || s.got.back()[5] != static_cast<uint8_t>(MsgType::kChallenge))
      return MsgType::kStats;  // no challenge: reported as a mismatch below
    proto::JoinParams withc = jp;
    const Bytes ch = s.got.back();
    withc.cookie = ch.data() + proto::kHeaderBytes;
    s.send(agg.host(), agg.port(), proto::make_join(j, 0, withc, 2));
    s.wait_one(5000);
    return s.got.size() == before + 2 ? static_cast<MsgType>(s.got.back()[5]) : MsgType::kStats;
  };
  for (uint32_t label = 1; label <= 2; ++label) EXPECT_EQ(join(greedy, label), MsgType::kJoinAck) << label;
  for (uint32_t label = 3; label <= 5; ++label) EXPECT_EQ(join(greedy, label), MsgType::kError) << label;
  EXPECT_LE(greedy.recv_bytes, greedy.sent_bytes) << "refusals are no larger than the JOINs";
  EXPECT_EQ(join(other, 50), MsgType::kJoinAck) << "the limit is per source, not global";
  c1 = snap(agg);
  EXPECT_EQ(delta(c1, c0, "jobs_created"), 3u);
  EXPECT_EQ(delta(c1, c0, "drop_no_resources"), 3u);

  JobSpec spec;
  spec.label = 107;
  JobRun run(spec.world);
  run_job(agg, spec, &run);
  expect_exact(spec, run);
}

// STATS with --no-loopback-stats: without the operator key (no tag, a tenant's stats key, a wrong
// tag, an operator request altered) nothing comes back, not even an error; with it, the counters.
TEST(Attack, StatsNeedTheOperatorKey) {
  AggregatorProcess agg({"--no-loopback-stats"});
  Sock attacker;
  std::vector<Bytes> reqs;
  for (uint64_t seq = 1; seq <= 20; ++seq) {
    proto::Header h;
    h.type = MsgType::kStats;
    h.job = proto::make_job_id(0, 0);
    h.seq = seq;
    const Bytes pad(proto::kStatsRequestBytes, 0);
    reqs.push_back(proto::make_packet(h, pad, nullptr));
    const auth::TagKey tenant = auth::stats_key(test_key(1));
    h.job = proto::make_job_id(1, 0);
    reqs.push_back(proto::make_packet(h, pad, &tenant));
    h.job = proto::make_job_id(0, 0);
    const auth::TagKey wrong = auth::stats_key(stranger_key(0));
    reqs.push_back(proto::make_packet(h, pad, &wrong));
    const auth::TagKey op = auth::stats_key(test_key(0));
    Bytes altered = proto::make_packet(h, pad, &op);
    altered[39] ^= 0x80;  // another seq under the operator's tag
    reqs.push_back(altered);
  }
  const Counters c0 = snap(agg);
  for (const Bytes& r : reqs) attacker.send(agg.host(), agg.port(), r);
  attacker.drain(100);
  const Counters c1 = snap(agg);
  EXPECT_EQ(attacker.recv_bytes, 0u) << "an unauthenticated STATS learns nothing";
  EXPECT_EQ(delta(c1, c0, "drop_stats_denied"), reqs.size());
  const auth::TagKey op = auth::stats_key(test_key(0));
  const Bytes genuine = proto::make_stats(stats_nonce(), &op);
  attacker.send(agg.host(), agg.port(), genuine);
  attacker.drain(100);
  ASSERT_EQ(attacker.got.size(), 1u) << "the operator key still works";
  EXPECT_EQ(attacker.got[0][5], static_cast<uint8_t>(MsgType::kStatsReply));
  EXPECT_TRUE(auth::verify(op, attacker.got[0].data(), attacker.got[0].size())) << "the reply is authenticated";
  EXPECT_LE(attacker.got[0].size(), genuine.size()) << "the reply is no larger than the request";
  // The operator's request recorded and replayed: its nonce no longer grows, so nothing comes back.
  const Counters c2 = snap(agg);
  for (int i = 0; i < 10; ++i) attacker.send(agg.host(), agg.port(), genuine);
  attacker.drain(100);
  const Counters c3 = snap(agg);
  EXPECT_EQ(attacker.got.size(), 1u) << "a replayed operator STATS drew a reply";
  EXPECT_EQ(delta(c3, c2, "drop_replay"), 10u);
}

// A local IPv4 address outside 127/8 (this host's own, on an interface that is up), or "".
std::string non_loopback_ipv4() {
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return "";
  std::string found;
  for (ifaddrs* i = ifs; i && found.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
    const auto* a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    if ((ntohl(a->sin_addr.s_addr) >> 24) == 127) continue;
    char buf[INET_ADDRSTRLEN];
    if (::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf)) found = buf;
  }
  ::freeifaddrs(ifs);
  return found;
}

// STATS in the default configuration, the aggregator listening on a non-loopback address: from
// that address an unauthenticated STATS is refused silently; from loopback it is answered (the
// documented local convenience).
TEST(Attack, StatsFromANonLoopbackSourceNeedTheOperatorKey) {
  const std::string ip = non_loopback_ipv4();
  if (ip.empty()) GTEST_SKIP() << "this host has no IPv4 address outside 127/8";
  AggregatorProcess agg({}, 1, ip);
  Sock remote(ip), local("127.0.0.1");
  const Bytes plain = proto::make_stats(5, nullptr);
  const Counters c0 = snap(agg);
  for (int i = 0; i < 10; ++i) remote.send(ip, agg.port(), plain);
  remote.drain(100);
  const Counters c1 = snap(agg);
  EXPECT_EQ(remote.recv_bytes, 0u);
  EXPECT_EQ(delta(c1, c0, "drop_stats_denied"), 10u);
  local.send(ip, agg.port(), plain);
  local.drain(100);
  EXPECT_EQ(local.got.size(), 1u) << "loopback may ask without the key";
}

// Spoofed downstream datagrams at the workers' sockets (needs forged source addresses: the
// workers' sockets are connected to the aggregator): made-up ERROR (every code), RESULT, ACK,
// CHALLENGE, JOIN_ACK, TABLE_ACK and LEAVE_ACK with wrong tags or other keys, and the genuine
// downstream datagrams of phase 0 replayed to their worker and to the others. The clients must
// ignore all of it.
TEST(Attack, SpoofedRepliesToWorkersAreIgnored) {
  AggregatorProcess agg;
  Spoofer spoof;
  REQUIRE_SPOOFING(spoof);
  JobSpec spec;
  spec.label = 108;
  JobRun run(spec.world);
  const uint64_t job = proto::make_job_id(1, spec.label);
  std::mt19937_64 rng(3);
  // Made-up replies for worker r about the packet `like` (an upstream packet of r), tagged with
  // garbage, with another tenant's key for this job id, and with the right tenant id's made-up key.
  auto forge = [&](int r, const proto::Header& like) {
    std::vector<Bytes> out;
    auth::TagKey keys[2] = {auth::join_key(test_key(2), job), auth::data_key(stranger_key(1), job, 12345)};
    auto add = [&](proto::Header h, const Bytes& payload) {
      h.job = job;
      h.worker = static_cast<uint16_t>(r);
      h.nworkers = static_cast<uint16_t>(spec.world);
      Bytes p = proto::make_packet(h, payload, nullptr);
      set_tag(p, rng());
      out.push_back(p);
      for (const auth::TagKey& k : keys) out.push_back(proto::make_packet(h, payload, &k));
    };
    for (uint32_t code : {2u, 3u, 4u, 5u, 7u, 8u}) {
      proto::Header e;
      e.type = MsgType::kError;
      e.seq = like.seq;
      e.op = like.op;
      e.slot = like.slot;
      e.shadow = like.shadow;
      e.aux = code;
      add(e, {});
      e.seq = 1 + rng() % 8;  // as if answering a control request
      e.op = 0;
      e.slot = 0;
      e.shadow = 0;
      add(e, {});
    }
    proto::Header res;
    res.type = MsgType::kResult;
    res.seq = like.seq;
    res.op = like.op;
    res.slot = like.slot;
    res.shadow = like.shadow;
    res.lanes = like.lanes;
    res.enc = like.type == MsgType::kDataMax ? proto::WireInt::kU32 : like.enc;
    res.count = like.count;
    res.contributors = static_cast<uint16_t>(spec.world);
    res.bitmap = (uint64_t{1} << spec.world) - 1;
    Bytes zeros(proto::data_payload_bytes(MsgType::kResult, res.enc, 0, res.lanes), 0x5A);
    add(res, zeros);
    proto::Header ack = res;
    ack.type = MsgType::kAck;
    ack.flags = proto::kFlagNotCounted;
    ack.lanes = 0;
    ack.enc = proto::WireInt::kNone;
    ack.count = 0;
    ack.contributors = 0;
    ack.bitmap = 0;
    add(ack, {});
    for (MsgType t : {MsgType::kChallenge, MsgType::kJoinAck, MsgType::kTableAck, MsgType::kLeaveAck}) {
      proto::Header c;
      c.type = t;
      c.seq = 1 + rng() % 8;
      add(c, t == MsgType::kChallenge ? Bytes(proto::kCookieBytes, 7)
                                      : t == MsgType::kJoinAck ? Bytes(proto::kJoinAckBytes, 1) : Bytes{});
    }
    return out;
  };
  uint64_t injected = 0;
  std::vector<Seen> down0;
  Hooks h;
  h.between = [&](JobRun& r) {
    down0 = r.cap.select(false, {});
    ASSERT_FALSE(down0.empty());
    for (int w = 0; w < spec.world; ++w) {
      const auto ups = r.cap.select(true, kDataTypes, w);
      ASSERT_FALSE(ups.empty());
      for (const Bytes& f : forge(w, ups.back().h)) {
        spoof.send(agg.host(), agg.port(), "127.0.0.1", r.port[w], f);
        ++injected;
      }
    }
    // Genuine replies replayed: to their own worker (duplicates) and to every other worker.
    for (const Seen& s : down0)
      for (int w = 0; w < spec.world; ++w) {
        spoof.send(agg.host(), agg.port(), "127.0.0.1", r.port[w], s.b);
        ++injected;
      }
  };
  h.during = [&](JobRun& r, const std::atomic<bool>& stop) {
    size_t seen = r.cap.size();
    size_t k = 0;
    while (!stop) {
      // About the packets in flight right now: made-up results and errors for exactly them.
      const auto fresh = r.cap.select(true, kDataTypes, -1, seen);
      seen = r.cap.size();
      for (const Seen& s : fresh) {
        if (k++ % 4) continue;
        for (const Bytes& f : forge(s.rank, s.h)) {
          spoof.send(agg.host(), agg.port(), "127.0.0.1", r.port[s.rank], f);
          ++injected;
        }
      }
      for (int i = 0; i < 8 && !down0.empty(); ++i) {
        const Seen& s = down0[rng() % down0.size()];
        spoof.send(agg.host(), agg.port(), "127.0.0.1", r.port[s.rank], s.b);
        ++injected;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(300));
    }
  };
  run_job(agg, spec, &run, h);
  expect_exact(spec, run);
  EXPECT_GT(injected, 1000u);
  for (int r = 0; r < spec.world; ++r) {
    EXPECT_GT(run.cstats[r].bad_tags, 50u) << "rank " << r << " saw the forgeries (and ignored them)";
    EXPECT_GT(run.cstats[r].ignored + run.cstats[r].duplicate_results, 0u) << "rank " << r;
    EXPECT_EQ(run.cstats[r].left_behind, 0u) << "rank " << r;
  }
}

// A genuine ERROR the aggregator once sent (here: a worker's earlier, misconfigured attempt at the
// same job id) replayed at the worker of a later run of the job (needs forged source addresses).
// An error answers one request; a recording of it must not stop a worker of another incarnation.
TEST(Attack, ReplayedErrorFromAnEarlierAttemptDoesNotStopAWorker) {
  AggregatorProcess agg;
  Spoofer spoof;
  REQUIRE_SPOOFING(spoof);
  const uint32_t label = 109;
  Capture old;
  {
    UdpClientOptions o;
    o.address = agg.url();
    o.world = 2;
    o.job_label = label;
    o.key = test_key(1);
    o.max_wait_ms = 2000;
    o.fault_from_env = false;
    UdpReducer rank0(o);
    o.rank = 1;
    o.quorum = 1;  // the misconfiguration: the job's quorum is 2
    try {
      UdpReducer rank1(o, std::make_unique<TapChannel>(agg.url(), &old, 1));
      FAIL() << "a mismatched quorum must be refused";
    } catch (const thc::Error& e) {
      EXPECT_EQ(e.status(), thc::Status::kConfigMismatch) << e.what();
    }
  }
  const auto errors = old.select(false, {MsgType::kError}, 1);
  ASSERT_GE(errors.size(), 1u);  // more if the worker resent its JOIN: each copy draws the refusal

  JobSpec spec;
  spec.world = 2;
  spec.label = label;
  JobRun run(spec.world);
  Hooks h;
  h.between = [&](JobRun& r) {
    for (int i = 0; i < 5; ++i) spoof.send(agg.host(), agg.port(), "127.0.0.1", r.port[1], errors[0].b);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  };
  run_job(agg, spec, &run, h);
  expect_exact(spec, run);
  EXPECT_GE(run.cstats[1].ignored, 5u) << "the recorded error verifies (genuine tag) and must be ignored";
}

// A JOIN_ACK of an earlier run of the job replayed at a worker while it joins (needs forged source
// addresses): the attacker sees the worker's JOIN with its cookie go by and answers first with the
// recording. Its seed is the old incarnation's: a worker that takes it tags everything with a dead
// key and stops. A join reply must be bound to the JOIN it answers, not to a per-process counter.
TEST(Attack, ReplayedJoinAckOfAnEarlierRunDoesNotStopAWorker) {
  AggregatorProcess agg;
  Spoofer spoof;
  REQUIRE_SPOOFING(spoof);
  JobSpec spec;
  spec.world = 2;
  spec.label = 110;
  JobRun first(spec.world);
  run_job(agg, spec, &first);
  expect_exact(spec, first);
  std::vector<Bytes> acks(spec.world);
  for (int r = 0; r < spec.world; ++r) {
    const auto a = first.cap.select(false, {MsgType::kJoinAck}, r);
    ASSERT_GE(a.size(), 1u);  // more if a slow worker resent its JOIN (each copy is answered)
    acks[r] = a[0].b;
  }

  JobRun run(spec.world);
  std::vector<uint16_t> port(spec.world);
  std::atomic<int> injected{0};
  Hooks h;
  h.before_join = [&](int r, uint16_t p) { port[r] = p; };
  h.on_send = [&](int r, const Bytes& d) {
    proto::Header jh;
    const uint8_t* pl;
    size_t plen;
    if (proto::parse(d.data(), d.size(), &jh, &pl, &plen) != proto::ParseError::kOk || jh.type != MsgType::kJoin) return;
    if (std::all_of(pl, pl + proto::kCookieBytes, [](uint8_t b) { return b == 0; })) return;
    spoof.send(agg.host(), agg.port(), "127.0.0.1", port[r], acks[r]);
    ++injected;
  };
  run_job(agg, spec, &run, h);
  // At least once per worker (more if a slow machine made a worker resend its JOIN).
  EXPECT_GE(injected.load(), spec.world);
  expect_exact(spec, run);
}

// Garbage during a job: random bytes of every length up to an MTU, version-1 headers, wrong
// magic, truncated headers, headers with random fields; at the aggregator and (with forged source
// addresses) at the workers. Nothing answers, everything is counted, the job is undisturbed.
TEST(Attack, GarbageAndWrongVersionsDuringAJob) {
  AggregatorProcess agg;
  Spoofer spoof;
  JobSpec spec;
  spec.label = 111;
  JobRun run(spec.world);
  Sock attacker;
  uint64_t n_trunc = 0, n_v1 = 0, n_magic = 0;  // of what went to the aggregator
  std::mt19937_64 rng(4);
  auto junk = [&](int kind, bool to_aggregator) {
    const uint64_t trunc0 = n_trunc, v10 = n_v1, magic0 = n_magic;
    Bytes p;
    switch (kind % 5) {
      case 0:  // random, any length
        p.resize(rng() % 1473);
        for (auto& b : p) b = static_cast<uint8_t>(rng());
        if (p.size() >= 4 && proto::load_be32(p.data()) == proto::kMagic) p[0] ^= 1;
        if (p.size() < proto::kHeaderBytes) ++n_trunc;
        else ++n_magic;
        break;
      case 1:  // version 1 (the old protocol's token header)
        p.resize(proto::kHeaderBytes + rng() % 1024);
        for (auto& b : p) b = static_cast<uint8_t>(rng());
        proto::store_be32(p.data(), proto::kMagic);
        p[4] = 1;
        ++n_v1;
        break;
      case 2:  // truncated version 2 header
        p.resize(rng() % proto::kHeaderBytes);
        for (auto& b : p) b = static_cast<uint8_t>(rng());
        if (p.size() >= 4) proto::store_be32(p.data(), proto::kMagic);
        if (p.size() >= 5) p[4] = proto::kVersion;
        ++n_trunc;
        break;
      case 3:  // version 2, random fields
      default: {
        p.resize(proto::kHeaderBytes + (kind % 5 == 3 ? 0 : rng() % 600));
        for (auto& b : p) b = static_cast<uint8_t>(rng());
        proto::store_be32(p.data(), proto::kMagic);
        p[4] = proto::kVersion;
        p[5] = static_cast<uint8_t>(kind % 2 ? 1 + rng() % 7 : 16 + rng() % 3);  // JOIN..CHALLENGE or data
        break;
      }
    }
    if (!to_aggregator) {
      n_trunc = trunc0;
      n_v1 = v10;
      n_magic = magic0;
    }
    return p;
  };
  Counters c0;
  Hooks h;
  h.between = [&](JobRun& r) {
    c0 = snap(agg);
    for (int i = 0; i < 1500; ++i) attacker.send(agg.host(), agg.port(), junk(i, true));
    // Read by the workers when the next phase starts.
    for (int i = 0; i < 200 && spoof.ok(); ++i)
      spoof.send(agg.host(), agg.port(), "127.0.0.1", r.port[i % spec.world], junk(i, false));
  };
  h.during = [&](JobRun& r, const std::atomic<bool>& stop) {
    int i = 0;
    while (!stop) {
      for (int k = 0; k < 16; ++k, ++i) {
        attacker.send(agg.host(), agg.port(), junk(i, true));
        if (spoof.ok()) spoof.send(agg.host(), agg.port(), "127.0.0.1", r.port[i % spec.world], junk(i + 1, false));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
  };
  run_job(agg, spec, &run, h);
  attacker.drain(100);
  expect_exact(spec, run);
  const Counters c1 = snap(agg);
  EXPECT_EQ(attacker.recv_bytes, 0u);
  EXPECT_GE(delta(c1, c0, "drop_truncated"), n_trunc);
  EXPECT_GE(delta(c1, c0, "drop_bad_version"), n_v1);
  EXPECT_GE(delta(c1, c0, "drop_bad_magic"), n_magic);
  // Garbage sent to the workers was counted by the aggregator's drop reasons only for what came to
  // it: the total of its drops covers every datagram the attacker sent there.
  EXPECT_GE(delta(c1, c0, "drops_total"), attacker.sent);
  EXPECT_EQ(c1["elements"], 2 * spec.world * wl_elements(spec.count));
  if (spoof.ok()) {
    for (int r = 0; r < spec.world; ++r) EXPECT_GT(run.cstats[r].ignored + run.cstats[r].bad_tags, 0u) << "rank " << r;
  }
}

// Amplification, datagram kind by kind, towards the sender's address (the attacker's own, or a
// victim's it claims: a second socket here): no reply may be larger than the request that drew it.
// STATS are refused without the operator key (--no-loopback-stats), so the only STATS that draws a
// reply is a genuine operator request, recorded and replayed from the victim's address.
TEST(Attack, NoReplyIsLargerThanTheDatagramThatDrewIt) {
  AggregatorProcess agg({"--no-loopback-stats"});
  JobSpec spec;
  spec.label = 112;
  JobRun run(spec.world);
  struct Kind {
    std::string name;
    std::vector<Bytes> reqs;
  };
  std::vector<Kind> kinds;
  std::map<std::string, std::pair<uint64_t, uint64_t>> measured;  // name -> (sent, received)
  Hooks h;
  h.between = [&](JobRun& r) {
    std::mt19937_64 rng(5);
    Kind k;
    k.name = "garbage";
    for (int i = 0; i < 50; ++i) {
      Bytes p(1 + rng() % 1400);
      for (auto& b : p) b = static_cast<uint8_t>(rng());
      k.reqs.push_back(p);
    }
    kinds.push_back(k);
    k = Kind{"forged data", {}};
    for (const Seen& s : r.cap.select(true, kDataTypes)) k.reqs.push_back(flip(s.b, 600));
    kinds.push_back(k);
    k = Kind{"replayed data", {}};
    for (const Seen& s : r.cap.select(true, kDataTypes)) k.reqs.push_back(s.b);
    kinds.push_back(k);
    k = Kind{"replayed JOIN", {}};
    for (const Seen& s : r.cap.select(true, {MsgType::kJoin})) k.reqs.push_back(s.b);
    kinds.push_back(k);
    k = Kind{"replayed TABLE", {}};
    for (const Seen& s : r.cap.select(true, {MsgType::kTable})) k.reqs.push_back(s.b);
    kinds.push_back(k);
    k = Kind{"forged LEAVE", {}};
    for (int w = 0; w < spec.world; ++w) {
      proto::JobId j = proto::JobId::make(stranger_key(1), spec.label, static_cast<uint16_t>(spec.world));
      j.with_seed(1);
      k.reqs.push_back(proto::make_leave(j, static_cast<uint16_t>(w), 1000));
    }
    kinds.push_back(k);
    k = Kind{"unauthenticated STATS", {}};
    proto::Header sh;
    sh.type = MsgType::kStats;
    sh.job = proto::make_job_id(0, 0);
    sh.seq = 9;
    k.reqs.push_back(proto::make_packet(sh, Bytes(proto::kStatsRequestBytes, 0), nullptr));
    kinds.push_back(k);
    k = Kind{"replayed operator STATS", {}};
    const auth::TagKey op = auth::stats_key(test_key(0));
    // What the operator's monitoring sent (the snapshots of this test), replayed from elsewhere.
    const Bytes rec = proto::make_stats(stats_nonce(), &op);
    { Sock monitor; monitor.send(agg.host(), agg.port(), rec); monitor.drain(100); }
    for (int i = 0; i < 5; ++i) k.reqs.push_back(rec);
    kinds.push_back(k);
    for (const Kind& kind : kinds) {
      Sock victim;
      for (const Bytes& q : kind.reqs) victim.send(agg.host(), agg.port(), q);
      victim.drain(150);
      measured[kind.name] = {victim.sent_bytes, victim.recv_bytes};
    }
  };
  run_job(agg, spec, &run, h);
  expect_exact(spec, run);
  for (const auto& [name, m] : measured) {
    std::printf("amplification %-24s sent %7llu bytes, the sender's address received %7llu\n", name.c_str(),
                static_cast<unsigned long long>(m.first), static_cast<unsigned long long>(m.second));
    EXPECT_LE(m.second, m.first) << name << ": the sender's address received more than it sent";
  }
}

// Reflection onto a worker: a replayed data packet of a finished slot draws the stored RESULT,
// sent to the worker's registered address. The attacker chooses neither the address nor the
// content, but each replay makes the aggregator send the worker a datagram that is, for the index
// form, several times larger than the replay: the bytes the aggregator sends in answer to replays
// may not exceed the replayed bytes.
TEST(Attack, ReplayedDataDrawsNoAmplifiedResultsTowardsTheWorker) {
  AggregatorProcess agg;
  JobSpec spec;
  spec.label = 113;
  JobRun run(spec.world);
  uint64_t replay_bytes = 0, tx = 0, resends = 0;
  Hooks h;
  h.between = [&](JobRun& r) {
    Sock attacker;
    // Each worker's newest packets: their slots still hold the results (retransmission service).
    std::vector<Bytes> newest;
    for (int w = 0; w < spec.world; ++w) {
      const auto d = r.cap.select(true, kDataTypes, w);
      for (size_t i = d.size() > 2 * kSlots ? d.size() - 2 * kSlots : 0; i < d.size(); ++i) newest.push_back(d[i].b);
    }
    const Counters c0 = snap(agg);
    for (const Bytes& p : newest) {
      attacker.send(agg.host(), agg.port(), p);
      replay_bytes += p.size();
    }
    attacker.drain(150);
    const Counters c1 = snap(agg);
    tx = delta(c1, c0, "tx_bytes") - stats_reply_bytes(c0);
    resends = delta(c1, c0, "result_resends");
    EXPECT_EQ(attacker.recv_bytes, 0u);
  };
  run_job(agg, spec, &run, h);
  expect_exact(spec, run);
  std::printf("reflection: %llu replayed bytes drew %llu result resends, %llu bytes towards the workers (%.2fx)\n",
              static_cast<unsigned long long>(replay_bytes), static_cast<unsigned long long>(resends),
              static_cast<unsigned long long>(tx), replay_bytes ? static_cast<double>(tx) / static_cast<double>(replay_bytes) : 0.0);
  EXPECT_LE(tx, replay_bytes) << "replays of recorded packets make the aggregator send the workers more than the "
                                 "attacker sent";
}

// Liveness from replays: a worker of a quorum job dies in the middle of an operation; the
// aggregator completes the stuck slot without it once it has been silent for --dead-worker-ms.
// An attacker replaying one of the dead worker's recorded packets must not make it look alive
// (the survivors would wait for ever).
TEST(Attack, ReplaysOfADeadWorkersPacketsDoNotBlockStuckOpRecovery) {
  AggregatorProcess agg({"--dead-worker-ms", "100"});
  const uint16_t n = 3;
  proto::JoinParams jp;
  jp.quorum = 2;
  jp.quorum_timeout_us = 50'000;
  jp.slots = 8;
  std::vector<std::unique_ptr<HandWorker>> w;
  for (uint16_t r = 0; r < n; ++r) {
    w.push_back(std::make_unique<HandWorker>(agg, 120, n, r));
    w.back()->join(jp);
    if (HasFatalFailure()) return;
  }
  // Op 0 is two packets. Everybody sends the first; worker 2 dies before the second.
  for (uint16_t r = 0; r < n; ++r) w[r]->send(w[r]->values(0, 0, r + 1u));
  for (auto& x : w) ASSERT_FALSE(x->result_wait(0).empty());
  const Bytes recorded = w[2]->values(0, 0, 3);  // what the attacker captured of worker 2
  const Counters c0 = snap(agg);
  w[0]->send(w[0]->values(1, 0, 10));
  w[1]->send(w[1]->values(1, 0, 20));
  Sock attacker;
  std::atomic<bool> stop{false};
  std::thread replay([&] {
    while (!stop) {  // 10 ms apart: well inside the quorum timeout
      attacker.send(agg.host(), agg.port(), recorded);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // 8 quorum timeouts
  w[0]->result_wait(1);  // while the replays go on
  stop = true;
  replay.join();
  const Counters c1 = snap(agg);
  EXPECT_EQ(attacker.recv_bytes, 0u);
  EXPECT_FALSE(w[0]->result(1).empty()) << "the stuck slot never completed: replays of the dead worker's packet "
                                           "kept it 'heard'";
  EXPECT_EQ(delta(c1, c0, "stuck_completions"), 1u);
}

// Liveness from replays, job level: a job whose only worker vanished without LEAVE is freed after
// --job-idle-timeout. Replays of its recorded packet must not keep it (and its share of
// --max-jobs) alive.
TEST(Attack, ReplaysDoNotKeepAnAbandonedJobAlive) {
  AggregatorProcess agg({"--job-idle-timeout", "0.3"});
  HandWorker w(agg, 121, 1, 0);
  proto::JoinParams jp;
  w.join(jp);
  if (HasFatalFailure()) return;
  const Bytes recorded = w.values(0, 0, 7);
  w.send(recorded);
  ASSERT_FALSE(w.result_wait(0).empty());
  Sock attacker;
  for (int i = 0; i < 32; ++i) {  // 50 ms apart, for 1.6 s (expiry is checked once a second)
    attacker.send(agg.host(), agg.port(), recorded);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const Counters c = snap(agg);
  EXPECT_EQ(attacker.recv_bytes, 0u);
  EXPECT_EQ(c["jobs_expired"], 1u) << "replays of a recorded packet kept an abandoned job alive";
}


// ---- replays and restarts (issue 19, section 2) -------------------------------------------------
// One rule for every request type: a repeat (the newest nonce of a worker again) may only re-send
// the answer already given, an older one draws nothing, and neither changes state or liveness.

// A worker dies inside an op of a quorum job; its newest control request (a TABLE, a LEAVE or the
// JOIN with its cookie, sent from its address by an attacker that forges it) is replayed every
// 10 ms. The stuck slot must still complete without the dead worker after --dead-worker-ms.
void stuck_op_with_replayed_control(MsgType newest, uint32_t label) {
  AggregatorProcess agg({"--dead-worker-ms", "100"});
  const uint16_t n = 3;
  proto::JoinParams jp;
  jp.quorum = 2;
  jp.quorum_timeout_us = 50'000;
  jp.slots = 8;
  std::vector<std::unique_ptr<HandWorker>> w;
  for (uint16_t r = 0; r < n; ++r) {
    w.push_back(std::make_unique<HandWorker>(agg, label, n, r));
    w.back()->join(jp);
    if (::testing::Test::HasFatalFailure()) return;
  }
  Bytes recorded = w[2]->last_join;
  if (newest == MsgType::kTable) {
    proto::TableSpec t;
    t.id = 0;
    t.bits = 2;
    t.sum = proto::WireInt::kU32;
    w[2]->send(recorded = w[2]->table(t));
  }
  for (uint16_t r = 0; r < n; ++r) w[r]->send(w[r]->values(0, 0, r + 1u));
  for (auto& x : w) ASSERT_FALSE(x->result_wait(0).empty());
  if (newest == MsgType::kLeave) {
    w[2]->send(recorded = w[2]->leave());  // then it dies
    ASSERT_TRUE(w[2]->wait_count(MsgType::kLeaveAck, 1));
  } else if (newest == MsgType::kTable) {
    ASSERT_TRUE(w[2]->wait_count(MsgType::kTableAck, 1));
  }
  const Counters c0 = snap(agg);
  const uint64_t sent0 = w[2]->sock.sent_bytes, recv0 = w[2]->sock.recv_bytes;
  w[0]->send(w[0]->values(1, 0, 10));
  w[1]->send(w[1]->values(1, 0, 20));
  std::atomic<bool> stop{false};
  std::thread replay([&] {
    while (!stop) {  // 10 ms apart: well inside the quorum timeout
      w[2]->send(recorded);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // 8 quorum timeouts
  w[0]->result_wait(1);  // while the replays go on
  stop = true;
  replay.join();
  w[2]->sock.drain(30);
  const Counters c1 = snap(agg);
  // A repeat draws the answer already given (to the worker's own address), never more bytes.
  EXPECT_GT(w[2]->sock.recv_bytes, recv0) << "a repeat of the newest request is answered again";
  EXPECT_LE(w[2]->sock.recv_bytes - recv0, w[2]->sock.sent_bytes - sent0) << "answers to repeats amplify";
  EXPECT_FALSE(w[0]->result(1).empty()) << "the stuck slot never completed: replays of the dead worker's "
                                        << proto::msg_type_name(newest) << " kept it 'heard'";
  EXPECT_EQ(delta(c1, c0, "stuck_completions"), 1u);
}
TEST(Attack, ReplayedTableDoesNotBlockStuckOpRecovery) { stuck_op_with_replayed_control(MsgType::kTable, 130); }
TEST(Attack, ReplayedLeaveDoesNotBlockStuckOpRecovery) { stuck_op_with_replayed_control(MsgType::kLeave, 131); }
TEST(Attack, ReplayedCookieJoinDoesNotBlockStuckOpRecovery) { stuck_op_with_replayed_control(MsgType::kJoin, 132); }

// Abandoned jobs (their workers vanished without LEAVE, or only some left) are freed after
// --job-idle-timeout; replays of their workers' newest TABLE, LEAVE and cookie JOIN (from the
// workers' addresses) must not keep them, and their share of --max-jobs, alive.
TEST(Attack, ReplayedControlRequestsDoNotKeepAnAbandonedJobAlive) {
  AggregatorProcess agg({"--job-idle-timeout", "0.3"});
  proto::JoinParams jp;
  jp.quorum = 2;
  proto::TableSpec t;
  t.id = 1;
  t.bits = 1;
  t.sum = proto::WireInt::kU8;
  HandWorker a0(agg, 133, 2, 0), a1(agg, 133, 2, 1), b0(agg, 134, 2, 0), b1(agg, 134, 2, 1);
  for (HandWorker* x : {&a0, &a1, &b0, &b1}) {
    x->join(jp);
    if (HasFatalFailure()) return;
  }
  a0.send(a0.table(t));  // job A: both workers' newest request is a TABLE
  a1.send(a1.table(t));
  b0.send(b0.leave());   // job B: one worker left, the other vanished after its JOIN
  ASSERT_TRUE(a0.wait_count(MsgType::kTableAck, 1));
  ASSERT_TRUE(a1.wait_count(MsgType::kTableAck, 1));
  ASSERT_TRUE(b0.wait_count(MsgType::kLeaveAck, 1));
  for (int i = 0; i < 32; ++i) {  // 50 ms apart, for 1.6 s (expiry is checked once a second)
    a0.send(a0.last_table);
    a1.send(a1.last_table);
    b0.send(b0.last_leave);
    b1.send(b1.last_join);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const Counters c = snap(agg);
  EXPECT_EQ(c["jobs_expired"], 2u) << "replays of recorded control requests kept abandoned jobs alive";
}

// Every worker of a job LEFT (the job is freed); the cookie JOINs of its workers are replayed from
// their addresses while the cookies still verify. Nothing may be re-created or answered, and a new
// run of the same label (here with another world size) must work at once.
TEST(Attack, ReplayedJoinsDoNotRecreateAFinishedJob) {
  AggregatorProcess agg;
  const uint32_t label = 135;
  proto::JoinParams jp;
  jp.quorum = 2;
  HandWorker w0(agg, label, 2, 0), w1(agg, label, 2, 1);
  for (HandWorker* x : {&w0, &w1}) {
    x->join(jp);
    if (HasFatalFailure()) return;
  }
  w0.send(w0.leave());
  w1.send(w1.leave());
  ASSERT_TRUE(w0.wait_count(MsgType::kLeaveAck, 1));
  ASSERT_TRUE(w1.wait_count(MsgType::kLeaveAck, 1));
  Counters c0 = snap(agg);
  ASSERT_EQ(c0["jobs_freed"], 1u);
  w0.sock.got.clear();
  w1.sock.got.clear();
  const uint64_t rx0 = w0.sock.recv_bytes + w1.sock.recv_bytes;
  for (int i = 0; i < 5; ++i) {
    w0.send(w0.last_join);
    w1.send(w1.last_join);
  }
  w0.sock.drain(50);
  w1.sock.drain(50);
  const Counters c1 = snap(agg);
  EXPECT_EQ(delta(c1, c0, "jobs_created"), 0u) << "a replayed JOIN re-created the finished job";
  EXPECT_EQ(w0.sock.recv_bytes + w1.sock.recv_bytes, rx0) << "replayed JOINs of a finished job drew answers";
  EXPECT_EQ(delta(c1, c0, "drop_replay"), 10u);

  JobSpec spec;
  spec.label = label;
  JobRun run(spec.world);
  run_job(agg, spec, &run);
  expect_exact(spec, run);
}

// Restart: with a fixed --seed (the tests' own aggregators run with --seed 1), a data packet
// recorded before the aggregator restarted is replayed into the next process's job of the same
// label. It must not verify there: the seed (hence the data key) of every job incarnation is
// fresh per process, --seed or not.
TEST(Attack, DataRecordedBeforeARestartDoesNotVerifyAfterIt) {
  const uint32_t label = 136;
  proto::JoinParams jp;
  jp.quorum = 2;
  Bytes recorded;
  uint64_t seed1 = 0;
  {
    AggregatorProcess before;
    HandWorker w0(before, label, 2, 0), w1(before, label, 2, 1);
    w0.join(jp);
    w1.join(jp);
    if (HasFatalFailure()) return;
    recorded = w0.values(0, 0, 1000);
    w0.send(recorded);
    w1.send(w1.values(0, 0, 2));
    ASSERT_FALSE(w0.result_wait(0).empty());
    EXPECT_EQ(lane0(w0.result(0)), 1002u);
    seed1 = w0.seed();
  }
  AggregatorProcess after;
  HandWorker w0(after, label, 2, 0), w1(after, label, 2, 1);
  w0.join(jp);
  w1.join(jp);
  if (HasFatalFailure()) return;
  EXPECT_NE(w0.seed(), seed1) << "the job's seed repeated across the restart";
  const Counters c0 = snap(after);
  Sock attacker;
  attacker.send(after.host(), after.port(), recorded);
  attacker.drain(30);
  w0.send(w0.values(0, 0, 1));
  w1.send(w1.values(0, 0, 2));
  ASSERT_FALSE(w0.result_wait(0).empty());
  const Counters c1 = snap(after);
  EXPECT_EQ(lane0(w0.result(0)), 3u) << "a packet recorded before the restart was added";
  EXPECT_EQ(delta(c1, c0, "drop_bad_tag"), 1u);
  EXPECT_EQ(attacker.recv_bytes, 0u);
}

// Partial aggregation: worker 2 rejoined a quorum job (REJOIN JOIN, resumed at a MAX op). Later,
// while it is slightly late with an op, its recorded REJOIN JOIN is replayed from its address. The
// replay must not re-apply the rejoin bookkeeping (which would make the job think worker 2 comes
// back only at the next call and complete its op without it).
TEST(Attack, ReplayedRejoinDoesNotChangeAPartialJobsMembership) {
  AggregatorProcess agg;
  const uint16_t n = 3;
  proto::JoinParams jp;
  jp.quorum = 2;
  jp.quorum_timeout_us = 3'000'000;  // longer than the test: only the view completes slots
  jp.slots = 8;
  std::vector<std::unique_ptr<HandWorker>> w;
  for (uint16_t r = 0; r < n; ++r) {
    w.push_back(std::make_unique<HandWorker>(agg, 137, n, r));
    w.back()->join(jp);
    if (HasFatalFailure()) return;
  }
  auto all_send = [&](std::vector<int> who, uint64_t seq, uint32_t op, MsgType t, uint32_t v) {
    for (int r : who) w[r]->send(w[r]->values(seq, op, v, t, true));
  };
  all_send({0, 1, 2}, 0, 0, MsgType::kDataMax, 1);  // op 0: a call's MAX prelude
  ASSERT_FALSE(w[0]->result_wait(0).empty());
  // Worker 2 rejoins (as after being left behind): registered, then resumed at op 1, a MAX op.
  Bytes r = w[2]->join_again(proto::kJoinRejoin);
  ASSERT_FALSE(r.empty());
  ASSERT_EQ(r[5], static_cast<uint8_t>(MsgType::kJoinAck));
  EXPECT_FALSE(w[2]->ack.resume_flags & proto::kResumeKnown);
  all_send({0}, 1, 1, MsgType::kDataMax, 1);  // arrives before the JOIN below (one path, in order)
  r = w[2]->join_again(proto::kJoinRejoin);
  ASSERT_FALSE(r.empty());
  ASSERT_EQ(r[5], static_cast<uint8_t>(MsgType::kJoinAck));
  ASSERT_TRUE(w[2]->ack.resume_flags & proto::kResumeKnown);
  ASSERT_EQ(w[2]->ack.resume_op, 1u);
  const Bytes rejoin = w[2]->last_join;
  all_send({1, 2}, 1, 1, MsgType::kDataMax, 1);
  all_send({0, 1, 2}, 2, 2, MsgType::kDataValue, 10);  // op 2: everybody counted
  all_send({0, 1, 2}, 3, 3, MsgType::kDataMax, 1);     // op 3: the next call's prelude
  ASSERT_FALSE(w[0]->result_wait(2).empty());
  ASSERT_FALSE(w[0]->result_wait(3).empty());
  EXPECT_EQ(lane0(w[0]->result(2)), 30u);
  // Op 4: worker 2 is slightly late. The attacker replays its REJOIN JOIN meanwhile, and worker 0
  // already starts op 5 (the next call's prelude; its window allows it).
  all_send({0, 1}, 4, 4, MsgType::kDataValue, 10);
  w[2]->send(rejoin);
  all_send({0}, 5, 5, MsgType::kDataMax, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the replay's harm, if any, is done
  all_send({2}, 4, 4, MsgType::kDataValue, 10);
  const Bytes res = w[0]->result_wait(4);
  ASSERT_FALSE(res.empty());
  EXPECT_EQ(lane0(res), 30u) << "the replayed REJOIN left the live worker 2 out of op 4";
  EXPECT_EQ(bitmap_of(res), 7u);
}

// Exhaustion by another tenant: tenant 2 (a key holder, from two source addresses) asks for as
// much as the aggregator grants (8192 lanes, 4096 slots per job, then smaller jobs when refused).
// A job is charged only what its negotiated lanes and payload budget can use (at a 1500-byte MTU
// at most 1408 bytes of registers per shadow set, not 8192 x 4 bytes), and no tenant takes more
// than its share of --max-jobs and --max-memory: tenant 1's job still runs.
TEST(Attack, AnotherTenantCannotTakeWhatATenantIsGuaranteed) {
  AggregatorProcess agg({"--max-jobs", "8", "--max-jobs-per-source", "4"});
  proto::JoinParams big;
  big.quorum = 1;
  big.slots = 4096;
  big.max_lanes = proto::kMaxLanes;
  big.payload_budget = proto::kMaxPayloadBudget;
  const uint64_t rss0 = agg.resident_bytes();
  int granted = 0, refused = 0;
  uint32_t label = 1;
  for (const char* ip : {"127.0.0.2", "127.0.0.3"}) {
    for (int i = 0; i < 8; ++i) {
      for (uint16_t slots : {uint16_t{4096}, uint16_t{64}, uint16_t{1}}) {
        proto::JoinParams jp = big;
        jp.slots = slots;
        HandWorker g(agg, label++, 1, 0, test_key(2), ip);
        g.sock.send(agg.host(), agg.port(), proto::make_join(proto::JobId::make(test_key(2), label - 1, 1), 0, jp, 1));
        ASSERT_TRUE(g.sock.wait_one(5000));
        proto::JoinParams withc = jp;
        withc.cookie = g.sock.got[0].data() + proto::kHeaderBytes;
        g.sock.send(agg.host(), agg.port(), proto::make_join(proto::JobId::make(test_key(2), label - 1, 1), 0, withc, 2));
        ASSERT_TRUE(g.sock.wait_one(5000));  // allocating a job may take a while
        if (g.sock.got[1][5] == static_cast<uint8_t>(MsgType::kJoinAck)) {
          proto::JoinAckBody a;
          ASSERT_EQ(proto::parse_join_ack(g.sock.got[1].data() + proto::kHeaderBytes, proto::kJoinAckBytes, &a),
                    proto::ParseError::kOk);
          if (granted == 0) {
            EXPECT_LE(a.max_lanes, proto::kPayloadBudget1500) << "lanes granted beyond what the payload budget carries";
            EXPECT_LT(static_cast<int64_t>(agg.resident_bytes()) - static_cast<int64_t>(rss0), int64_t{64} << 20)
                << "one JOIN made the aggregator resident for registers no packet can use";
          }
          ++granted;
          break;
        }
        ++refused;
      }
    }
  }
  EXPECT_LE(granted, 4) << "tenant 2 took more than its share of --max-jobs 8 (two tenants)";
  EXPECT_GT(refused, 0);
  JobSpec spec;
  spec.label = 138;
  JobRun run(spec.world);
  run_job(agg, spec, &run);
  expect_exact(spec, run);
}

// Restart: an operator STATS request recorded before the aggregator restarted is replayed to the
// next process. Its nonce is from before that process started: no reply.
TEST(Attack, RecordedStatsAreNotAnsweredAfterARestart) {
  const auth::TagKey op = auth::stats_key(test_key(0));
  Bytes recorded;
  {
    AggregatorProcess before({"--no-loopback-stats"});
    recorded = proto::make_stats(stats_nonce(), &op);
    Sock monitor;
    monitor.send(before.host(), before.port(), recorded);
    ASSERT_TRUE(monitor.wait_one(5000));
  }
  AggregatorProcess after({"--no-loopback-stats"});
  Sock attacker;  // the first request the new process sees (a snapshot would raise its nonce floor)
  for (int i = 0; i < 5; ++i) attacker.send(after.host(), after.port(), recorded);
  attacker.drain(100);
  const Counters c = snap(after);
  EXPECT_EQ(attacker.recv_bytes, 0u) << "a STATS request recorded before the restart was answered";
  EXPECT_EQ(c["drop_replay"], 5u);
}

// Retransmissions numbered 255 and above: each new attempt of a finished slot's packet draws its
// result once (a worker that lost many results in a row still gets them), and copies of any of them
// draw nothing.
TEST(Attack, EveryAttemptNumberIsAnsweredOnce) {
  AggregatorProcess agg;
  proto::JoinParams jp;
  jp.quorum = 2;
  HandWorker w0(agg, 139, 2, 0), w1(agg, 139, 2, 1);
  w0.join(jp);
  w1.join(jp);
  if (HasFatalFailure()) return;
  const Bytes p = w0.values(0, 0, 5);
  w0.send(p);
  w1.send(w1.values(0, 0, 6));
  ASSERT_TRUE(w0.wait_count(MsgType::kResult, 1));
  size_t want = 1;
  std::vector<uint16_t> attempts = {1, 2, 253, 254, 255, 256, 257, 300, 1000, 65534, 65535};
  for (uint16_t a : attempts) {
    w0.send(w0.resend(p, a));
    EXPECT_TRUE(w0.wait_count(MsgType::kResult, ++want)) << "attempt " << a << " was not answered";
  }
  for (uint16_t a : {uint16_t{255}, uint16_t{256}, uint16_t{65535}}) w0.send(w0.resend(p, a));
  w0.sock.drain(30);
  EXPECT_EQ(w0.count(MsgType::kResult), want) << "a copy of an answered attempt drew another result";
}

// A channel that can die: the worker's process crashed (nothing it would send leaves, not even its
// LEAVE, and nothing arrives).
class CrashableChannel final : public DatagramChannel {
 public:
  CrashableChannel(const std::string& url, std::shared_ptr<std::atomic<bool>> dead)
      : in_(thc::transport::make_udp_channel(url)), dead_(std::move(dead)) {}
  void send(const uint8_t* p, size_t n) override {
    if (!*dead_) in_->send(p, n);
  }
  void flush() override { in_->flush(); }
  size_t recv(uint8_t* buf, size_t cap) override { return *dead_ ? 0 : in_->recv(buf, cap); }
  void wait_us(uint64_t t) override { in_->wait_us(t); }
  int poll_fd() const override { return in_->poll_fd(); }
  bool pending() const override { return !*dead_ && in_->pending(); }
  int payload_budget() const override { return in_->payload_budget(); }
  std::string kind() const override { return in_->kind(); }
  std::string peer() const override { return in_->peer(); }

 private:
  std::unique_ptr<DatagramChannel> in_;
  std::shared_ptr<std::atomic<bool>> dead_;
};

UdpClientOptions restart_opts(const AggregatorProcess& agg, uint32_t label, int world, int rank) {
  UdpClientOptions o;
  o.address = agg.url();
  o.rank = rank;
  o.world = world;
  o.job_label = label;
  o.key = test_key(1);
  o.slots = kSlots;
  o.max_lanes = 256;
  o.max_wait_ms = 3000;
  o.fault_from_env = false;
  return o;
}

// Every rank of a job crashed in the middle of its work (no LEAVE reached the aggregator), and the
// job is started again under the same label. The dead instance must not stand in the way until the
// idle timeout: once every one of its workers has come back with a fresh JOIN, a new incarnation
// replaces it, and the new run's results are exact.
TEST(Attack, AJobRestartedAfterAllItsWorkersCrashedRunsAtOnce) {
  AggregatorProcess agg;
  JobSpec spec;
  spec.world = 3;
  spec.label = 140;
  {
    auto dead = std::make_shared<std::atomic<bool>>(false);
    std::vector<std::thread> ts;
    std::vector<std::unique_ptr<UdpReducer>> red(spec.world);
    for (int r = 0; r < spec.world; ++r)
      ts.emplace_back([&, r] {
        red[r] = std::make_unique<UdpReducer>(restart_opts(agg, spec.label, spec.world, r),
                                              std::make_unique<CrashableChannel>(agg.url(), dead));
        thc::test::wl_run(*red[r], spec.count, 3);
        // The next call starts, and the processes crash in the middle of it.
        std::vector<uint32_t> v(5000, 1);
        auto q = red[r]->start_sum(v.data(), v.size(), IntType::kU32);
      });
    for (auto& t : ts) t.join();
    *dead = true;
    red.clear();  // their LEAVEs go nowhere
  }
  const Counters c0 = snap(agg);
  ASSERT_EQ(c0["jobs_freed"], 0u);
  JobRun run(spec.world);
  run_job(agg, spec, &run);
  expect_exact(spec, run);
  const Counters c1 = snap(agg);
  EXPECT_EQ(delta(c1, c0, "jobs_created"), 1u) << "a new incarnation replaced the dead one";
}

// One rank of a job (without a quorum) crashed and restarted while the other is alive: the
// restarted worker cannot take part in the run already under way (its calls start at op 0). It is
// told so, with what it waits for, instead of joining and timing out call by call (or worse,
// receiving the results of the earlier run's first operations).
TEST(Attack, ARestartedWorkerOfARunningJobIsToldWhatItWaitsFor) {
  AggregatorProcess agg;
  const uint32_t label = 141;
  auto dead = std::make_shared<std::atomic<bool>>(false);
  std::unique_ptr<UdpReducer> alive, crashed;
  std::thread t([&] { alive = std::make_unique<UdpReducer>(restart_opts(agg, label, 2, 0)); });
  crashed = std::make_unique<UdpReducer>(restart_opts(agg, label, 2, 1), std::make_unique<CrashableChannel>(agg.url(), dead));
  t.join();
  std::thread t2([&] { thc::test::wl_run(*alive, 300, 3); });
  thc::test::wl_run(*crashed, 300, 3);
  t2.join();
  *dead = true;
  crashed.reset();
  UdpClientOptions o = restart_opts(agg, label, 2, 1);
  o.max_wait_ms = 2000;
  try {
    UdpReducer again(o);
    FAIL() << "a restarted worker joined a job whose run is under way";
  } catch (const thc::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--job-idle-timeout"), std::string::npos) << e.what();
  }
  const Counters c = snap(agg);
  EXPECT_GT(c["drop_job_busy"], 0u);
}

}  // namespace
