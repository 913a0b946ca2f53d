// A DPDK lane's receive burst into the Engine, with the server's link-layer learning: pure code
// over bytes (no DPDK), so that CI tests it everywhere (tests/switch_offload/dpdk/burst_test.cc).
//
// Learning rules (one frame at a time, as before): the peer's MAC is learned before the engine
// answers (the reply needs it), but kept only if the datagram authenticated; a known address
// moves to a new MAC only for a JOIN that passed the address cookie, so a recorded datagram
// replayed from another station (authentic, but no proof of who sends it) never redirects a
// worker's results. Other datagrams from a known address are answered at the MAC already learned.
//
// Batched (handle_burst with batched = true): runs of frames that cannot change the table (not a
// JOIN, from an address already learned) go through Engine::handle_batch (their tags computed
// side by side); a frame that may change it is handled alone between runs. Within a run the
// table is constant, so every reply, the results the engine sends at the run's end included,
// leaves with the MAC it would have had one frame at a time: the same frames, bytes and
// destinations; only the results of a run leave after its other replies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "switch_offload/aggregator/engine.h"
#include "switch_offload/servers/dpdk/frames.h"

namespace thc::switch_offload {

// Peer IPv4 -> the MAC its frames came from, bounded: beyond `limit` entries it is cleared and
// relearned (a flood of verified source addresses; peers of live jobs come back with their next
// frame).
class PeerMacs {
 public:
  explicit PeerMacs(size_t limit = size_t{1} << 16) : limit_(limit) {}
  const frames::Mac* find(uint32_t ip) const {
    const auto it = map_.find(ip);
    return it == map_.end() ? nullptr : &it->second;
  }
  bool contains(uint32_t ip) const { return map_.count(ip) != 0; }
  size_t size() const { return map_.size(); }
  uint64_t resets() const { return resets_.get(); }  // any thread (the server's counters)
  const std::unordered_map<uint32_t, frames::Mac>& entries() const { return map_; }

  // One frame's datagram to the engine under the learning rules.
  Handled handle_one(Engine& e, const uint8_t* payload, size_t len, uint32_t ip, uint16_t port,
                     const frames::Mac& mac, uint64_t now, Sink& out);

 private:
  std::unordered_map<uint32_t, frames::Mac> map_;
  size_t limit_;
  Counter resets_;
};

// A received UDP datagram and where it came from (frames::accepted_udp's fields).
struct RxDatagram {
  const uint8_t* payload;
  size_t len;
  uint32_t ip;  // host byte order
  uint16_t port;
  frames::Mac mac;
};

// The address the engine sees for a peer.
PeerAddr peer_addr(uint32_t ip, uint16_t port);

// A burst: one frame at a time (batched = false) or in runs through handle_batch (see above).
// Scratch vectors are the caller's (reused: no allocation per burst once grown).
struct BurstScratch {
  std::vector<PeerAddr> from;
  std::vector<Datagram> run;
};
void handle_burst(Engine& e, PeerMacs& macs, const RxDatagram* in, size_t n, uint64_t now, Sink& out, bool batched,
                  BurstScratch& scratch);

}  // namespace thc::switch_offload
