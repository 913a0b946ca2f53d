#include "common/fault.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace thc {

namespace {
// A held-back (reordered) datagram is released at the latest this long after it was held, so a
// last packet of a burst is not starved when nothing follows it.
constexpr uint64_t kReorderHoldUs = 2000;

bool parse_prob(const char* s, double* out) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s, &end);
  if (errno || end == s || *end != '\0' || !(v >= 0.0 && v <= 1.0)) return false;
  *out = v;
  return true;
}
bool parse_u64(const char* s, uint64_t* out) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s, &end, 0);
  if (errno || end == s || *end != '\0' || s[0] == '-') return false;
  *out = v;
  return true;
}
}  // namespace

std::string FaultOptions::describe() const {
  char buf[200];
  std::snprintf(buf, sizeof buf, "drop=%g dup=%g reorder=%g delay=%g/%uus seed=%llu", drop, dup, reorder,
                delay_prob, delay_us, static_cast<unsigned long long>(seed));
  return buf;
}

bool fault_options_from_env(FaultOptions* opt, std::string* bad) {
  struct P {
    const char* name;
    double* field;
  } probs[] = {{"THC_FAULT_DROP", &opt->drop}, {"THC_FAULT_DUP", &opt->dup}, {"THC_FAULT_REORDER", &opt->reorder}};
  for (const P& p : probs) {
    if (const char* v = std::getenv(p.name)) {
      if (!parse_prob(v, p.field)) {
        if (bad) *bad = p.name;
        return false;
      }
    }
  }
  if (const char* v = std::getenv("THC_FAULT_DELAY_US")) {
    uint64_t us = 0;
    if (!parse_u64(v, &us) || us > 10'000'000) {
      if (bad) *bad = "THC_FAULT_DELAY_US";
      return false;
    }
    opt->delay_us = static_cast<uint32_t>(us);
    if (us > 0 && opt->delay_prob == 0) opt->delay_prob = 1.0;
  }
  if (const char* v = std::getenv("THC_FAULT_DELAY_PROB")) {
    if (!parse_prob(v, &opt->delay_prob)) {
      if (bad) *bad = "THC_FAULT_DELAY_PROB";
      return false;
    }
  }
  if (const char* v = std::getenv("THC_FAULT_SEED")) {
    if (!parse_u64(v, &opt->seed)) {
      if (bad) *bad = "THC_FAULT_SEED";
      return false;
    }
  }
  return true;
}

FaultInjector::FaultInjector(const FaultOptions& o, uint64_t stream) : opt_(o) {
  state_ = o.seed ^ (stream * 0xD1B54A32D192ED03ull);
  splitmix64(state_);
}

double FaultInjector::uniform() { return static_cast<double>(splitmix64(state_) >> 11) * 0x1.0p-53; }

void FaultInjector::schedule(Datagram d, uint64_t now_us, std::vector<Datagram>* out) {
  if (opt_.delay_prob > 0 && opt_.delay_us > 0 && uniform() < opt_.delay_prob) {
    d.due_us = now_us + static_cast<uint64_t>(uniform() * opt_.delay_us);
    ++delayed_;
    auto it = std::upper_bound(delayed_q_.begin(), delayed_q_.end(), d.due_us,
                               [](uint64_t t, const Datagram& x) { return t < x.due_us; });
    delayed_q_.insert(it, std::move(d));
    return;
  }
  out->push_back(std::move(d));
}

void FaultInjector::offer(const uint8_t* data, size_t len, const PeerAddr& peer, uint64_t now_us, std::vector<Datagram>* out) {
  if (!opt_.active()) {
    out->push_back(Datagram{std::vector<uint8_t>(data, data + len), now_us, peer});
    return;
  }
  // Draw every decision for every datagram so the stream stays aligned however they combine.
  const bool drop = uniform() < opt_.drop;
  const bool dup = uniform() < opt_.dup;
  const bool reorder = uniform() < opt_.reorder;
  std::vector<Datagram> released;
  released.swap(held_);
  if (drop) {
    ++dropped_;
  } else {
    Datagram d{std::vector<uint8_t>(data, data + len), now_us, peer};
    const int copies = dup ? 2 : 1;
    if (dup) ++duplicated_;
    for (int c = 0; c < copies; ++c) {
      Datagram x = c + 1 < copies ? d : std::move(d);
      if (reorder && c == 0) {
        ++reordered_;
        x.due_us = now_us + kReorderHoldUs;
        held_.push_back(std::move(x));
      } else {
        schedule(std::move(x), now_us, out);
      }
    }
  }
  // Datagrams held by the previous offer go out behind this one: that is the reordering.
  for (Datagram& d : released) schedule(std::move(d), now_us, out);
}

void FaultInjector::poll(uint64_t now_us, std::vector<Datagram>* out) {
  if (!held_.empty() && held_.front().due_us <= now_us) {
    std::vector<Datagram> released;
    released.swap(held_);
    for (Datagram& d : released) schedule(std::move(d), now_us, out);
  }
  while (!delayed_q_.empty() && delayed_q_.front().due_us <= now_us) {
    out->push_back(std::move(delayed_q_.front()));
    delayed_q_.pop_front();
  }
}

uint64_t FaultInjector::next_due() const {
  uint64_t t = std::numeric_limits<uint64_t>::max();
  if (!held_.empty()) t = held_.front().due_us;
  if (!delayed_q_.empty()) t = std::min(t, delayed_q_.front().due_us);
  return t;
}

}  // namespace thc
