// Seeded fault injection for datagram paths (client and server, both directions). Tests use it
// to turn loopback into a lossy, duplicating, reordering network while staying reproducible: the
// decisions are a pure function of the seed and the order of datagrams offered.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "common/net.h"

namespace thc {

struct FaultOptions {
  double drop = 0;        // probability a datagram vanishes
  double dup = 0;         // probability it is delivered twice
  double reorder = 0;     // probability it is held back and delivered after the next one
  double delay_prob = 0;  // probability it is delayed by a uniform time in [0, delay_us]
  uint32_t delay_us = 0;
  uint64_t seed = 1;
  bool active() const { return drop > 0 || dup > 0 || reorder > 0 || (delay_prob > 0 && delay_us > 0); }
  std::string describe() const;
};

// Overrides fields from THC_FAULT_DROP, THC_FAULT_DUP, THC_FAULT_REORDER, THC_FAULT_DELAY_US
// (delay_prob becomes 1 unless THC_FAULT_DELAY_PROB says otherwise) and THC_FAULT_SEED.
// Returns false (and leaves *opt partly updated) if a variable does not parse; *bad names it.
bool fault_options_from_env(FaultOptions* opt, std::string* bad);

// splitmix64: the seed mixer used wherever a reproducible stream is derived from a seed.
inline uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class FaultInjector {
 public:
  struct Datagram {
    std::vector<uint8_t> bytes;
    uint64_t due_us = 0;
    PeerAddr peer;  // opaque to the injector
  };

  FaultInjector() = default;
  FaultInjector(const FaultOptions& o, uint64_t stream);
  bool active() const { return opt_.active(); }

  // Offer one datagram at time now; datagrams ready for delivery are appended to out (zero, one
  // or several: a held-back one may be released behind this one).
  void offer(const uint8_t* data, size_t len, const PeerAddr& peer, uint64_t now_us, std::vector<Datagram>* out);
  // Release delayed or held-back datagrams that are due.
  void poll(uint64_t now_us, std::vector<Datagram>* out);
  // Earliest time poll() has something to release (UINT64_MAX if nothing is held).
  uint64_t next_due() const;

  uint64_t dropped() const { return dropped_; }
  uint64_t duplicated() const { return duplicated_; }
  uint64_t reordered() const { return reordered_; }
  uint64_t delayed() const { return delayed_; }

 private:
  double uniform();
  void schedule(Datagram d, uint64_t now_us, std::vector<Datagram>* out);

  FaultOptions opt_;
  uint64_t state_ = 0;
  std::deque<Datagram> delayed_q_;  // sorted by due time
  std::vector<Datagram> held_;      // reorder: released behind the next datagram (or at due)
  uint64_t dropped_ = 0, duplicated_ = 0, reordered_ = 0, delayed_ = 0;
};

}  // namespace thc
