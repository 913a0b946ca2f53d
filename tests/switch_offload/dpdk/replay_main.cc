// thc_dpdk_replay IFACE FAKE_MAC AGG_PORT [RECORD_FILE]: an attacker on the workers' link. It
// watches the workers' data frames going out of IFACE (a packet socket sees them), sends every
// fourth one again with its Ethernet source replaced by FAKE_MAC (same IP and UDP addresses, same
// genuine protocol tag: a replay), and counts the frames that come back addressed to FAKE_MAC:
// results the aggregator sent to the attacker's MAC instead of the workers'. With RECORD_FILE it
// also records the workers' data frames there (as sniffed, unaltered). Runs until SIGINT/SIGTERM,
// then prints "replayed N" and "redirected M" (frames) for the live test to check (M must be 0).
//
// thc_dpdk_replay IFACE inject RECORD_FILE: sends the recorded frames out of IFACE again and again
// (a recording of an earlier run, e.g. before the aggregator restarted) until SIGINT/SIGTERM, then
// prints "injected N".
#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include "switch_offload/protocol/wire.h"

namespace {

volatile sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

bool parse_mac(const char* s, uint8_t m[6]) {
  unsigned b[6];
  if (std::sscanf(s, "%x:%x:%x:%x:%x:%x", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5]) != 6) return false;
  for (int i = 0; i < 6; ++i) m[i] = static_cast<uint8_t>(b[i]);
  return true;
}

// An IPv4/UDP frame (no IP options) to agg_port carrying a protocol data packet.
bool is_data_to(const uint8_t* f, size_t n, uint16_t agg_port) {
  namespace proto = thc::switch_offload::proto;
  if (n < 14 + 20 + 8 + proto::kHeaderBytes) return false;
  if (f[12] != 0x08 || f[13] != 0x00 || f[14] != 0x45 || f[23] != IPPROTO_UDP) return false;
  if (proto::load_be16(f + 36) != agg_port) return false;
  const uint8_t* p = f + 42;
  if (proto::load_be32(p) != proto::kMagic || p[4] != proto::kVersion) return false;
  const auto t = static_cast<proto::MsgType>(p[5]);
  return t == proto::MsgType::kDataValue || t == proto::MsgType::kDataIndex || t == proto::MsgType::kDataMax;
}

}  // namespace

int main(int argc, char** argv) {
  const bool inject = argc == 4 && std::strcmp(argv[2], "inject") == 0;
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: %s IFACE FAKE_MAC AGG_PORT [RECORD_FILE] | %s IFACE inject RECORD_FILE\n", argv[0], argv[0]);
    return 2;
  }
  uint8_t fake[6] = {};
  if (!inject && !parse_mac(argv[2], fake)) {
    std::fprintf(stderr, "thc_dpdk_replay: bad MAC %s\n", argv[2]);
    return 2;
  }
  const auto agg_port = static_cast<uint16_t>(inject ? 0 : std::atoi(argv[3]));
  const unsigned ifindex = if_nametoindex(argv[1]);
  if (ifindex == 0) {
    std::perror("thc_dpdk_replay: if_nametoindex");
    return 1;
  }
  const int fd = ::socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
  if (fd < 0) {
    std::perror("thc_dpdk_replay: socket(AF_PACKET)");
    return 1;
  }
  sockaddr_ll sll{};
  sll.sll_family = AF_PACKET;
  sll.sll_protocol = htons(ETH_P_ALL);
  sll.sll_ifindex = static_cast<int>(ifindex);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&sll), sizeof sll) != 0) {
    std::perror("thc_dpdk_replay: bind");
    return 1;
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  if (inject) {
    // Records: u32 length (host order), then the frame.
    std::ifstream in(argv[3], std::ios::binary);
    std::vector<std::vector<uint8_t>> frames;
    uint32_t n = 0;
    while (in.read(reinterpret_cast<char*>(&n), sizeof n) && n <= 65536) {
      std::vector<uint8_t> f(n);
      if (!in.read(reinterpret_cast<char*>(f.data()), n)) break;
      frames.push_back(std::move(f));
    }
    if (frames.empty()) {
      std::fprintf(stderr, "thc_dpdk_replay: no frames in %s\n", argv[3]);
      return 1;
    }
    std::printf("ready %zu\n", frames.size());
    std::fflush(stdout);
    unsigned long long injected = 0;
    while (!g_stop) {
      for (const auto& f : frames) {
        if (g_stop) break;
        if (::send(fd, f.data(), f.size(), 0) == static_cast<ssize_t>(f.size())) ++injected;
        ::usleep(200);
      }
    }
    ::close(fd);
    std::printf("injected %llu\n", injected);
    return 0;
  }
  std::ofstream rec;
  if (argc == 5) rec.open(argv[4], std::ios::binary | std::ios::trunc);

  std::vector<uint8_t> f(65536);
  unsigned long long seen = 0, replayed = 0, redirected = 0;
  while (!g_stop) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    sockaddr_ll from{};
    socklen_t fl = sizeof from;
    const ssize_t n = ::recvfrom(fd, f.data(), f.size(), 0, reinterpret_cast<sockaddr*>(&from), &fl);
    if (n < 14) continue;
    if (from.sll_pkttype != PACKET_OUTGOING) {
      if (std::memcmp(f.data(), fake, 6) == 0) ++redirected;
      continue;
    }
    // Our own replays go out of this interface too: leave them alone.
    if (std::memcmp(f.data() + 6, fake, 6) == 0 || !is_data_to(f.data(), static_cast<size_t>(n), agg_port)) continue;
    if (rec.is_open()) {
      const uint32_t len = static_cast<uint32_t>(n);
      rec.write(reinterpret_cast<const char*>(&len), sizeof len);
      rec.write(reinterpret_cast<const char*>(f.data()), n);
      rec.flush();
    }
    if (seen++ % 4 != 0) continue;
    std::memcpy(f.data() + 6, fake, 6);
    if (::send(fd, f.data(), static_cast<size_t>(n), 0) == n) ++replayed;
  }
  ::close(fd);
  std::printf("replayed %llu\nredirected %llu\n", replayed, redirected);
  return 0;
}
