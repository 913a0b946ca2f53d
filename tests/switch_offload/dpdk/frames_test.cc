// The DPDK server's framing (switch_offload/servers/dpdk/frames.h), without DPDK running: ARP
// request -> reply bytes, IPv4/UDP parsing, every malformed case dropped with its reason, never a
// read outside the frame, and frames built by build_udp_frame accepted with the right checksums.
// Checksums are checked against a naive RFC 1071 implementation here, a published header, and (in
// a DPDK build) rte_ipv4_cksum / rte_ipv4_udptcp_cksum.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "switch_offload/servers/dpdk/frames.h"

#ifdef THC_TEST_WITH_DPDK
#include <rte_ip.h>
#include <rte_udp.h>
#endif

namespace {

using namespace thc::switch_offload::frames;

const Mac kOurMac = {0x02, 0x00, 0x5e, 0x10, 0x00, 0x01};
const Mac kPeerMac = {0x02, 0x00, 0x5e, 0x10, 0x00, 0x02};
constexpr uint32_t kOurIp = 0x0A4D0001;   // 10.77.0.1
constexpr uint32_t kPeerIp = 0x0A4D0002;  // 10.77.0.2
constexpr uint16_t kOurPort = 4791;
constexpr uint16_t kPeerPort = 40000;

Local us() {
  Local l;
  l.mac = kOurMac;
  l.ip = kOurIp;
  l.port = kOurPort;
  return l;
}

void put16(std::vector<uint8_t>& f, size_t at, uint16_t v) {
  f[at] = static_cast<uint8_t>(v >> 8);
  f[at + 1] = static_cast<uint8_t>(v);
}
void put32(std::vector<uint8_t>& f, size_t at, uint32_t v) {
  put16(f, at, static_cast<uint16_t>(v >> 16));
  put16(f, at + 2, static_cast<uint16_t>(v));
}
uint16_t get16(const std::vector<uint8_t>& f, size_t at) { return static_cast<uint16_t>(f[at] << 8 | f[at + 1]); }

// Textbook RFC 1071: big-endian 16-bit words, end-around carry, complement.
uint16_t naive_sum(const std::vector<uint8_t>& bytes) {
  uint32_t s = 0;
  for (size_t i = 0; i < bytes.size(); i += 2) {
    s += static_cast<uint32_t>(bytes[i]) << 8 | (i + 1 < bytes.size() ? bytes[i + 1] : 0);
    s = (s & 0xFFFF) + (s >> 16);
  }
  return static_cast<uint16_t>(s);
}
void fix_ip_checksum(std::vector<uint8_t>& f) {
  const size_t ihl = (f[14] & 0x0F) * 4u;
  put16(f, 24, 0);
  std::vector<uint8_t> h(f.begin() + 14, f.begin() + 14 + std::min<size_t>(ihl, f.size() - 14));
  put16(f, 24, static_cast<uint16_t>(~naive_sum(h)));
}
uint16_t naive_udp_checksum(const std::vector<uint8_t>& f) {
  const size_t udp_len = get16(f, 38);
  std::vector<uint8_t> b(f.begin() + 26, f.begin() + 34);  // src, dst ip
  b.push_back(0);
  b.push_back(17);
  b.push_back(static_cast<uint8_t>(udp_len >> 8));
  b.push_back(static_cast<uint8_t>(udp_len));
  b.insert(b.end(), f.begin() + 34, f.begin() + 34 + udp_len);
  b[12 + 6] = b[12 + 7] = 0;  // the checksum field itself
  const uint16_t c = static_cast<uint16_t>(~naive_sum(b));
  return c == 0 ? 0xFFFF : c;
}
void fix_udp_checksum(std::vector<uint8_t>& f) { put16(f, 40, naive_udp_checksum(f)); }

std::vector<uint8_t> payload_bytes(size_t n) {
  std::vector<uint8_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(i * 7 + 3);
  return p;
}

// A well-formed IPv4/UDP frame from the peer to us, written field by field (not by the code under test).
std::vector<uint8_t> good_udp(size_t plen = 100) {
  std::vector<uint8_t> f(42 + plen, 0);
  std::memcpy(f.data(), kOurMac.data(), 6);
  std::memcpy(f.data() + 6, kPeerMac.data(), 6);
  put16(f, 12, 0x0800);
  f[14] = 0x45;
  put16(f, 16, static_cast<uint16_t>(20 + 8 + plen));
  put16(f, 18, 0x1234);
  put16(f, 20, 0x4000);  // DF
  f[22] = 64;
  f[23] = 17;
  put32(f, 26, kPeerIp);
  put32(f, 30, kOurIp);
  put16(f, 34, kPeerPort);
  put16(f, 36, kOurPort);
  put16(f, 38, static_cast<uint16_t>(8 + plen));
  const auto p = payload_bytes(plen);
  std::copy(p.begin(), p.end(), f.begin() + 42);
  fix_ip_checksum(f);
  fix_udp_checksum(f);
  return f;
}

std::vector<uint8_t> arp(uint16_t op, uint32_t target_ip, const Mac& eth_dst = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff}) {
  std::vector<uint8_t> f(42, 0);
  std::memcpy(f.data(), eth_dst.data(), 6);
  std::memcpy(f.data() + 6, kPeerMac.data(), 6);
  put16(f, 12, 0x0806);
  put16(f, 14, 1);
  put16(f, 16, 0x0800);
  f[18] = 6;
  f[19] = 4;
  put16(f, 20, op);
  std::memcpy(f.data() + 22, kPeerMac.data(), 6);
  put32(f, 28, kPeerIp);
  put32(f, 38, target_ip);
  return f;
}

Classified run(const std::vector<uint8_t>& f, const Local& l = us()) { return classify(f.data(), f.size(), l); }

FrameDrop reason(const std::vector<uint8_t>& f, const Local& l = us()) {
  const Classified c = run(f, l);
  EXPECT_EQ(c.kind, FrameKind::kDrop);
  return c.drop;
}

TEST(DpdkFrames, ArpRequestGetsReplyBytes) {
  const auto req = arp(1, kOurIp);
  const Classified c = run(req);
  ASSERT_EQ(c.kind, FrameKind::kArpRequest);
  EXPECT_EQ(c.peer_mac, kPeerMac);
  EXPECT_EQ(c.peer_ip, kPeerIp);
  uint8_t out[128];
  std::memset(out, 0xAB, sizeof out);
  ASSERT_EQ(build_arp_reply(us(), c.peer_mac, c.peer_ip, out, sizeof out), 60u);
  const uint8_t want[60] = {
      0x02, 0x00, 0x5e, 0x10, 0x00, 0x02,  // to the requester
      0x02, 0x00, 0x5e, 0x10, 0x00, 0x01,  // from us
      0x08, 0x06,                          // ARP
      0x00, 0x01, 0x08, 0x00, 6, 4,        // Ethernet / IPv4
      0x00, 0x02,                          // reply
      0x02, 0x00, 0x5e, 0x10, 0x00, 0x01,  // sender hardware address: our MAC
      10, 77, 0, 1,                        // sender IP: ours
      0x02, 0x00, 0x5e, 0x10, 0x00, 0x02,  // target: the requester
      10, 77, 0, 2,
      // zero padding to the 60-byte minimum
  };
  EXPECT_EQ(std::vector<uint8_t>(out, out + 60), std::vector<uint8_t>(want, want + 60));
  EXPECT_EQ(out[60], 0xAB) << "nothing written past the frame";
  EXPECT_EQ(build_arp_reply(us(), c.peer_mac, c.peer_ip, out, 59), 0u) << "too small a buffer";

  // Unicast to our MAC is a request too (ARP cache refresh).
  EXPECT_EQ(run(arp(1, kOurIp, kOurMac)).kind, FrameKind::kArpRequest);
}

TEST(DpdkFrames, ClientResolvesItsAggregator) {
  // The client (peer) asks for our MAC; we answer; the client reads the answer.
  Local client;
  client.mac = kPeerMac;
  client.ip = kPeerIp;
  client.port = 40000;
  uint8_t req[64];
  ASSERT_EQ(build_arp_request(client, kOurIp, req, sizeof req), 60u);
  const Classified c = classify(req, 60, us());
  ASSERT_EQ(c.kind, FrameKind::kArpRequest);
  EXPECT_EQ(c.peer_mac, kPeerMac);
  EXPECT_EQ(c.peer_ip, kPeerIp);
  uint8_t rep[64];
  ASSERT_EQ(build_arp_reply(us(), c.peer_mac, c.peer_ip, rep, sizeof rep), 60u);
  Mac got{};
  ASSERT_TRUE(arp_reply_from(rep, 60, client, kOurIp, &got));
  EXPECT_EQ(got, kOurMac);
  EXPECT_FALSE(arp_reply_from(rep, 60, client, kOurIp + 1, &got)) << "a reply about another IP";
  EXPECT_FALSE(arp_reply_from(req, 60, client, kOurIp, &got)) << "a request is not a reply";
  EXPECT_FALSE(arp_reply_from(rep, 41, client, kOurIp, &got)) << "truncated";
  Local other = client;
  other.ip = kPeerIp + 1;
  EXPECT_FALSE(arp_reply_from(rep, 60, other, kOurIp, &got)) << "a reply to someone else";
}

TEST(DpdkFrames, ArpOtherwiseIgnoredOrBad) {
  EXPECT_EQ(reason(arp(1, kOurIp + 1)), FrameDrop::kArpIgnored) << "request for another IP";
  EXPECT_EQ(reason(arp(2, kOurIp)), FrameDrop::kArpIgnored) << "a reply";
  auto probe = arp(1, kOurIp);
  put32(probe, 28, 0);
  EXPECT_EQ(reason(probe), FrameDrop::kArpIgnored) << "probe (sender IP 0)";
  auto self = arp(1, kOurIp);
  put32(self, 28, kOurIp);
  EXPECT_EQ(reason(self), FrameDrop::kArpIgnored) << "gratuitous";
  auto bad = arp(1, kOurIp);
  put16(bad, 14, 6);
  EXPECT_EQ(reason(bad), FrameDrop::kBadArp) << "hardware type";
  bad = arp(1, kOurIp);
  bad[19] = 16;
  EXPECT_EQ(reason(bad), FrameDrop::kBadArp) << "protocol length";
  auto other = arp(1, kOurIp, {0x02, 0, 0, 0, 0, 0x99});
  EXPECT_EQ(reason(other), FrameDrop::kWrongDstMac);
  auto mc = arp(1, kOurIp);
  mc[22] |= 1;  // multicast sender hardware address
  EXPECT_EQ(reason(mc), FrameDrop::kBadSrc);
  auto shortf = arp(1, kOurIp);
  shortf.resize(41);
  EXPECT_EQ(reason(shortf), FrameDrop::kShort);
}

TEST(DpdkFrames, WellFormedUdpParses) {
  const auto f = good_udp(1080);
  const Classified c = run(f);
  ASSERT_EQ(c.kind, FrameKind::kUdp);
  EXPECT_EQ(c.peer_mac, kPeerMac);
  EXPECT_EQ(c.peer_ip, kPeerIp);
  EXPECT_EQ(c.peer_port, kPeerPort);
  EXPECT_EQ(c.payload, f.data() + 42);
  EXPECT_EQ(c.payload_len, 1080u);
  const Classified a = accepted_udp(f.data(), f.size());
  EXPECT_EQ(a.kind, FrameKind::kUdp);
  EXPECT_EQ(a.peer_mac, c.peer_mac);
  EXPECT_EQ(a.peer_ip, c.peer_ip);
  EXPECT_EQ(a.peer_port, c.peer_port);
  EXPECT_EQ(a.payload, c.payload);
  EXPECT_EQ(a.payload_len, c.payload_len);

  // Ethernet padding after the IP packet (a short datagram in a 60-byte frame) is not payload.
  auto small = good_udp(2);
  small.resize(60, 0);
  const Classified s = run(small);
  ASSERT_EQ(s.kind, FrameKind::kUdp);
  EXPECT_EQ(s.payload_len, 2u);

  // UDP checksum 0 means "none" in IPv4.
  auto none = good_udp(64);
  put16(none, 40, 0);
  EXPECT_EQ(run(none).kind, FrameKind::kUdp);
  // Empty payload.
  EXPECT_EQ(run(good_udp(0)).payload_len, 0u);
}

struct Mutation {
  const char* name;
  FrameDrop want;
  void (*apply)(std::vector<uint8_t>&);
};

TEST(DpdkFrames, EveryMalformedCaseDroppedWithItsReason) {
  const Mutation cases[] = {
      {"empty", FrameDrop::kShort, [](std::vector<uint8_t>& f) { f.clear(); }},
      {"runt ethernet", FrameDrop::kShort, [](std::vector<uint8_t>& f) { f.resize(13); }},
      {"truncated ip header", FrameDrop::kShort, [](std::vector<uint8_t>& f) { f.resize(14 + 19); }},
      {"vlan", FrameDrop::kVlan, [](std::vector<uint8_t>& f) { put16(f, 12, 0x8100); }},
      {"qinq", FrameDrop::kVlan, [](std::vector<uint8_t>& f) { put16(f, 12, 0x88A8); }},
      {"ipv6 ethertype", FrameDrop::kNotIpv4, [](std::vector<uint8_t>& f) { put16(f, 12, 0x86DD); }},
      {"lldp", FrameDrop::kNotIpv4, [](std::vector<uint8_t>& f) { put16(f, 12, 0x88CC); }},
      {"other dst mac", FrameDrop::kWrongDstMac, [](std::vector<uint8_t>& f) { f[5] ^= 0x40; }},
      {"broadcast dst mac", FrameDrop::kWrongDstMac, [](std::vector<uint8_t>& f) { std::memset(f.data(), 0xFF, 6); }},
      {"multicast src mac", FrameDrop::kBadSrc, [](std::vector<uint8_t>& f) { f[6] |= 1; }},
      {"version 6", FrameDrop::kBadIpVersion, [](std::vector<uint8_t>& f) { f[14] = 0x65; fix_ip_checksum(f); }},
      {"ihl 4", FrameDrop::kBadIhl, [](std::vector<uint8_t>& f) { f[14] = 0x44; fix_ip_checksum(f); }},
      {"ihl 0", FrameDrop::kBadIhl, [](std::vector<uint8_t>& f) { f[14] = 0x40; }},
      {"ip options", FrameDrop::kIpOptions, [](std::vector<uint8_t>& f) { f[14] = 0x46; fix_ip_checksum(f); }},
      {"total length beyond frame", FrameDrop::kBadTotalLength,
       [](std::vector<uint8_t>& f) { put16(f, 16, static_cast<uint16_t>(f.size() - 14 + 1)); fix_ip_checksum(f); }},
      {"total length 65535", FrameDrop::kBadTotalLength, [](std::vector<uint8_t>& f) { put16(f, 16, 0xFFFF); fix_ip_checksum(f); }},
      {"total length < header", FrameDrop::kBadTotalLength, [](std::vector<uint8_t>& f) { put16(f, 16, 19); fix_ip_checksum(f); }},
      {"frame cut inside payload", FrameDrop::kBadTotalLength, [](std::vector<uint8_t>& f) { f.resize(f.size() - 1); }},
      {"bad ip checksum", FrameDrop::kBadIpChecksum, [](std::vector<uint8_t>& f) { f[24] ^= 0x01; }},
      {"ip header bit flip", FrameDrop::kBadIpChecksum, [](std::vector<uint8_t>& f) { f[22] ^= 0x10; }},
      {"more fragments", FrameDrop::kFragment, [](std::vector<uint8_t>& f) { put16(f, 20, 0x2000); fix_ip_checksum(f); }},
      {"fragment offset", FrameDrop::kFragment, [](std::vector<uint8_t>& f) { put16(f, 20, 0x0010); fix_ip_checksum(f); }},
      {"wrong dst ip", FrameDrop::kWrongDstIp, [](std::vector<uint8_t>& f) { put32(f, 30, kOurIp + 1); fix_ip_checksum(f); }},
      {"broadcast dst ip", FrameDrop::kWrongDstIp, [](std::vector<uint8_t>& f) { put32(f, 30, 0xFFFFFFFF); fix_ip_checksum(f); }},
      {"src ip 0", FrameDrop::kBadSrc, [](std::vector<uint8_t>& f) { put32(f, 26, 0); fix_ip_checksum(f); }},
      {"src ip multicast", FrameDrop::kBadSrc, [](std::vector<uint8_t>& f) { put32(f, 26, 0xE0000001); fix_ip_checksum(f); }},
      {"src ip loopback", FrameDrop::kBadSrc, [](std::vector<uint8_t>& f) { put32(f, 26, 0x7F000001); fix_ip_checksum(f); }},
      {"tcp", FrameDrop::kNotUdp, [](std::vector<uint8_t>& f) { f[23] = 6; fix_ip_checksum(f); }},
      {"icmp", FrameDrop::kNotUdp, [](std::vector<uint8_t>& f) { f[23] = 1; fix_ip_checksum(f); }},
      {"ip payload shorter than udp header", FrameDrop::kBadUdpLength,
       [](std::vector<uint8_t>& f) { put16(f, 16, 27); fix_ip_checksum(f); }},
      {"udp length too long", FrameDrop::kBadUdpLength, [](std::vector<uint8_t>& f) { put16(f, 38, static_cast<uint16_t>(get16(f, 38) + 1)); }},
      {"udp length too short", FrameDrop::kBadUdpLength, [](std::vector<uint8_t>& f) { put16(f, 38, static_cast<uint16_t>(get16(f, 38) - 1)); }},
      {"udp length < 8", FrameDrop::kBadUdpLength, [](std::vector<uint8_t>& f) { put16(f, 38, 7); }},
      {"wrong dst port", FrameDrop::kWrongDstPort, [](std::vector<uint8_t>& f) { put16(f, 36, kOurPort + 1); fix_udp_checksum(f); }},
      {"src port 0", FrameDrop::kBadSrc, [](std::vector<uint8_t>& f) { put16(f, 34, 0); fix_udp_checksum(f); }},
      {"bad udp checksum", FrameDrop::kBadUdpChecksum, [](std::vector<uint8_t>& f) { f[40] ^= 0x80; }},
      {"payload bit flip", FrameDrop::kBadUdpChecksum, [](std::vector<uint8_t>& f) { f[100] ^= 0x04; }},
  };
  for (const Mutation& m : cases) {
    auto f = good_udp(100);
    m.apply(f);
    const Classified c = run(f);
    EXPECT_EQ(c.kind, FrameKind::kDrop) << m.name;
    EXPECT_EQ(frame_drop_name(c.drop), std::string(frame_drop_name(m.want))) << m.name;
  }
}

TEST(DpdkFrames, UdpChecksumVerificationCanBeOff) {
  auto f = good_udp(100);
  f[40] ^= 0x80;
  Local l = us();
  l.verify_udp_checksum = false;
  EXPECT_EQ(run(f, l).kind, FrameKind::kUdp);
  EXPECT_EQ(reason(f), FrameDrop::kBadUdpChecksum);
}

TEST(DpdkFrames, EveryPrefixAndRandomCorruptionIsDroppedSafely) {
  // Every strict prefix of a good frame lacks bytes the IP total length promises.
  const auto f = good_udp(300);
  for (size_t n = 0; n < f.size(); ++n) {
    std::vector<uint8_t> p(f.begin(), f.begin() + n);  // exact-size copies: ASan sees any over-read
    EXPECT_EQ(classify(p.data(), p.size(), us()).kind, FrameKind::kDrop) << "prefix " << n;
  }
  EXPECT_EQ(classify(nullptr, 0, us()).kind, FrameKind::kDrop);
  // Random corruption of the headers: never a crash, and whatever is accepted really is valid.
  std::mt19937_64 rng(12345);
  int accepted = 0;
  for (int it = 0; it < 20000; ++it) {
    auto g = good_udp(rng() % 64);
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < flips; ++k) g[rng() % 42] ^= static_cast<uint8_t>(1u << (rng() % 8));
    if (rng() % 4 == 0) g.resize(rng() % (g.size() + 1));
    const Classified c = classify(g.data(), g.size(), us());
    if (c.kind != FrameKind::kUdp) continue;
    ++accepted;
    EXPECT_EQ(get16(g, 12), 0x0800);
    EXPECT_EQ(g[14], 0x45);
    EXPECT_GE(c.payload, g.data() + 42);
    EXPECT_LE(c.payload + c.payload_len, g.data() + g.size());
  }
  EXPECT_LT(accepted, 20000 / 10) << "flipping header bits should almost always break something";
}

TEST(DpdkFrames, KnownIpv4HeaderChecksum) {
  // The classic example header (checksum 0xb861).
  const uint8_t h[20] = {0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11,
                         0xb8, 0x61, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7};
  EXPECT_EQ(ipv4_header_checksum(h, sizeof h), 0xb861);
}

TEST(DpdkFrames, BuiltFramesParseWithRightChecksums) {
  // The peer builds a frame to us; we classify it. Lengths cover odd sizes, the padding case and
  // the largest protocol packet.
  Local peer;
  peer.mac = kPeerMac;
  peer.ip = kPeerIp;
  peer.port = kPeerPort;
  for (size_t plen : {size_t{0}, size_t{1}, size_t{3}, size_t{18}, size_t{56}, size_t{57}, size_t{311}, size_t{1080}}) {
    const auto p = payload_bytes(plen);
    std::vector<uint8_t> out(2048, 0xEE);
    const size_t n = build_udp_frame(peer, kOurMac, kOurIp, kOurPort, p.data(), p.size(), out.data(), out.size());
    ASSERT_EQ(n, std::max<size_t>(42 + plen, 60)) << plen;
    EXPECT_EQ(out[n], 0xEE) << "nothing written past the frame";
    out.resize(n);
    const Classified c = run(out);
    ASSERT_EQ(c.kind, FrameKind::kUdp) << plen << ": " << frame_drop_name(c.drop);
    EXPECT_EQ(c.peer_mac, kPeerMac);
    EXPECT_EQ(c.peer_ip, kPeerIp);
    EXPECT_EQ(c.peer_port, kPeerPort);
    ASSERT_EQ(c.payload_len, plen);
    EXPECT_EQ(std::vector<uint8_t>(c.payload, c.payload + plen), p);
    // Header fields and checksums, against the naive implementation.
    EXPECT_EQ(out[14], 0x45);
    EXPECT_EQ(get16(out, 16), 28 + plen);
    EXPECT_EQ(get16(out, 20), 0x4000) << "DF, no fragment";
    EXPECT_EQ(out[22], 64);
    std::vector<uint8_t> ip(out.begin() + 14, out.begin() + 34);
    EXPECT_EQ(naive_sum(ip), 0xFFFF) << "IPv4 header checksum";
    EXPECT_EQ(get16(out, 40), naive_udp_checksum(out)) << plen;
    for (size_t i = 42 + plen; i < n; ++i) EXPECT_EQ(out[i], 0) << "padding";
#ifdef THC_TEST_WITH_DPDK
    const auto* iph = reinterpret_cast<const rte_ipv4_hdr*>(out.data() + 14);
    rte_ipv4_hdr copy;
    std::memcpy(&copy, iph, sizeof copy);
    copy.hdr_checksum = 0;
    EXPECT_EQ(rte_ipv4_cksum(&copy), iph->hdr_checksum) << "rte_ipv4_cksum agrees";
    std::vector<uint8_t> u(out.begin() + 34, out.begin() + 42 + plen);
    u[6] = u[7] = 0;
    uint16_t want;
    std::memcpy(&want, out.data() + 40, 2);
    EXPECT_EQ(rte_ipv4_udptcp_cksum(&copy, u.data()), want) << "rte_ipv4_udptcp_cksum agrees, " << plen;
#endif
  }
  // Without the UDP checksum: 0 on the wire, still accepted.
  std::vector<uint8_t> out(128);
  const auto p = payload_bytes(30);
  const size_t n = build_udp_frame(peer, kOurMac, kOurIp, kOurPort, p.data(), p.size(), out.data(), out.size(), false);
  out.resize(n);
  EXPECT_EQ(get16(out, 40), 0);
  EXPECT_EQ(run(out).kind, FrameKind::kUdp);
  // Too small an output buffer, and a payload no IPv4 packet can carry.
  std::vector<uint8_t> small(60);
  EXPECT_EQ(build_udp_frame(peer, kOurMac, kOurIp, kOurPort, p.data(), p.size(), small.data(), small.size()), 0u);
  std::vector<uint8_t> huge(70000), buf(70100);
  EXPECT_EQ(build_udp_frame(peer, kOurMac, kOurIp, kOurPort, huge.data(), huge.size(), buf.data(), buf.size()), 0u);
}

// A frame built from a head and a tail (the engine's results: a recipient's header and the shared
// payload) is the frame of the joined payload, byte for byte, with the tail's checksum sum given
// (once per result, as the DPDK server does) or not, for even and odd heads, empty and odd tails,
// with and without the UDP checksum; and a tail sum from other bytes would show.
TEST(DpdkFrames, FramesFromTwoPartsAreTheJoinedFrame) {
  Local peer;
  peer.mac = kPeerMac;
  peer.ip = kPeerIp;
  peer.port = kPeerPort;
  for (size_t hlen : {size_t{0}, size_t{1}, size_t{2}, size_t{7}, size_t{64}})
    for (size_t tlen : {size_t{0}, size_t{1}, size_t{5}, size_t{56}, size_t{1408}})
      for (bool csum : {true, false}) {
        const auto h = payload_bytes(hlen);
        auto t = payload_bytes(tlen + 3);
        t.erase(t.begin(), t.begin() + 3);  // other bytes than the head's
        std::vector<uint8_t> joined = h;
        joined.insert(joined.end(), t.begin(), t.end());
        std::vector<uint8_t> want(2048, 0xEE), got(2048, 0xEE), got_sum(2048, 0xEE);
        const size_t n = build_udp_frame(peer, kOurMac, kOurIp, kOurPort, joined.data(), joined.size(), want.data(),
                                         want.size(), csum);
        ASSERT_GT(n, 0u);
        EXPECT_EQ(build_udp_frame_parts(peer, kOurMac, kOurIp, kOurPort, h.data(), hlen, t.data(), tlen, nullptr,
                                        got.data(), got.size(), csum),
                  n);
        const uint64_t ts = payload_sum(t.data(), tlen);
        EXPECT_EQ(build_udp_frame_parts(peer, kOurMac, kOurIp, kOurPort, h.data(), hlen, t.data(), tlen, &ts,
                                        got_sum.data(), got_sum.size(), csum),
                  n);
        EXPECT_EQ(got, want) << "head " << hlen << " tail " << tlen << (csum ? "" : " no checksum");
        EXPECT_EQ(got_sum, want) << "with the tail's sum: head " << hlen << " tail " << tlen;
        if (csum && tlen > 0 && hlen % 2 == 0) {
          const uint64_t wrong = ts + 1;
          std::vector<uint8_t> bad(2048, 0xEE);
          build_udp_frame_parts(peer, kOurMac, kOurIp, kOurPort, h.data(), hlen, t.data(), tlen, &wrong, bad.data(),
                                bad.size(), csum);
          EXPECT_NE(bad, want) << "the tail sum is used";
        }
      }
}

TEST(DpdkFrames, DropReasonsHaveDistinctNames) {
  std::vector<std::string> names;
  for (int i = 0; i < static_cast<int>(FrameDrop::kCount); ++i) {
    const std::string n = frame_drop_name(static_cast<FrameDrop>(i));
    EXPECT_NE(n, "?");
    for (const auto& o : names) EXPECT_NE(n, o);
    names.push_back(n);
  }
}

}  // namespace
