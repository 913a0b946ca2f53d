// thc_dpdk_noise IFACE DST_MAC DST_IP DST_PORT SRC_IP: sends one raw Ethernet frame of every
// malformed kind the DPDK aggregator must drop (frames::FrameDrop reasons; all but fragments,
// which af_packet's kernel side reassembles first) out of IFACE through a packet socket, plus UDP datagrams that reach the engine but are too short to be a packet. Prints
// one "REASON COUNT" line per kind, where REASON is the aggregator's counter name
// (frame_drop_<reason>, or drop_truncated for the engine), for the live test to compare with the
// aggregator's final statistics line.
#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "switch_offload/servers/dpdk/frames.h"

namespace {

using namespace thc::switch_offload::frames;

void put16(std::vector<uint8_t>& f, size_t at, uint16_t v) {
  f[at] = static_cast<uint8_t>(v >> 8);
  f[at + 1] = static_cast<uint8_t>(v);
}
void put32(std::vector<uint8_t>& f, size_t at, uint32_t v) {
  put16(f, at, static_cast<uint16_t>(v >> 16));
  put16(f, at + 2, static_cast<uint16_t>(v));
}
void fix_ip(std::vector<uint8_t>& f) {
  put16(f, 24, 0);
  put16(f, 24, ipv4_header_checksum(f.data() + 14, (f[14] & 0x0F) * 4u));
}
void fix_udp(std::vector<uint8_t>& f) {
  put16(f, 40, 0);
  const size_t udp_len = static_cast<size_t>(f[38] << 8 | f[39]);
  const uint32_t src = static_cast<uint32_t>(f[26]) << 24 | f[27] << 16 | f[28] << 8 | f[29];
  const uint32_t dst = static_cast<uint32_t>(f[30]) << 24 | f[31] << 16 | f[32] << 8 | f[33];
  put16(f, 40, udp_checksum(src, dst, f.data() + 34, udp_len));
}

bool parse_mac(const char* s, Mac* m) {
  unsigned b[6];
  if (std::sscanf(s, "%x:%x:%x:%x:%x:%x", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5]) != 6) return false;
  for (int i = 0; i < 6; ++i) (*m)[i] = static_cast<uint8_t>(b[i]);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s IFACE DST_MAC DST_IP DST_PORT SRC_IP\n", argv[0]);
    return 2;
  }
  Mac agg_mac;
  in_addr dst{}, src{};
  if (!parse_mac(argv[2], &agg_mac) || inet_pton(AF_INET, argv[3], &dst) != 1 || inet_pton(AF_INET, argv[5], &src) != 1) {
    std::fprintf(stderr, "thc_dpdk_noise: bad MAC or address\n");
    return 2;
  }
  const unsigned ifindex = if_nametoindex(argv[1]);
  if (ifindex == 0) {
    std::perror("thc_dpdk_noise: if_nametoindex");
    return 1;
  }
  const int fd = ::socket(AF_PACKET, SOCK_RAW, 0);  // protocol 0: send only
  if (fd < 0) {
    std::perror("thc_dpdk_noise: socket(AF_PACKET)");
    return 1;
  }
  sockaddr_ll sll{};
  sll.sll_family = AF_PACKET;
  sll.sll_ifindex = static_cast<int>(ifindex);
  sll.sll_halen = 6;
  std::memcpy(sll.sll_addr, agg_mac.data(), 6);

  // The sender: a locally administered MAC, the given source address, an arbitrary port.
  Local me;
  me.mac = {0x02, 0x7e, 0x57, 0x00, 0x00, 0x01};
  me.ip = ntohl(src.s_addr);
  me.port = 40999;
  const uint32_t agg_ip = ntohl(dst.s_addr);
  const auto agg_port = static_cast<uint16_t>(std::atoi(argv[4]));

  auto good = [&](size_t plen) {
    std::vector<uint8_t> pl(plen, 0x5A);
    std::vector<uint8_t> f(2048);
    f.resize(build_udp_frame(me, agg_mac, agg_ip, agg_port, pl.data(), pl.size(), f.data(), f.size()));
    return f;
  };
  auto arp = [&](uint16_t htype, uint16_t op, uint32_t target) {
    std::vector<uint8_t> f(60, 0);
    std::memset(f.data(), 0xFF, 6);
    std::memcpy(f.data() + 6, me.mac.data(), 6);
    put16(f, 12, 0x0806);
    put16(f, 14, htype);
    put16(f, 16, 0x0800);
    f[18] = 6;
    f[19] = 4;
    put16(f, 20, op);
    std::memcpy(f.data() + 22, me.mac.data(), 6);
    put32(f, 28, me.ip);
    put32(f, 38, target);
    return f;
  };

  std::vector<std::pair<std::string, std::vector<uint8_t>>> frames_out;
  auto add = [&](const char* reason, std::vector<uint8_t> f) { frames_out.emplace_back(reason, std::move(f)); };
  {
    auto f = good(100);
    f.resize(14 + 10);
    add("frame_drop_short", f);
  }
  {
    auto f = good(100);
    put16(f, 12, 0x8100);
    add("frame_drop_vlan", f);
  }
  {
    auto f = good(100);
    put16(f, 12, 0x88B5);  // IEEE local experimental ethertype
    add("frame_drop_not_ipv4", f);
  }
  add("frame_drop_bad_arp", arp(6, 1, agg_ip));
  add("frame_drop_arp_ignored", arp(1, 2, agg_ip));
  {
    auto f = good(100);
    f[5] ^= 0x40;
    add("frame_drop_wrong_dst_mac", f);
  }
  {
    auto f = good(100);
    put32(f, 26, 0);
    fix_ip(f);
    add("frame_drop_bad_src", f);
  }
  {
    auto f = good(100);
    f[14] = 0x65;
    fix_ip(f);
    add("frame_drop_bad_ip_version", f);
  }
  {
    auto f = good(100);
    f[14] = 0x44;
    fix_ip(f);
    add("frame_drop_bad_ihl", f);
  }
  {
    auto f = good(100);
    f[14] = 0x46;  // 4 bytes of options: the "UDP header" now starts 4 bytes later
    fix_ip(f);
    add("frame_drop_ip_options", f);
  }
  {
    auto f = good(100);
    put16(f, 16, static_cast<uint16_t>(f.size() - 14 + 40));
    fix_ip(f);
    add("frame_drop_bad_total_length", f);
  }
  {
    auto f = good(100);
    f[24] ^= 0x5A;
    add("frame_drop_bad_ip_checksum", f);
  }
  // No fragment: af_packet's sockets join a PACKET_FANOUT group with the DEFRAG flag, so the
  // kernel holds fragments for reassembly and DPDK never sees one (frames_test covers the reason).
  {
    auto f = good(100);
    put32(f, 30, agg_ip + 1);
    fix_ip(f);
    add("frame_drop_wrong_dst_ip", f);
  }
  {
    auto f = good(100);
    f[23] = 6;  // TCP
    fix_ip(f);
    add("frame_drop_not_udp", f);
  }
  {
    auto f = good(100);
    put16(f, 38, 200);
    add("frame_drop_bad_udp_length", f);
  }
  {
    auto f = good(100);
    put16(f, 36, static_cast<uint16_t>(agg_port + 1));
    fix_udp(f);
    add("frame_drop_wrong_dst_port", f);
  }
  {
    auto f = good(100);
    f[60] ^= 0x01;
    add("frame_drop_bad_udp_checksum", f);
  }
  // Valid frames whose payload is too short to be a packet: accepted by the RX lcore, dropped and
  // counted by an engine.
  add("drop_truncated", good(4));
  add("drop_truncated", good(20));

  std::map<std::string, int> counts;
  for (const auto& [reason, f] : frames_out) {
    if (::sendto(fd, f.data(), f.size(), 0, reinterpret_cast<const sockaddr*>(&sll), sizeof sll) != static_cast<ssize_t>(f.size())) {
      std::fprintf(stderr, "thc_dpdk_noise: sendto (%s): %s\n", reason.c_str(), std::strerror(errno));
      return 1;
    }
    ++counts[reason];
    ::usleep(2000);
  }
  ::close(fd);
  for (const auto& [reason, n] : counts) std::printf("%s %d\n", reason.c_str(), n);
  return 0;
}
