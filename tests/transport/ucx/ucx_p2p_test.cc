// The UCX point-to-point transport in one process: a listener and a connector on the first
// device, both driven from the test thread by polling (as NCCL's proxy does), UCX used for real.
// Every polling loop has a deadline, so a bug fails a test instead of hanging it.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "transport/ucx/ucx_p2p.h"

namespace {

using thc::transport::ucx::Address;
using thc::transport::ucx::Connector;
using thc::transport::ucx::Context;
using thc::transport::ucx::Endpoint;
using thc::transport::ucx::Limits;
using thc::transport::ucx::Listener;
using thc::transport::ucx::Request;
using Clock = std::chrono::steady_clock;
constexpr auto kDeadline = std::chrono::seconds(60);

std::shared_ptr<Context> context() {
  static std::shared_ptr<Context> ctx = [] {
    const auto d = thc::transport::ucx::discover_devices();
    if (d.devices.empty()) throw std::runtime_error("no device: " + d.note);
    return std::make_shared<Context>(d.devices[0]);
  }();
  return ctx;
}

struct Pair {
  std::unique_ptr<Endpoint> send, recv;
};

Pair connect_pair(const Limits& lim = Limits{}) {
  Listener l(context(), lim);
  Connector c(context(), l.address(), lim);
  Pair p;
  const auto end = Clock::now() + kDeadline;
  while (!p.send || !p.recv) {
    if (!p.send) p.send = c.poll();
    if (!p.recv) p.recv = l.poll_accept();
    if (Clock::now() > end) throw std::runtime_error("connection not up within the deadline");
  }
  return p;
}

// Drive both ends until every listed request completed.
struct Pending {
  Endpoint* ep;
  Request* r;
  int n;
  std::vector<size_t> sizes;
  bool done = false;
};
void drive(std::vector<Pending>& ps) {
  const auto end = Clock::now() + kDeadline;
  for (;;) {
    bool all = true;
    for (auto& p : ps) {
      if (p.done) continue;
      p.sizes.assign(static_cast<size_t>(p.n), ~size_t{0});
      p.done = p.ep->test(p.r, p.sizes.data());
      all = all && p.done;
    }
    if (all) return;
    if (Clock::now() > end) throw std::runtime_error("requests not done within the deadline");
  }
}

std::vector<char> pattern(size_t n, uint32_t seed) {
  std::vector<char> v(n);
  std::mt19937 g(seed);
  for (auto& c : v) c = static_cast<char>(g());
  return v;
}

// The first n bytes agree (an empty vector's data() may be null: no memcmp then).
bool same(const std::vector<char>& a, const std::vector<char>& b, size_t n) {
  return n == 0 || (a.size() >= n && b.size() >= n && std::memcmp(a.data(), b.data(), n) == 0);
}

TEST(UcxP2p, DiscoversADevice) {
  const auto d = thc::transport::ucx::discover_devices();
  ASSERT_FALSE(d.devices.empty()) << d.note;
  for (const auto& dev : d.devices) {
    EXPECT_FALSE(dev.name.empty());
    EXPECT_GT(dev.speed_mbps, 0);
  }
}

TEST(UcxP2p, SizesZeroOneOddLarge) {
  Pair p = connect_pair();
  const std::vector<size_t> sizes = {0, 1, 7, 4093, size_t{4} << 20, 3};
  std::vector<std::vector<char>> out, in;
  std::vector<Pending> ps;
  for (size_t i = 0; i < sizes.size(); ++i) {
    out.push_back(pattern(sizes[i], static_cast<uint32_t>(i)));
    in.emplace_back(sizes[i] + 16, '\0');  // receive buffers larger than the message
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    void* buf = in[i].data();
    const size_t cap = in[i].size();
    const uint32_t tag = 5;
    Request* r = p.recv->recv(1, &buf, &cap, &tag);
    ASSERT_NE(r, nullptr);
    ps.push_back({p.recv.get(), r, 1, {}});
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    Request* r = p.send->send(out[i].data(), sizes[i], 5);
    ASSERT_NE(r, nullptr);
    ps.push_back({p.send.get(), r, 1, {}});
  }
  drive(ps);
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(ps[i].sizes[0], sizes[i]) << "receive " << i;
    EXPECT_EQ(ps[sizes.size() + i].sizes[0], sizes[i]) << "send " << i;
    EXPECT_TRUE(same(in[i], out[i], sizes[i])) << "message " << i;
  }
}

// Messages that arrive before their receive is posted (UCX's unexpected queue) keep their length
// and their order, small (eager) and large (rendezvous) mixed.
TEST(UcxP2p, UnexpectedMessagesKeepLengthAndOrder) {
  Pair p = connect_pair();
  const std::vector<size_t> sizes = {5, 0, 1 << 20, 3, 100000, 1, 7};
  std::vector<std::vector<char>> out;
  std::vector<Pending> sends;
  for (size_t i = 0; i < sizes.size(); ++i) {
    out.push_back(pattern(sizes[i], 500u + static_cast<uint32_t>(i)));
    Request* r = p.send->send(out[i].data(), sizes[i], 4);
    ASSERT_NE(r, nullptr);
    sends.push_back({p.send.get(), r, 1, {}});
  }
  // let the eager ones arrive before any receive exists
  char dummy;
  void* b = &dummy;
  const size_t cap = 1;
  const uint32_t other = 999;  // testing it progresses the receiver without matching anything
  Request* q = p.recv->recv(1, &b, &cap, &other);
  ASSERT_NE(q, nullptr);
  const auto until = Clock::now() + std::chrono::milliseconds(200);
  while (Clock::now() < until) {
    for (auto& s : sends)
      if (!s.done) s.done = p.send->test(s.r, nullptr);
    ASSERT_FALSE(p.recv->test(q, nullptr));  // (left posted; cancelled when the endpoint closes)
  }
  std::vector<std::vector<char>> in;
  std::vector<Pending> recvs;
  for (size_t i = 0; i < sizes.size(); ++i) in.emplace_back(sizes[i] + 32, '\0');
  for (size_t i = 0; i < sizes.size(); ++i) {
    void* buf = in[i].data();
    const size_t size = in[i].size();
    const uint32_t tag = 4;
    Request* r = p.recv->recv(1, &buf, &size, &tag);
    ASSERT_NE(r, nullptr);
    recvs.push_back({p.recv.get(), r, 1, {}});
  }
  std::vector<Pending> all = recvs;
  for (auto& s : sends)
    if (!s.done) all.push_back(s);  // rendezvous sends finish once their receive exists
  drive(all);
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(all[i].sizes[0], sizes[i]) << "receive " << i;
    EXPECT_TRUE(same(in[i], out[i], sizes[i])) << "receive " << i;
  }
}

TEST(UcxP2p, GroupedReceiveMatchesByTag) {
  Pair p = connect_pair();
  const int n = 8;
  std::vector<std::vector<char>> out(n), in(n);
  std::vector<void*> bufs(n);
  std::vector<size_t> caps(n);
  std::vector<uint32_t> tags(n);
  for (int i = 0; i < n; ++i) {
    out[static_cast<size_t>(i)] = pattern(static_cast<size_t>(100 * i + 1), 77u + static_cast<uint32_t>(i));
    in[static_cast<size_t>(i)].assign(1000, '\0');
    bufs[static_cast<size_t>(i)] = in[static_cast<size_t>(i)].data();
    caps[static_cast<size_t>(i)] = 1000;
    tags[static_cast<size_t>(i)] = static_cast<uint32_t>(1000 + i);
  }
  std::vector<Pending> ps;
  Request* r = p.recv->recv(n, bufs.data(), caps.data(), tags.data());
  ASSERT_NE(r, nullptr);
  ps.push_back({p.recv.get(), r, n, {}});
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(3));
  for (int i : order) {
    Request* s = p.send->send(out[static_cast<size_t>(i)].data(), out[static_cast<size_t>(i)].size(), tags[static_cast<size_t>(i)]);
    ASSERT_NE(s, nullptr);
    ps.push_back({p.send.get(), s, 1, {}});
  }
  drive(ps);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(ps[0].sizes[static_cast<size_t>(i)], out[static_cast<size_t>(i)].size());
    EXPECT_TRUE(same(in[static_cast<size_t>(i)], out[static_cast<size_t>(i)], out[static_cast<size_t>(i)].size()));
  }
}

TEST(UcxP2p, TruncationIsAnError) {
  Pair p = connect_pair();
  std::vector<char> out = pattern(64, 1), in(16);
  void* buf = in.data();
  const size_t cap = in.size();
  const uint32_t tag = 1;
  Request* r = p.recv->recv(1, &buf, &cap, &tag);
  Request* s = p.send->send(out.data(), out.size(), 1);
  ASSERT_NE(r, nullptr);
  ASSERT_NE(s, nullptr);
  const auto end = Clock::now() + kDeadline;
  bool recv_failed = false;
  bool send_done = false;
  while (!recv_failed && Clock::now() < end) {
    try {
      if (!send_done) send_done = p.send->test(s, nullptr);
    } catch (const thc::Error&) {
      send_done = true;  // the sender may see the failure too (rendezvous); either way it ends
    }
    try {
      p.recv->test(r, nullptr);
    } catch (const thc::Error& e) {
      recv_failed = true;
      EXPECT_NE(std::string(e.what()).find("larger than the receive buffer"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(recv_failed);
}

TEST(UcxP2p, RequestPoolBound) {
  Limits lim;
  lim.max_requests = 4;
  Pair p = connect_pair(lim);
  char b = 0;
  std::vector<Pending> ps;
  for (int i = 0; i < 4; ++i) {
    void* buf = &b;
    const size_t cap = 1;
    const uint32_t tag = 9;
    Request* r = p.recv->recv(1, &buf, &cap, &tag);
    ASSERT_NE(r, nullptr);
    ps.push_back({p.recv.get(), r, 1, {}});
  }
  void* buf = &b;
  const size_t cap = 1;
  const uint32_t tag = 9;
  EXPECT_EQ(p.recv->recv(1, &buf, &cap, &tag), nullptr) << "a fifth receive beyond max_requests";
  for (int i = 0; i < 4; ++i) {
    Request* s = p.send->send(&b, 1, 9);
    ASSERT_NE(s, nullptr);
    ps.push_back({p.send.get(), s, 1, {}});
  }
  drive(ps);
  EXPECT_NE(p.recv->recv(1, &buf, &cap, &tag), nullptr) << "slots come back after test()";
}

TEST(UcxP2p, WrongNonceIsNotAccepted) {
  Limits lim;
  Listener l(context(), lim);
  Address bad = l.address();
  bad.nonce ^= 1;
  Connector c(context(), bad, lim);
  const auto end = Clock::now() + std::chrono::seconds(3);
  std::unique_ptr<Endpoint> e;
  while (Clock::now() < end) {
    try {
      c.poll();
    } catch (const thc::Error&) {
      // the listener dropped the connection: fine
    }
    e = l.poll_accept();
    ASSERT_EQ(e, nullptr) << "accepted a connection whose hello carried another nonce";
  }
}

TEST(UcxP2p, PeerGoneFailsPendingReceive) {
  Pair p = connect_pair();
  char b[8];
  void* buf = b;
  const size_t cap = sizeof b;
  const uint32_t tag = 2;
  Request* r = p.recv->recv(1, &buf, &cap, &tag);
  ASSERT_NE(r, nullptr);
  p.send.reset();  // closes the connection with the receive still posted
  const auto end = Clock::now() + kDeadline;
  bool failed = false;
  while (!failed && Clock::now() < end) {
    try {
      ASSERT_FALSE(p.recv->test(r, nullptr)) << "a receive completed without a message";
    } catch (const thc::Error& e) {
      failed = true;
    }
  }
  EXPECT_TRUE(failed) << "the receive neither failed nor completed after the peer closed";
}

// A sender that finished and closed before the receiver posted its receives: the messages are
// delivered, not lost (NCCL ranks tear down at their own pace).
TEST(UcxP2p, MessagesOutliveTheSendersClose) {
  Pair p = connect_pair();
  const std::vector<size_t> sizes = {3, 0, 5000, 11};  // eager: a send completes without its receiver
  std::vector<std::vector<char>> out;
  for (size_t i = 0; i < sizes.size(); ++i) {
    out.push_back(pattern(sizes[i], 900u + static_cast<uint32_t>(i)));
    Request* r = p.send->send(out[i].data(), sizes[i], 6);
    ASSERT_NE(r, nullptr);
    std::vector<Pending> one = {{p.send.get(), r, 1, {}}};
    drive(one);
  }
  thc::transport::ucx::close_in_background(std::move(p.send));  // finishes once the receiver progresses
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<char> in(sizes[i] + 8);
    void* b = in.data();
    const size_t cap = in.size();
    const uint32_t tag = 6;
    Request* r = p.recv->recv(1, &b, &cap, &tag);
    ASSERT_NE(r, nullptr);
    std::vector<Pending> one = {{p.recv.get(), r, 1, {}}};
    drive(one);
    EXPECT_EQ(one[0].sizes[0], sizes[i]);
    EXPECT_TRUE(same(in, out[i], sizes[i]));
  }
}

TEST(UcxP2p, BadAddressRejected) {
  Address a{};
  EXPECT_THROW(Connector(context(), a, Limits{}), thc::Error);
}

}  // namespace
