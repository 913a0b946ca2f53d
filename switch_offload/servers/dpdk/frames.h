// Ethernet / ARP / IPv4 / UDP framing for the DPDK aggregator, as pure functions over byte
// buffers: no mbufs, no EAL, no DPDK headers. The server's RX lcore classifies every received
// frame with classify(); the workers build their replies with build_udp_frame(). Being plain
// functions, they are unit-tested (tests/switch_offload/dpdk/frames_test.cc) without DPDK running.
//
// What is accepted (everything else is dropped with a FrameDrop reason, never read out of bounds):
//   * ARP request (Ethernet/IPv4, opcode 1) for our IP, to broadcast or our MAC, from a unicast
//     sender with a non-zero sender IP (probes with sender IP 0 are ignored);
//   * untagged IPv4 to our MAC: version 4, IHL exactly 5 (no options), total length within the
//     frame (trailing Ethernet padding is allowed), valid header checksum, not a fragment,
//     destination our IP, a unicast source, protocol UDP; UDP length = IP payload length,
//     destination our port, source port non-zero, and the UDP checksum (unless 0 = none, which
//     IPv4 allows) correct when verification is on.
// IP addresses and ports are in host byte order in every struct and argument here.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace thc::switch_offload::frames {

using Mac = std::array<uint8_t, 6>;

constexpr size_t kEthHeader = 14;
constexpr size_t kArpBody = 28;
constexpr size_t kIpv4Header = 20;  // IHL 5: the only header length accepted
constexpr size_t kUdpHeader = 8;
constexpr size_t kUdpPayloadOffset = kEthHeader + kIpv4Header + kUdpHeader;  // 42
constexpr size_t kMinFrame = 60;  // Ethernet minimum without FCS; shorter replies are zero-padded
constexpr size_t kArpReplyBytes = kMinFrame;
constexpr uint16_t kEtherIpv4 = 0x0800;
constexpr uint16_t kEtherArp = 0x0806;
constexpr uint16_t kEtherVlan = 0x8100;
constexpr uint16_t kEtherQinQ = 0x88A8;
constexpr uint8_t kIpProtoUdp = 17;
constexpr uint8_t kReplyTtl = 64;

// Who we are: the port's MAC, the aggregator's IPv4 address and UDP port.
struct Local {
  Mac mac{};
  uint32_t ip = 0;
  uint16_t port = 0;
  bool verify_udp_checksum = true;  // off: accept any UDP checksum (peers with unfilled offload checksums)
};

// Why a frame was dropped. Printed as frame_drop_<name> by the server.
enum class FrameDrop : int {
  kShort = 0,       // shorter than the headers its ethertype/protocol needs
  kVlan,            // 802.1Q / 802.1ad tagged (no VLAN support)
  kNotIpv4,         // another ethertype (IPv6, LLDP, ...)
  kBadArp,          // ARP that is not Ethernet/IPv4 (htype 1, ptype 0x0800, hlen 6, plen 4)
  kArpIgnored,      // well-formed ARP we do not answer: replies, requests for other IPs, probes
  kWrongDstMac,     // IPv4 to another MAC (promiscuous port), or ARP unicast to another MAC
  kBadSrc,          // multicast/broadcast source MAC, source IP 0/loopback/multicast/broadcast, port 0
  kBadIpVersion,    // ethertype IPv4 but version field != 4
  kBadIhl,          // IHL < 5
  kIpOptions,       // IHL > 5 (IP options are not supported)
  kBadTotalLength,  // total length < header length, or beyond the frame
  kBadIpChecksum,
  kFragment,        // MF set or fragment offset != 0
  kWrongDstIp,
  kNotUdp,          // another IP protocol (ICMP, TCP, ...)
  kBadUdpLength,    // UDP length != IP payload length (or < 8)
  kWrongDstPort,
  kBadUdpChecksum,
  kCount
};
const char* frame_drop_name(FrameDrop d);

enum class FrameKind { kDrop, kArpRequest, kUdp };

struct Classified {
  FrameKind kind = FrameKind::kDrop;
  FrameDrop drop = FrameDrop::kShort;  // when kind == kDrop
  Mac peer_mac{};                      // ARP sender hardware address / UDP frame source MAC
  uint32_t peer_ip = 0;                // ARP sender IP / IPv4 source
  uint16_t peer_port = 0;              // UDP source port
  const uint8_t* payload = nullptr;    // UDP payload (points into the frame)
  size_t payload_len = 0;
};

Classified classify(const uint8_t* frame, size_t len, const Local& local);

// The peer and payload of a frame classify() accepted as kUdp, read again at the fixed offsets
// that classify() enforced (IHL 5), without re-validating: for the worker lcore that receives the
// frame from the RX lcore. Must not be called on anything else.
Classified accepted_udp(const uint8_t* frame, size_t len);

// ARP reply from us to (to_mac, to_ip), padded to 60 bytes. Returns its length, 0 if cap is short.
size_t build_arp_reply(const Local& local, const Mac& to_mac, uint32_t to_ip, uint8_t* out, size_t cap);

// Broadcast ARP request from us for target_ip (a client resolving its aggregator), 60 bytes.
size_t build_arp_request(const Local& local, uint32_t target_ip, uint8_t* out, size_t cap);
// Whether frame is an ARP reply telling us (local.ip) the unicast MAC of `ip`; sets *mac.
bool arp_reply_from(const uint8_t* frame, size_t len, const Local& local, uint32_t ip, Mac* mac);

// Ethernet/IPv4/UDP frame from (local.mac, local.ip, local.port) to (dst_mac, dst_ip, dst_port):
// IPv4 with DF, TTL 64, id 0, header checksum; UDP checksum computed, or 0 (none) if
// udp_checksum is false. Returns the frame length (padded to 60), 0 if it does not fit in cap or
// the payload is larger than an IPv4 packet can carry.
size_t build_udp_frame(const Local& local, const Mac& dst_mac, uint32_t dst_ip, uint16_t dst_port, const uint8_t* payload,
                       size_t len, uint8_t* out, size_t cap, bool udp_checksum = true);

// build_udp_frame of the payload head + tail (the engine's results: each recipient's header, then
// the payload they share), written straight into out. tail_sum: nullptr, or payload_sum(tail,
// tlen) when the caller sends one tail many times (used if hlen is even, so that the tail keeps
// its 16-bit alignment in the checksum; else the frame is summed whole). Same bytes as
// build_udp_frame of the joined payload.
size_t build_udp_frame_parts(const Local& local, const Mac& dst_mac, uint32_t dst_ip, uint16_t dst_port,
                             const uint8_t* head, size_t hlen, const uint8_t* tail, size_t tlen,
                             const uint64_t* tail_sum, uint8_t* out, size_t cap, bool udp_checksum = true);
// The one's-complement partial sum of n bytes that build_udp_frame_parts takes as tail_sum.
uint64_t payload_sum(const uint8_t* p, size_t n);

// RFC 1071 checksums. The returned value is to be stored big-endian into the header field.
// ipv4_header_checksum: over `bytes` bytes of header with the checksum field taken as 0.
uint16_t ipv4_header_checksum(const uint8_t* hdr, size_t bytes);
// udp_checksum: pseudo header (src, dst, protocol 17, UDP length) + UDP header with checksum
// field taken as 0 + payload; 0 is returned as 0xFFFF (0 on the wire means "no checksum").
uint16_t udp_checksum(uint32_t src_ip, uint32_t dst_ip, const uint8_t* udp, size_t udp_len);

inline bool mac_is_multicast(const Mac& m) { return (m[0] & 1) != 0; }  // includes broadcast

}  // namespace thc::switch_offload::frames
