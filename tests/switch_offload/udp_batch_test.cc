// common/udp_batch: coalesced GRO buffers split into the datagrams as sent (a short last segment
// included), malformed segment sizes, GSO runs (of two-part datagrams too), oversized datagrams
// counted (never lost silently), and the same through thc-aggregator's server: garbage segments
// get a counted drop.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "common/net.h"
#include "common/udp_batch.h"
#include "switch_offload/aggregator/stats.h"
#include "switch_offload/protocol/auth.h"
#include "switch_offload/servers/udp/udp_server.h"

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef SOL_UDP
#define SOL_UDP 17
#endif

namespace {

using thc::PeerAddr;
using thc::UdpBatch;

PeerAddr loopback(uint16_t port) {
  PeerAddr a;
  auto* in = reinterpret_cast<sockaddr_in*>(&a.ss);
  in->sin_family = AF_INET;
  in->sin_port = htons(port);
  in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.len = sizeof(sockaddr_in);
  return a;
}

// A nonblocking UDP socket bound to 127.0.0.1 on an ephemeral port.
struct Sock {
  int fd = -1;
  uint16_t port = 0;
  Sock() {
    fd = thc::open_udp_socket(loopback(0), 1 << 20);
    PeerAddr a = loopback(0);
    EXPECT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&a.ss), a.len), 0);
    PeerAddr got;
    got.len = sizeof got.ss;
    EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&got.ss), &got.len), 0);
    port = ntohs(reinterpret_cast<sockaddr_in*>(&got.ss)->sin_port);
  }
  ~Sock() { ::close(fd); }
};

std::vector<uint8_t> pattern(size_t n, uint8_t salt) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + salt);
  return v;
}

// One sendmsg of `bytes` as a GSO buffer of seg-byte segments (the last one may be shorter).
bool send_gso(int fd, const PeerAddr& to, const std::vector<uint8_t>& bytes, uint16_t seg) {
  iovec iov{const_cast<uint8_t*>(bytes.data()), bytes.size()};
  alignas(cmsghdr) uint8_t ctl[CMSG_SPACE(sizeof(uint16_t))] = {};
  msghdr h{};
  h.msg_name = const_cast<sockaddr_storage*>(&to.ss);
  h.msg_namelen = to.len;
  h.msg_iov = &iov;
  h.msg_iovlen = 1;
  h.msg_control = ctl;
  h.msg_controllen = sizeof ctl;
  cmsghdr* cm = CMSG_FIRSTHDR(&h);
  cm->cmsg_level = SOL_UDP;
  cm->cmsg_type = UDP_SEGMENT;
  cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
  std::memcpy(CMSG_DATA(cm), &seg, sizeof seg);
  return ::sendmsg(fd, &h, 0) == static_cast<ssize_t>(bytes.size());
}

// Receive until `want` datagrams arrived (copied out) or two seconds passed.
std::vector<std::vector<uint8_t>> receive(UdpBatch* io, size_t want) {
  std::vector<std::vector<uint8_t>> got;
  std::vector<UdpBatch::Datagram> in;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (got.size() < want && std::chrono::steady_clock::now() < until) {
    if (io->recv_batch(&in, 256) == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    for (const auto& d : in) got.emplace_back(d.data, d.data + d.len);
  }
  return got;
}

TEST(UdpBatchSplit, SegmentsWithAShortLastOne) {
  const std::vector<uint8_t> b = pattern(350, 1);
  PeerAddr from = loopback(1);
  std::vector<UdpBatch::Datagram> out;
  ASSERT_EQ(UdpBatch::split_gro(b.data(), b.size(), 100, &from, &out), 4u);
  ASSERT_EQ(out.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(out[i].data, b.data() + 100 * i);
    EXPECT_EQ(out[i].len, i < 3 ? 100u : 50u);
    EXPECT_EQ(out[i].from, &from);
  }
  // Exact multiple: no empty tail segment.
  out.clear();
  EXPECT_EQ(UdpBatch::split_gro(b.data(), 300, 100, &from, &out), 3u);
  EXPECT_EQ(out.back().len, 100u);
}

TEST(UdpBatchSplit, MalformedSegmentSizesGiveOneDatagram) {
  const std::vector<uint8_t> b = pattern(64, 2);
  PeerAddr from = loopback(1);
  for (int seg : {0, -1, -65536, 64, 65, 1 << 30}) {
    std::vector<UdpBatch::Datagram> out;
    EXPECT_EQ(UdpBatch::split_gro(b.data(), b.size(), seg, &from, &out), 1u) << "seg " << seg;
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].data, b.data());
    EXPECT_EQ(out[0].len, 64u);
  }
  // An empty message stays one (empty) datagram for the engine to drop and count.
  std::vector<UdpBatch::Datagram> out;
  EXPECT_EQ(UdpBatch::split_gro(b.data(), 0, 100, &from, &out), 1u);
  EXPECT_EQ(out[0].len, 0u);
  // Tiny segments: every byte its own datagram, none past the buffer.
  out.clear();
  EXPECT_EQ(UdpBatch::split_gro(b.data(), 5, 1, &from, &out), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(out[i].data, b.data() + i);
  // Appends: what was there stays.
  EXPECT_EQ(UdpBatch::split_gro(b.data(), 10, 4, &from, &out), 3u);
  EXPECT_EQ(out.size(), 8u);
  EXPECT_EQ(out.back().len, 2u);
}

// A real coalesced buffer: a GSO send on loopback reaches a UDP_GRO socket as one buffer.
TEST(UdpBatchLoopback, GroBufferWithShortLastSegmentIsSplit) {
  Sock rx, tx;
  UdpBatch io(rx.fd, false, true, true);
  if (!io.gro()) GTEST_SKIP() << "the kernel refuses UDP_GRO";
  const std::vector<uint8_t> bytes = pattern(3 * 700 + 123, 3);
  if (!send_gso(tx.fd, loopback(rx.port), bytes, 700)) GTEST_SKIP() << "the kernel refuses UDP_SEGMENT";
  const auto got = receive(&io, 4);
  ASSERT_EQ(got.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const size_t len = i < 3 ? 700 : 123;
    EXPECT_EQ(got[i], std::vector<uint8_t>(bytes.begin() + 700 * i, bytes.begin() + 700 * i + len)) << i;
  }
  // The split path ran: the four came in one buffer.
  EXPECT_EQ(io.stats().gro_buffers, 1u);
  EXPECT_EQ(io.stats().gro_datagrams, 4u);
  EXPECT_EQ(io.stats().datagrams_received, 4u);
}

TEST(UdpBatchLoopback, WithoutGroTheKernelSegments) {
  Sock rx, tx;
  UdpBatch io(rx.fd, false, true, false);
  EXPECT_FALSE(io.gro());
  const std::vector<uint8_t> bytes = pattern(2 * 500 + 1, 4);
  if (!send_gso(tx.fd, loopback(rx.port), bytes, 500)) GTEST_SKIP() << "the kernel refuses UDP_SEGMENT";
  const auto got = receive(&io, 3);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[2], std::vector<uint8_t>{bytes.back()});
  EXPECT_EQ(io.stats().gro_buffers, 0u);
}

// UdpBatch to UdpBatch: equal-size runs go out as GSO buffers, the odd one alone, and the
// receiver sees every datagram as queued, in order.
TEST(UdpBatchLoopback, GsoRunsArriveAsQueued) {
  Sock rx, tx;
  UdpBatch in(rx.fd, false, true, true), out(tx.fd, false, true, true);
  std::vector<std::vector<uint8_t>> sent;
  for (int i = 0; i < 10; ++i) sent.push_back(pattern(768, static_cast<uint8_t>(i)));
  sent.push_back(pattern(77, 99));
  for (int i = 0; i < 5; ++i) sent.push_back(pattern(1472, static_cast<uint8_t>(50 + i)));
  for (const auto& d : sent) out.queue(loopback(rx.port), d.data(), d.size());
  out.flush();
  EXPECT_EQ(out.stats().datagrams_sent, sent.size());
  EXPECT_EQ(out.stats().send_errors, 0u);
  if (out.gso()) {
    EXPECT_EQ(out.stats().gso_buffers, 2u);
    EXPECT_EQ(out.stats().gso_datagrams, 15u);
  }
  EXPECT_EQ(receive(&in, sent.size()), sent);
}

// Two-part datagrams (a header copied, the payload sent in place, as the engine's results go
// out): each arrives as header + payload; equal-size ones form a GSO run, a one-part datagram of
// the same size does not join it, and the payload is read at flush(), not at queue time.
TEST(UdpBatchLoopback, TwoPartDatagramsArriveJoined) {
  Sock rx, tx;
  UdpBatch in(rx.fd, false, true, true), out(tx.fd, false, true, true);
  const std::vector<uint8_t> payload = pattern(1408, 7);
  std::vector<uint8_t> late = pattern(1408, 8);
  std::vector<std::vector<uint8_t>> sent;
  for (int w = 0; w < 4; ++w) {
    const std::vector<uint8_t> hdr = pattern(64, static_cast<uint8_t>(100 + w));
    out.queue_parts(loopback(rx.port), hdr.data(), hdr.size(), payload.data(), payload.size());
    std::vector<uint8_t> d = hdr;
    d.insert(d.end(), payload.begin(), payload.end());
    sent.push_back(d);
  }
  const std::vector<uint8_t> whole = pattern(64 + 1408, 9);
  out.queue(loopback(rx.port), whole.data(), whole.size());
  sent.push_back(whole);
  const std::vector<uint8_t> hdr = pattern(64, 10);
  out.queue_parts(loopback(rx.port), hdr.data(), hdr.size(), late.data(), late.size());
  late[0] ^= 0xFF;  // changed before flush(): what goes out is what the tail holds then
  std::vector<uint8_t> d = hdr;
  d.insert(d.end(), late.begin(), late.end());
  sent.push_back(d);
  // No tail: a header-only datagram queued as parts.
  out.queue_parts(loopback(rx.port), hdr.data(), hdr.size(), nullptr, 0);
  sent.push_back(hdr);
  out.flush();
  EXPECT_EQ(out.stats().datagrams_sent, sent.size());
  EXPECT_EQ(out.stats().send_errors, 0u);
  if (out.gso()) {
    EXPECT_EQ(out.stats().gso_buffers, 1u);   // the first four
    EXPECT_EQ(out.stats().gso_datagrams, 4u);
  }
  EXPECT_EQ(receive(&in, sent.size()), sent);
}

// Without GSO every two-part datagram is its own message.
TEST(UdpBatchLoopback, TwoPartDatagramsWithoutGso) {
  Sock rx, tx;
  UdpBatch in(rx.fd, false, true, true), out(tx.fd, false, false, true);
  EXPECT_FALSE(out.gso());
  const std::vector<uint8_t> payload = pattern(300, 11), hdr = pattern(64, 12);
  std::vector<std::vector<uint8_t>> sent;
  for (int i = 0; i < 3; ++i) {
    out.queue_parts(loopback(rx.port), hdr.data(), hdr.size(), payload.data(), payload.size());
    std::vector<uint8_t> d = hdr;
    d.insert(d.end(), payload.begin(), payload.end());
    sent.push_back(d);
  }
  out.flush();
  EXPECT_EQ(out.stats().gso_buffers, 0u);
  EXPECT_EQ(receive(&in, sent.size()), sent);
}

// A datagram larger than the receive buffer (9216 bytes without GRO) is counted, not lost
// silently, and what follows still arrives.
TEST(UdpBatchLoopback, OversizedDatagramIsCounted) {
  Sock rx, tx;
  UdpBatch io(rx.fd, false, true, false);
  const PeerAddr to = loopback(rx.port);
  const std::vector<uint8_t> big = pattern(10000, 5), small = pattern(100, 6);
  ASSERT_EQ(::sendto(tx.fd, big.data(), big.size(), 0, reinterpret_cast<const sockaddr*>(&to.ss), to.len),
            static_cast<ssize_t>(big.size()));
  ASSERT_EQ(::sendto(tx.fd, small.data(), small.size(), 0, reinterpret_cast<const sockaddr*>(&to.ss), to.len),
            static_cast<ssize_t>(small.size()));
  const auto got = receive(&io, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], small);
  EXPECT_EQ(io.stats().truncated, 1u);
}

namespace sw = thc::switch_offload;

struct Server {
  std::unique_ptr<sw::UdpServer> s;
  explicit Server(bool gro) {
    sw::ServerOptions o;
    o.seed = 1;
    o.gro = gro;
    o.keys = std::make_shared<sw::auth::KeyRing>(std::vector<sw::auth::Key>{sw::auth::generate_key(1)});
    s = std::make_unique<sw::UdpServer>(o);
    s->start();
  }
  uint64_t get(const char* name) const { return sw::stats_get(s->stats(), name); }
  // Wait (two seconds at most) until counter `name` reaches want.
  uint64_t wait_for(const char* name, uint64_t want) const {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (get(name) < want && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return get(name);
  }
};

// Garbage in a coalesced buffer (segments shorter than a header, a short tail) reaches the
// engine as separate datagrams, each dropped and counted.
TEST(UdpServerGro, GarbageSegmentsAreDroppedAndCounted) {
  Server srv(true);
  if (!srv.s->gro()) GTEST_SKIP() << "the kernel refuses UDP_GRO";
  Sock tx;
  const std::vector<uint8_t> bytes = pattern(3 * 40 + 7, 8);
  if (!send_gso(tx.fd, loopback(srv.s->port()), bytes, 40)) GTEST_SKIP() << "the kernel refuses UDP_SEGMENT";
  EXPECT_EQ(srv.wait_for("drop_truncated", 4), 4u);
  srv.s->stop();
  const thc::UdpBatchStats io = srv.s->io_stats();
  EXPECT_EQ(io.gro_buffers, 1u);
  EXPECT_EQ(io.gro_datagrams, 4u);
}

// Without GRO an oversized datagram is truncated by the receive buffer: a bad_length drop.
TEST(UdpServerGro, OversizedDatagramIsADrop) {
  Server srv(false);
  Sock tx;
  const PeerAddr to = loopback(srv.s->port());
  const std::vector<uint8_t> big = pattern(12000, 9);
  ASSERT_EQ(::sendto(tx.fd, big.data(), big.size(), 0, reinterpret_cast<const sockaddr*>(&to.ss), to.len),
            static_cast<ssize_t>(big.size()));
  EXPECT_EQ(srv.wait_for("drop_bad_length", 1), 1u);
  EXPECT_EQ(srv.get("drops_total"), 1u);
}

}  // namespace
