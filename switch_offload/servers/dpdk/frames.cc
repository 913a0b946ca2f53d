#include "switch_offload/servers/dpdk/frames.h"

#include <cstring>

namespace thc::switch_offload::frames {

namespace {

uint16_t be16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }
uint32_t be32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) << 24 | static_cast<uint32_t>(p[1]) << 16 | static_cast<uint32_t>(p[2]) << 8 | p[3];
}
void put16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
void put32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}
Mac mac_at(const uint8_t* p) {
  Mac m;
  std::memcpy(m.data(), p, 6);
  return m;
}

// One's-complement sum of memory words (RFC 1071 §2: byte order independent, so native loads
// are summed and the folded result is turned into the big-endian value at the end). Every range
// passed here starts at an even offset of the checksummed data.
uint64_t sum_mem(const uint8_t* p, size_t n, uint64_t s) {
  for (; n >= 4; p += 4, n -= 4) {
    uint32_t w;
    std::memcpy(&w, p, 4);
    s += w;
  }
  if (n >= 2) {
    uint16_t w;
    std::memcpy(&w, p, 2);
    s += w;
    p += 2;
    n -= 2;
  }
  if (n) {
    const uint8_t b[2] = {*p, 0};
    uint16_t w;
    std::memcpy(&w, b, 2);
    s += w;
  }
  return s;
}
// Folded sum as the value whose big-endian bytes are the memory bytes of the native sum.
uint16_t fold_be(uint64_t s) {
  while (s >> 16) s = (s & 0xFFFF) + (s >> 16);
  const auto v = static_cast<uint16_t>(s);
  uint8_t b[2];
  std::memcpy(b, &v, 2);
  return be16(b);
}

uint64_t pseudo_sum(uint32_t src_ip, uint32_t dst_ip, size_t udp_len) {
  uint8_t ph[12];
  put32(ph, src_ip);
  put32(ph + 4, dst_ip);
  ph[8] = 0;
  ph[9] = kIpProtoUdp;
  put16(ph + 10, static_cast<uint16_t>(udp_len));
  return sum_mem(ph, sizeof ph, 0);
}

bool ip_is_bad_source(uint32_t ip) {
  return ip == 0 || ip == 0xFFFFFFFFu || (ip >> 24) == 127 || (ip >> 28) == 0xE;  // 0, bcast, loopback, multicast
}

Classified dropped(FrameDrop d) {
  Classified c;
  c.kind = FrameKind::kDrop;
  c.drop = d;
  return c;
}

Classified classify_arp(const uint8_t* f, size_t len, const Local& local) {
  if (len < kEthHeader + kArpBody) return dropped(FrameDrop::kShort);
  const uint8_t* a = f + kEthHeader;
  if (be16(a) != 1 || be16(a + 2) != kEtherIpv4 || a[4] != 6 || a[5] != 4) return dropped(FrameDrop::kBadArp);
  const Mac dst = mac_at(f);
  static const Mac kBroadcast = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
  if (dst != kBroadcast && dst != local.mac) return dropped(FrameDrop::kWrongDstMac);
  const uint16_t op = be16(a + 6);
  const uint32_t tip = be32(a + 24);
  if (op != 1 || tip != local.ip) return dropped(FrameDrop::kArpIgnored);
  const Mac sha = mac_at(a + 8);
  const uint32_t sip = be32(a + 14);
  // A probe (sender IP 0, RFC 5227) would be answered to nobody; gratuitous requests for our own
  // address are not questions either.
  if (sip == 0 || sip == local.ip) return dropped(FrameDrop::kArpIgnored);
  if (mac_is_multicast(sha) || mac_is_multicast(mac_at(f + 6)) || ip_is_bad_source(sip)) return dropped(FrameDrop::kBadSrc);
  Classified c;
  c.kind = FrameKind::kArpRequest;
  c.peer_mac = sha;
  c.peer_ip = sip;
  return c;
}

}  // namespace

const char* frame_drop_name(FrameDrop d) {
  switch (d) {
    case FrameDrop::kShort: return "short";
    case FrameDrop::kVlan: return "vlan";
    case FrameDrop::kNotIpv4: return "not_ipv4";
    case FrameDrop::kBadArp: return "bad_arp";
    case FrameDrop::kArpIgnored: return "arp_ignored";
    case FrameDrop::kWrongDstMac: return "wrong_dst_mac";
    case FrameDrop::kBadSrc: return "bad_src";
    case FrameDrop::kBadIpVersion: return "bad_ip_version";
    case FrameDrop::kBadIhl: return "bad_ihl";
    case FrameDrop::kIpOptions: return "ip_options";
    case FrameDrop::kBadTotalLength: return "bad_total_length";
    case FrameDrop::kBadIpChecksum: return "bad_ip_checksum";
    case FrameDrop::kFragment: return "fragment";
    case FrameDrop::kWrongDstIp: return "wrong_dst_ip";
    case FrameDrop::kNotUdp: return "not_udp";
    case FrameDrop::kBadUdpLength: return "bad_udp_length";
    case FrameDrop::kWrongDstPort: return "wrong_dst_port";
    case FrameDrop::kBadUdpChecksum: return "bad_udp_checksum";
    case FrameDrop::kCount: break;
  }
  return "?";
}

uint16_t ipv4_header_checksum(const uint8_t* hdr, size_t bytes) {
  if (bytes < 12) return 0;
  // Bytes 10..11 are the checksum field itself, taken as 0.
  const uint64_t s = sum_mem(hdr + 12, bytes - 12, sum_mem(hdr, 10, 0));
  return static_cast<uint16_t>(~fold_be(s));
}

uint16_t udp_checksum(uint32_t src_ip, uint32_t dst_ip, const uint8_t* udp, size_t udp_len) {
  uint64_t s = pseudo_sum(src_ip, dst_ip, udp_len);
  s = sum_mem(udp, udp_len < 6 ? udp_len : 6, s);
  if (udp_len > 8) s = sum_mem(udp + 8, udp_len - 8, s);
  const auto c = static_cast<uint16_t>(~fold_be(s));
  return c == 0 ? 0xFFFF : c;
}

Classified classify(const uint8_t* f, size_t len, const Local& local) {
  if (f == nullptr || len < kEthHeader) return dropped(FrameDrop::kShort);
  const uint16_t type = be16(f + 12);
  if (type == kEtherVlan || type == kEtherQinQ) return dropped(FrameDrop::kVlan);
  if (type == kEtherArp) return classify_arp(f, len, local);
  if (type != kEtherIpv4) return dropped(FrameDrop::kNotIpv4);
  if (mac_at(f) != local.mac) return dropped(FrameDrop::kWrongDstMac);
  const Mac src_mac = mac_at(f + 6);
  if (mac_is_multicast(src_mac)) return dropped(FrameDrop::kBadSrc);
  if (len < kEthHeader + kIpv4Header) return dropped(FrameDrop::kShort);

  const uint8_t* ip = f + kEthHeader;
  if ((ip[0] >> 4) != 4) return dropped(FrameDrop::kBadIpVersion);
  const size_t ihl = ip[0] & 0x0F;
  if (ihl < 5) return dropped(FrameDrop::kBadIhl);
  if (ihl > 5) return dropped(FrameDrop::kIpOptions);
  const size_t total = be16(ip + 2);
  if (total < kIpv4Header || kEthHeader + total > len) return dropped(FrameDrop::kBadTotalLength);
  if (fold_be(sum_mem(ip, kIpv4Header, 0)) != 0xFFFF) return dropped(FrameDrop::kBadIpChecksum);
  if ((be16(ip + 6) & 0x3FFF) != 0) return dropped(FrameDrop::kFragment);  // MF or an offset
  const uint32_t src_ip = be32(ip + 12);
  const uint32_t dst_ip = be32(ip + 16);
  if (dst_ip != local.ip) return dropped(FrameDrop::kWrongDstIp);
  if (ip_is_bad_source(src_ip)) return dropped(FrameDrop::kBadSrc);
  if (ip[9] != kIpProtoUdp) return dropped(FrameDrop::kNotUdp);

  const size_t udp_len = total - kIpv4Header;
  if (udp_len < kUdpHeader) return dropped(FrameDrop::kBadUdpLength);
  const uint8_t* udp = ip + kIpv4Header;
  if (be16(udp + 4) != udp_len) return dropped(FrameDrop::kBadUdpLength);
  if (be16(udp + 2) != local.port) return dropped(FrameDrop::kWrongDstPort);
  const uint16_t src_port = be16(udp);
  if (src_port == 0) return dropped(FrameDrop::kBadSrc);
  if (local.verify_udp_checksum && be16(udp + 6) != 0 &&
      fold_be(sum_mem(udp, udp_len, pseudo_sum(src_ip, dst_ip, udp_len))) != 0xFFFF)
    return dropped(FrameDrop::kBadUdpChecksum);

  Classified c;
  c.kind = FrameKind::kUdp;
  c.peer_mac = src_mac;
  c.peer_ip = src_ip;
  c.peer_port = src_port;
  c.payload = udp + kUdpHeader;
  c.payload_len = udp_len - kUdpHeader;
  return c;
}

Classified accepted_udp(const uint8_t* f, size_t len) {
  Classified c;
  if (len < kUdpPayloadOffset) return c;  // cannot happen after classify(); stays a drop
  const uint8_t* ip = f + kEthHeader;
  const uint8_t* udp = ip + kIpv4Header;
  c.kind = FrameKind::kUdp;
  c.peer_mac = mac_at(f + 6);
  c.peer_ip = be32(ip + 12);
  c.peer_port = be16(udp);
  c.payload = udp + kUdpHeader;
  const size_t udp_len = be16(udp + 4);
  c.payload_len = udp_len >= kUdpHeader && kEthHeader + kIpv4Header + udp_len <= len ? udp_len - kUdpHeader : 0;
  return c;
}

size_t build_arp_reply(const Local& local, const Mac& to_mac, uint32_t to_ip, uint8_t* out, size_t cap) {
  if (cap < kArpReplyBytes) return 0;
  std::memset(out, 0, kArpReplyBytes);
  std::memcpy(out, to_mac.data(), 6);
  std::memcpy(out + 6, local.mac.data(), 6);
  put16(out + 12, kEtherArp);
  uint8_t* a = out + kEthHeader;
  put16(a, 1);  // Ethernet
  put16(a + 2, kEtherIpv4);
  a[4] = 6;
  a[5] = 4;
  put16(a + 6, 2);  // reply
  std::memcpy(a + 8, local.mac.data(), 6);
  put32(a + 14, local.ip);
  std::memcpy(a + 18, to_mac.data(), 6);
  put32(a + 24, to_ip);
  return kArpReplyBytes;
}

size_t build_arp_request(const Local& local, uint32_t target_ip, uint8_t* out, size_t cap) {
  if (cap < kArpReplyBytes) return 0;
  std::memset(out, 0, kArpReplyBytes);
  std::memset(out, 0xFF, 6);  // broadcast
  std::memcpy(out + 6, local.mac.data(), 6);
  put16(out + 12, kEtherArp);
  uint8_t* a = out + kEthHeader;
  put16(a, 1);
  put16(a + 2, kEtherIpv4);
  a[4] = 6;
  a[5] = 4;
  put16(a + 6, 1);  // request
  std::memcpy(a + 8, local.mac.data(), 6);
  put32(a + 14, local.ip);
  // target hardware address stays zero
  put32(a + 24, target_ip);
  return kArpReplyBytes;
}

bool arp_reply_from(const uint8_t* frame, size_t len, const Local& local, uint32_t ip, Mac* mac) {
  if (len < kEthHeader + kArpBody || be16(frame + 12) != kEtherArp) return false;
  const uint8_t* a = frame + kEthHeader;
  if (be16(a) != 1 || be16(a + 2) != kEtherIpv4 || a[4] != 6 || a[5] != 4 || be16(a + 6) != 2) return false;
  if (be32(a + 14) != ip || be32(a + 24) != local.ip) return false;
  Mac m;
  std::memcpy(m.data(), a + 8, 6);
  if (mac_is_multicast(m)) return false;
  *mac = m;
  return true;
}

namespace {

// Ethernet, IPv4 and UDP headers for a payload of len bytes (UDP checksum field 0); returns the
// UDP header.
uint8_t* put_udp_headers(const Local& local, const Mac& dst_mac, uint32_t dst_ip, uint16_t dst_port, size_t len,
                         uint8_t* out) {
  std::memcpy(out, dst_mac.data(), 6);
  std::memcpy(out + 6, local.mac.data(), 6);
  put16(out + 12, kEtherIpv4);
  uint8_t* ip = out + kEthHeader;
  ip[0] = 0x45;
  ip[1] = 0;
  put16(ip + 2, static_cast<uint16_t>(kIpv4Header + kUdpHeader + len));
  put16(ip + 4, 0);       // id: 0 is fine for atomic (DF, unfragmented) datagrams, RFC 6864
  put16(ip + 6, 0x4000);  // DF
  ip[8] = kReplyTtl;
  ip[9] = kIpProtoUdp;
  put32(ip + 12, local.ip);
  put32(ip + 16, dst_ip);
  put16(ip + 10, ipv4_header_checksum(ip, kIpv4Header));
  uint8_t* udp = ip + kIpv4Header;
  put16(udp, local.port);
  put16(udp + 2, dst_port);
  put16(udp + 4, static_cast<uint16_t>(kUdpHeader + len));
  put16(udp + 6, 0);
  return udp;
}

}  // namespace

size_t build_udp_frame(const Local& local, const Mac& dst_mac, uint32_t dst_ip, uint16_t dst_port, const uint8_t* payload,
                       size_t len, uint8_t* out, size_t cap, bool udp_checksum_on) {
  return build_udp_frame_parts(local, dst_mac, dst_ip, dst_port, payload, len, nullptr, 0, nullptr, out, cap,
                               udp_checksum_on);
}

uint64_t payload_sum(const uint8_t* p, size_t n) { return sum_mem(p, n, 0); }

size_t build_udp_frame_parts(const Local& local, const Mac& dst_mac, uint32_t dst_ip, uint16_t dst_port,
                             const uint8_t* head, size_t hlen, const uint8_t* tail, size_t tlen,
                             const uint64_t* tail_sum, uint8_t* out, size_t cap, bool udp_checksum_on) {
  const size_t len = hlen + tlen;
  if (len > 0xFFFF - kIpv4Header - kUdpHeader) return 0;
  const size_t frame = kUdpPayloadOffset + len;
  const size_t padded = frame < kMinFrame ? kMinFrame : frame;
  if (cap < padded) return 0;
  uint8_t* udp = put_udp_headers(local, dst_mac, dst_ip, dst_port, len, out);
  if (hlen) std::memcpy(udp + kUdpHeader, head, hlen);
  if (tlen) std::memcpy(udp + kUdpHeader + hlen, tail, tlen);
  if (udp_checksum_on) {
    uint16_t c;
    if (tail_sum != nullptr && hlen % 2 == 0) {
      uint64_t s = pseudo_sum(local.ip, dst_ip, kUdpHeader + len);
      s = sum_mem(udp, 6, s);
      s = sum_mem(udp + kUdpHeader, hlen, s) + *tail_sum;
      c = static_cast<uint16_t>(~fold_be(s));
      if (c == 0) c = 0xFFFF;
    } else {
      c = udp_checksum(local.ip, dst_ip, udp, kUdpHeader + len);
    }
    put16(udp + 6, c);
  }
  if (padded > frame) std::memset(out + frame, 0, padded - frame);
  return padded;
}

}  // namespace thc::switch_offload::frames
