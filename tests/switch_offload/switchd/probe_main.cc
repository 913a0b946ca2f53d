// thc_switch_probe: helper of the switch end-to-end tests.
//
//   thc_switch_probe stats HOST PORT KEYFILE
//     One STATS request under the operator key (id 0 of KEYFILE); prints "name=value ..." with
//     thc-switchd's counter names (the engine's, then the data plane's).
//
//   thc_switch_probe inject BIND_IP BIND_PORT DST_IP DST_PORT KEY_ID LABEL NWORKERS SLOTS SECONDS
//     A stranger's datagrams for a running job: for SECONDS, every 5 ms, the first packets a
//     worker of the test workload sends (its MAX prelude: seq 0..2 of op 0, 700 lanes) for every
//     worker id, well formed, with every value 0xFFFFFFFF (a MAX result of all ones if one of
//     them were aggregated) and a tag that does not verify. Prints "injected=N replies=M": M counts
//     whatever came back to this address (a switch must answer nothing from an address it did
//     not admit).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "switch_offload/protocol/builder.h"
#include "switch_offload/switchd/switchd.h"

namespace {

using namespace thc::switch_offload;
using namespace thc::switch_offload::proto;

sockaddr_in addr(const char* ip, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
    std::fprintf(stderr, "thc_switch_probe: '%s' is not an IPv4 address\n", ip);
    std::exit(2);
  }
  return a;
}

int udp_bound(const sockaddr_in& a) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0 || ::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    std::perror("thc_switch_probe: bind");
    std::exit(1);
  }
  return fd;
}

int stats(const char* host, int port, const char* key_file) {
  std::vector<auth::Key> keys;
  std::string err;
  if (!auth::load_key_file(key_file, &keys, &err)) {
    std::fprintf(stderr, "thc_switch_probe: %s\n", err.c_str());
    return 2;
  }
  const auth::Key* op = nullptr;
  for (const auto& k : keys)
    if (k.id == auth::kOperatorKeyId) op = &k;
  if (!op) {
    std::fprintf(stderr, "thc_switch_probe: %s holds no operator key (id 0)\n", key_file);
    return 2;
  }
  const auth::TagKey sk = auth::stats_key(*op);
  const int fd = udp_bound(addr("0.0.0.0", 0));
  const sockaddr_in to = addr(host, port);
  for (int attempt = 0; attempt < 20; ++attempt) {
    const uint64_t nonce = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
    const auto req = make_stats(nonce, &sk);
    (void)::sendto(fd, req.data(), req.size(), 0, reinterpret_cast<const sockaddr*>(&to), sizeof to);
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, 500) > 0) {
      std::vector<uint8_t> b(kMaxPacketBytes);
      const ssize_t n = ::recv(fd, b.data(), b.size(), 0);
      Header h;
      const uint8_t* pl;
      size_t plen;
      if (n <= 0 || parse(b.data(), static_cast<size_t>(n), &h, &pl, &plen) != ParseError::kOk ||
          h.type != MsgType::kStatsReply || h.seq != nonce || !auth::verify(sk, b.data(), static_cast<size_t>(n)))
        continue;
      const auto names = switchd::Switchd::names();
      for (uint32_t i = 0; i < h.aux; ++i)
        std::printf("%s%s=%llu", i ? " " : "", i < names.size() ? names[i].c_str() : ("c" + std::to_string(i)).c_str(),
                    static_cast<unsigned long long>(load_be64(pl + 8 * i)));
      std::printf("\n");
      return 0;
    }
  }
  std::fprintf(stderr, "thc_switch_probe: no STATS reply from %s:%d\n", host, port);
  return 1;
}

int inject(char** a) {
  const int fd = udp_bound(addr(a[0], std::atoi(a[1])));
  const sockaddr_in to = addr(a[2], std::atoi(a[3]));
  const uint32_t key_id = static_cast<uint32_t>(std::strtoul(a[4], nullptr, 10));
  const uint32_t label = static_cast<uint32_t>(std::strtoul(a[5], nullptr, 10));
  const int n = std::atoi(a[6]);
  const uint32_t slots = static_cast<uint32_t>(std::atoi(a[7]));
  const double seconds = std::atof(a[8]);
  if (n < 1 || n > kMaxWorkers || slots < 3) {
    std::fprintf(stderr, "thc_switch_probe: NWORKERS 1..64, SLOTS >= 3\n");
    return 2;
  }
  JobId j;
  j.job = make_job_id(key_id, label);
  j.nworkers = static_cast<uint16_t>(n);
  for (auto& b : j.dkey.hdr) b = 0x5A;  // no key: the tag cannot verify
  for (auto& b : j.dkey.pl) b = 0xA5;
  std::vector<std::vector<uint8_t>> pkts;
  for (int w = 0; w < n; ++w)
    for (uint64_t seq = 0; seq < 3; ++seq) {
      const size_t cnt = seq < 2 ? 256 : 700 - 512;
      auto p = make_values(j, static_cast<uint16_t>(w), slots, seq, 0, WireInt::kU32,
                           std::vector<uint32_t>(cnt, 0xFFFFFFFFu), MsgType::kDataMax);
      if (seq == 0) store_be16(p.data() + 6, kFlagFirst);
      pkts.push_back(p);
    }
  uint64_t sent = 0, replies = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    for (const auto& p : pkts)
      if (::sendto(fd, p.data(), p.size(), 0, reinterpret_cast<const sockaddr*>(&to), sizeof to) > 0) ++sent;
    pollfd pf{fd, POLLIN, 0};
    while (::poll(&pf, 1, 5) > 0) {
      uint8_t b[2048];
      if (::recv(fd, b, sizeof b, 0) > 0) ++replies;
    }
  }
  std::printf("injected=%llu replies=%llu\n", static_cast<unsigned long long>(sent), static_cast<unsigned long long>(replies));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "stats" && argc == 5) return stats(argv[2], std::atoi(argv[3]), argv[4]);
  if (cmd == "inject" && argc == 11) return inject(argv + 2);
  std::fprintf(stderr,
               "usage: %s stats HOST PORT KEYFILE\n"
               "       %s inject BIND_IP BIND_PORT DST_IP DST_PORT KEY_ID LABEL NWORKERS SLOTS SECONDS\n",
               argv[0], argv[0]);
  return 2;
}
