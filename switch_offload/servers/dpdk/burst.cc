#include "switch_offload/servers/dpdk/burst.h"

#include <netinet/in.h>

#include "switch_offload/protocol/wire.h"

namespace thc::switch_offload {

PeerAddr peer_addr(uint32_t ip, uint16_t port) {
  PeerAddr from;
  auto* sa = reinterpret_cast<sockaddr_in*>(&from.ss);
  sa->sin_family = AF_INET;
  sa->sin_port = htons(port);
  sa->sin_addr.s_addr = htonl(ip);
  from.len = sizeof(sockaddr_in);
  return from;
}

namespace {
bool is_join(const uint8_t* payload, size_t len) {
  return len > 5 && payload[5] == static_cast<uint8_t>(proto::MsgType::kJoin);
}
}  // namespace

Handled PeerMacs::handle_one(Engine& e, const uint8_t* payload, size_t len, uint32_t ip, uint16_t port,
                             const frames::Mac& mac, uint64_t now, Sink& out) {
  auto [it, inserted] = map_.try_emplace(ip, mac);
  const frames::Mac previous = it->second;
  const bool moved = !inserted && is_join(payload, len) && previous != mac;
  if (moved) it->second = mac;  // the CHALLENGE / JOIN_ACK go to the joining station
  if (inserted && map_.size() > limit_) {
    map_.clear();
    map_.emplace(ip, mac);
    resets_.add();
  }
  const Handled r = e.handle(payload, len, peer_addr(ip, port), now, out);
  if (r == Handled::kDropped && inserted) {
    map_.erase(ip);
  } else if (moved && r != Handled::kJoined) {
    auto again = map_.find(ip);
    if (again != map_.end()) again->second = previous;
  }
  return r;
}

void handle_burst(Engine& e, PeerMacs& macs, const RxDatagram* in, size_t n, uint64_t now, Sink& out, bool batched,
                  BurstScratch& s) {
  if (!batched) {
    for (size_t i = 0; i < n; ++i) macs.handle_one(e, in[i].payload, in[i].len, in[i].ip, in[i].port, in[i].mac, now, out);
    return;
  }
  if (s.from.size() < n) s.from.resize(n);
  size_t i = 0;
  while (i < n) {
    // A run of frames that leave the table as it is: handle_one would neither insert, move,
    // erase nor reset anything for them.
    size_t k = i;
    s.run.clear();
    while (k < n && !is_join(in[k].payload, in[k].len) && macs.contains(in[k].ip)) {
      s.from[k] = peer_addr(in[k].ip, in[k].port);
      s.run.push_back(Datagram{in[k].payload, in[k].len, &s.from[k]});
      ++k;
    }
    if (!s.run.empty()) e.handle_batch(s.run.data(), s.run.size(), now, out);
    if (k < n) macs.handle_one(e, in[k].payload, in[k].len, in[k].ip, in[k].port, in[k].mac, now, out), ++k;
    i = k;
  }
}

}  // namespace thc::switch_offload
