#include "switch_offload/aggregator/stats.h"

#include <limits>

namespace thc::switch_offload {

const char* drop_name(Drop d) {
  switch (d) {
    case Drop::kTruncated: return "truncated";
    case Drop::kBadMagic: return "bad_magic";
    case Drop::kBadVersion: return "bad_version";
    case Drop::kBadType: return "bad_type";
    case Drop::kBadField: return "bad_field";
    case Drop::kBadLength: return "bad_length";
    case Drop::kWrongDirection: return "wrong_direction";
    case Drop::kUnknownJob: return "unknown_job";
    case Drop::kBadTag: return "bad_tag";
    case Drop::kBadWorker: return "bad_worker";
    case Drop::kBadSlot: return "bad_slot";
    case Drop::kStale: return "stale";
    case Drop::kSlotBusy: return "slot_busy";
    case Drop::kMismatch: return "mismatch";
    case Drop::kNoTable: return "no_table";
    case Drop::kNoResources: return "no_resources";
    case Drop::kConfigMismatch: return "config_mismatch";
    case Drop::kFault: return "fault";
    case Drop::kReplay: return "replay";
    case Drop::kCookie: return "cookie";
    case Drop::kStatsDenied: return "stats_denied";
    case Drop::kBadLanes: return "bad_lanes";
    case Drop::kJobBusy: return "job_busy";
    case Drop::kNotSupported: return "not_supported";
    case Drop::kDataPlane: return "data_plane";
    case Drop::kCount: break;
  }
  return "?";
}

std::vector<std::string> stats_names() {
  std::vector<std::string> n = {"rx_packets",   "rx_bytes",         "tx_packets",      "tx_bytes",
                                "elements",     "slots_completed",  "partial_completions",
                                "results_sent", "retransmissions",  "duplicates",      "result_resends",
                                "late_not_counted", "retractions",  "left_behind", "stuck_completions", "challenges", "jobs_created",    "jobs_freed",
                                "jobs_expired", "jobs_replaced", "tx_errors",        "drops_total"};
  for (int i = 0; i < static_cast<int>(Drop::kCount); ++i) n.push_back(std::string("drop_") + drop_name(static_cast<Drop>(i)));
  return n;
}

std::vector<uint64_t> stats_values(const Stats& s) {
  uint64_t total = 0;
  for (const Counter& c : s.drops) total += c.get();
  std::vector<uint64_t> v = {s.rx_packets.get(),   s.rx_bytes.get(),        s.tx_packets.get(),
                             s.tx_bytes.get(),     s.elements.get(),        s.slots_completed.get(),
                             s.partial_completions.get(), s.results_sent.get(), s.retransmissions.get(),
                             s.duplicates.get(),   s.result_resends.get(),  s.late_not_counted.get(),
                             s.retractions.get(),  s.left_behind.get(),     s.stuck_completions.get(),
                             s.challenges.get(),   s.jobs_created.get(),    s.jobs_freed.get(),
                             s.jobs_expired.get(), s.jobs_replaced.get(),   s.tx_errors.get(),       total};
  for (const Counter& c : s.drops) v.push_back(c.get());
  return v;
}

void stats_accumulate(std::vector<uint64_t>* acc, const std::vector<uint64_t>& v) {
  if (acc->size() < v.size()) acc->resize(v.size(), 0);
  for (size_t i = 0; i < v.size(); ++i) (*acc)[i] += v[i];
}

std::string stats_line(const std::vector<uint64_t>& v) {
  const std::vector<std::string> names = stats_names();
  std::string out;
  for (size_t i = 0; i < v.size() && i < names.size(); ++i) {
    // Zero drop counters are noise in a periodic line; the totals always print.
    if (v[i] == 0 && names[i].compare(0, 5, "drop_") == 0) continue;
    if (!out.empty()) out += ' ';
    out += names[i] + "=" + std::to_string(v[i]);
  }
  return out;
}

uint64_t stats_get(const std::vector<uint64_t>& v, const std::string& name) {
  const std::vector<std::string> names = stats_names();
  for (size_t i = 0; i < names.size() && i < v.size(); ++i)
    if (names[i] == name) return v[i];
  return std::numeric_limits<uint64_t>::max();
}

}  // namespace thc::switch_offload
