// Untagged RESULTs (tag 0: what a switch data plane sends, which cannot compute SipHash) are taken
// only on a job whose authenticated JOIN_ACK carried kAckDataPlane. Against the software
// thc-aggregator a relay between the workers and the aggregator forges, for every data packet it
// passes on, an untagged RESULT for exactly that packet (well-formed, in flight, every worker
// counted, from the aggregator's address) with wrong sums, ahead of the genuine answer: the
// workers must ignore every forgery (counted as bad tags) and get the exact sums.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "switch_offload/protocol/builder.h"
#include "tests/switch_offload/aggregator_process.h"
#include "tests/transport/switch_client/workload.h"
#include "transport/switch_client/udp/udp_client.h"

namespace {

using namespace thc::switch_offload::proto;

int udp_socket(uint16_t port = 0) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("bind");
  return fd;
}
uint16_t port_of(int fd) {
  sockaddr_in a{};
  socklen_t n = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  return ntohs(a.sin_port);
}

// Relays one job's datagrams between its workers and the aggregator (one upstream socket per
// worker, so the aggregator sees distinct addresses), forging an untagged RESULT per data packet.
class ForgingRelay {
 public:
  ForgingRelay(uint16_t agg_port, int workers) : agg_port_(agg_port) {
    front_ = udp_socket();
    for (int w = 0; w < workers; ++w) back_.push_back(udp_socket());
    peer_.resize(workers);
    thread_ = std::thread([this] { run(); });
  }
  ~ForgingRelay() {
    stop_ = true;
    thread_.join();
    ::close(front_);
    for (int fd : back_) ::close(fd);
  }
  std::string url() const { return "udp://127.0.0.1:" + std::to_string(port_of(front_)); }
  uint64_t forged() const { return forged_.load(); }

 private:
  void run() {
    std::vector<uint8_t> b(65536);
    std::vector<pollfd> fds;
    fds.push_back({front_, POLLIN, 0});
    for (int fd : back_) fds.push_back({fd, POLLIN, 0});
    sockaddr_in agg{};
    agg.sin_family = AF_INET;
    agg.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    agg.sin_port = htons(agg_port_);
    while (!stop_) {
      if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        sockaddr_in from{};
        socklen_t fl = sizeof from;
        const ssize_t n = ::recvfrom(front_, b.data(), b.size(), 0, reinterpret_cast<sockaddr*>(&from), &fl);
        Header h;
        const uint8_t* pl;
        size_t plen;
        if (n > 0 && parse(b.data(), static_cast<size_t>(n), &h, &pl, &plen) == ParseError::kOk &&
            h.worker < peer_.size()) {
          peer_[h.worker] = from;
          if (h.type == MsgType::kDataValue || h.type == MsgType::kDataIndex || h.type == MsgType::kDataMax)
            forge(h, from);
          (void)::sendto(back_[h.worker], b.data(), static_cast<size_t>(n), 0, reinterpret_cast<sockaddr*>(&agg),
                         sizeof agg);
        }
      }
      for (size_t w = 0; w < back_.size(); ++w) {
        if (!(fds[w + 1].revents & POLLIN)) continue;
        const ssize_t n = ::recv(back_[w], b.data(), b.size(), 0);
        if (n > 0)
          (void)::sendto(front_, b.data(), static_cast<size_t>(n), 0, reinterpret_cast<sockaddr*>(&peer_[w]),
                         sizeof peer_[w]);
      }
    }
  }
  // What a data plane would answer for this packet, with every lane wrong and tag 0.
  void forge(const Header& up, const sockaddr_in& to) {
    Header r;
    r.type = MsgType::kResult;
    r.job = up.job;
    r.shard = up.shard;
    r.worker = up.worker;
    r.nworkers = up.nworkers;
    r.slot = up.slot;
    r.shadow = up.shadow;
    r.lanes = up.lanes;
    r.enc = up.type == MsgType::kDataMax ? WireInt::kU32 : up.enc;
    r.count = up.count;
    r.contributors = up.nworkers;
    r.bitmap = up.nworkers >= 64 ? ~uint64_t{0} : (uint64_t{1} << up.nworkers) - 1;
    r.seq = up.seq;
    r.op = up.op;
    r.tag = 0;
    const std::vector<uint8_t> p =
        make_packet(r, std::vector<uint8_t>(data_payload_bytes(MsgType::kResult, r.enc, 0, r.lanes), 0x5A), nullptr);
    Header chk;
    const uint8_t* pl;
    size_t plen;
    if (parse(p.data(), p.size(), &chk, &pl, &plen) != ParseError::kOk) return;  // counted as not forged
    (void)::sendto(front_, p.data(), p.size(), 0, reinterpret_cast<const sockaddr*>(&to), sizeof to);
    forged_++;
  }

  uint16_t agg_port_;
  int front_ = -1;
  std::vector<int> back_;
  std::vector<sockaddr_in> peer_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> forged_{0};
  std::thread thread_;
};

TEST(UntaggedResult, IgnoredOnASoftwareAggregatorJob) {
  thc::test::AggregatorProcess agg;
  constexpr int kWorld = 2;
  constexpr uint64_t kCount = 1500;
  ForgingRelay relay(agg.port(), kWorld);
  std::vector<std::vector<uint8_t>> out(kWorld);
  std::vector<thc::transport::UdpClientStats> st(kWorld);
  std::vector<std::string> err(kWorld);
  std::vector<std::thread> ts;
  for (int r = 0; r < kWorld; ++r)
    ts.emplace_back([&, r] {
      try {
        thc::transport::UdpClientOptions o;
        o.address = relay.url();
        o.rank = r;
        o.world = kWorld;
        o.job_label = 77;
        o.key = thc::test::test_key(1);
        o.slots = 16;
        o.max_lanes = 256;
        o.max_wait_ms = 30000;
        o.fault_from_env = false;
        thc::transport::UdpReducer red(o);
        out[r] = thc::test::wl_run(red, kCount, 3).bytes;
        st[r] = red.stats();
      } catch (const std::exception& e) {
        err[r] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  const auto want = thc::test::wl_expected(kWorld, kCount, 3);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(err[r], "") << "rank " << r;
    EXPECT_EQ(out[r], want) << "rank " << r << " took a forged untagged RESULT";
    EXPECT_GT(st[r].bad_tags, 0u) << "rank " << r << " saw no forgery";
  }
  EXPECT_GT(relay.forged(), 0u);
  EXPECT_GE(st[0].bad_tags + st[1].bad_tags, relay.forged()) << "every forgery must be refused as unauthenticated";
}

}  // namespace
