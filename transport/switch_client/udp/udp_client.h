// Reducer backed by THC aggregators (thc-aggregator, thc-aggregator-dpdk, a switch speaking
// switch_offload/protocol). The aggregator adds integers (index form: after a table lookup);
// this client chops operations into packets of the job's negotiated lanes, keeps a congestion-
// controlled window of them in flight, retransmits on timeout, authenticates every datagram and
// reports partial aggregation.
//
// Two levels:
//   UdpReducer       one job instance: one (aggregator address, shard) pair, one channel.
//   make_aggregator_reducer(list, ...)
//                    a job over a comma-separated list of addresses ("udp://A:P,udp://B:P"),
//                    each with all the shards (server threads) its JOIN_ACK offers: every
//                    operation is split into contiguous parts, one per instance, at multiples
//                    of the engine's granule (Reducer::set_part_granule), so several aggregators
//                    and cores share one job (BytePS-style server scale-out).
//
// Congestion control (per instance): a window of packets without a result, grown by slow start
// and then additively (one packet per round trip), cut multiplicatively when the round-trip time
// exceeds the minimum by more than a target queueing delay (a delay ceiling: a bounded standing
// queue keeps the bottleneck busy without filling its buffer); sends are paced at 1.25x (2x in
// slow start) window/RTT. Random loss is not congestion: a lost datagram is resent, but the
// window is cut (by 30 %) only when the loss rate of first transmissions (averaged over periods of
// a round trip and 64 packets) per path crossing exceeds loss_tolerance, and reset to window_min
// when nothing is answered for three timer expiries. Loss detection is RACK (RFC 8985): results
// come back in the order the packets were sent, so a packet (first copy or resend) without a
// result once a first copy sent after it is answered was lost, or its result was; it is resent
// after a reordering window of min_rtt/4, about one round trip after the loss (a resend at most
// once per smoothed round trip). A hole does not stop the packets
// behind it; the window never exceeds the job's slots (the aggregator's memory for the job,
// what SwitchML sizes its pool by), so a hole that lasts a whole window holds it. The timer
// (one per instance, restarted by every result; RFC 6298 from samples of packets sent once,
// Karn; srtt + max(4 rttvar, rto_min), doubled per expiry without an answer) is the backstop for
// the tail of an operation: it resends the two oldest packets without a result.
//
// Nonblocking rules: start_* only queues the operation and sends what the window allows;
// Request::test() polls once (never blocks); wait() blocks until the request completes, the
// aggregator reports an error, or max_wait_ms passes without a result for some packet (thc::Error
// kTimeout: a dead worker or aggregator never turns into a hang). Dropping a request before it
// completes never blocks: its inputs are copied and the client keeps sending them in later calls.
//
// start_lookup_sum ignores its DownstreamCodec: the aggregator returns full sums of the sum type.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/fault.h"
#include "switch_offload/protocol/auth.h"
#include "transport/reducer.h"
#include "transport/switch_client/channel.h"

namespace thc::transport {

struct UdpClientOptions {
  std::string address = "udp://127.0.0.1:9471";  // one address (UdpReducer) or a list
                                                  // (make_aggregator_reducer)
  int rank = 0;
  int world = 1;                   // workers in the job, 1..64
  uint32_t job_label = 1;          // the job's id under its key (every worker uses the same)
  switch_offload::auth::Key key;   // the tenant key (id 1..2^32-1) the aggregator knows
  uint16_t shard = 0;              // which job instance at this address (UdpReducer)
  int max_shards = 0;              // instances per address at most (0: all the aggregator offers)
  int quorum = 0;                  // k: a packet may complete with k workers after the quorum
                                   // timeout (0 = world: no partial aggregation)
  uint32_t quorum_timeout_us = 100'000;
  int slots = 1024;                // slots requested at join (the first worker to join decides)
  int max_lanes = 8192;            // lanes per packet at most (256: Tofino profile)
  int payload_budget = 0;          // payload bytes per packet at most (0: the path MTU's)
  int window_init = 32;            // packets in flight at first
  int window_min = 4;
  int window_max = 0;              // 0: the job's slots
  double target_delay_ms = 5;      // queueing delay tolerated above the minimum RTT
  bool pacing = true;
  double rto_initial_ms = 20;      // before the first RTT sample
  double rto_min_ms = 1;           // floor and granularity: RTO = srtt + max(4 rttvar, rto_min)
  double rto_max_ms = 200;
  double loss_tolerance = 0.1;     // loss per path crossing taken as random, not congestion
  double max_wait_ms = 30'000;     // no result for a packet this long: kTimeout
  FaultOptions fault;              // client-side fault injection, both directions
  bool fault_from_env = true;      // THC_FAULT_DROP/DUP/REORDER/DELAY_US/DELAY_PROB/SEED override
};

struct UdpClientStats {
  uint64_t packets_sent = 0;
  uint64_t data_packets = 0;       // first transmissions of data packets
  uint64_t retransmissions = 0;
  uint64_t fast_retransmits = 0;   // of which found by later results (not by a timeout)
  uint64_t timeouts = 0;           // of which sent because a retransmission timer expired
  uint64_t spurious = 0;           // window cuts found spurious and undone (a stall, not a loss)
  uint64_t results = 0;
  uint64_t duplicate_results = 0;  // results for packets already done (dups, late resends)
  uint64_t not_counted = 0;        // results/acks telling this worker it was left out
  uint64_t ignored = 0;            // datagrams that did not parse or were not for us
  uint64_t bad_tags = 0;           // datagrams that failed authentication (ignored)
  uint64_t left_behind = 0;        // operations failed because the job went on without us
  uint64_t rejoins = 0;
  uint64_t bytes_sent = 0;         // datagram bytes (protocol header included)
  uint64_t bytes_received = 0;
  // Where the time goes (microseconds): blocked waiting for the aggregator (wait() and control
  // round trips), of which with no result arriving before a retransmission timer fired (waiting
  // on the RTO), and sleeping with packets queued that the window (cwnd) or the job's slots
  // (a hole at the window's base) held back.
  uint64_t wait_us = 0, rto_wait_us = 0, cwnd_wait_us = 0, slots_wait_us = 0;
  uint64_t loss_cuts = 0, delay_cuts = 0;  // multiplicative window decreases by cause
  uint64_t collapses = 0;          // window reset to window_min: nothing answered for 3 expiries
  double cwnd_min = 0, cwnd_mean = 0;      // over results (mean: sampled at every result)
  double min_rtt_us = 0, srtt_us = 0, cwnd = 0;
  int lanes = 0;                   // lanes of the widest-lane encoding of the job (u8 sums)
};

class UdpReducer final : public Reducer {
 public:
  // Joins the job instance (blocking, retransmitted; throws thc::Error on rejection or timeout).
  // channel: how datagrams travel (null: a UDP socket to opt.address).
  explicit UdpReducer(const UdpClientOptions& opt, std::unique_ptr<DatagramChannel> channel = nullptr);
  // Leaves the job (best effort, bounded wait).
  ~UdpReducer() override;

  int rank() const override;
  int size() const override;
  std::string name() const override;  // the channel's kind
  void max_u32(uint32_t* data, size_t n) override;
  std::unique_ptr<Request> start_sum(void* data, uint64_t count, IntType type) override;
  std::unique_ptr<Request> start_lookup_sum(const uint8_t* packed, uint64_t count, const LookupTable& table,
                                            void* sums, IntType type, const DownstreamCodec* down) override;
  bool prefers_index_form() const override { return true; }
  bool partial_results() const override { return true; }
  std::string wire_stats() const override;
  bool wire_counters(WireCounters* out) const override;

  // The job instance's 64-bit seed, generated by the aggregator when it was created.
  uint64_t shared_seed() const;
  // Slots the aggregator gave the job (the window is at most this).
  int slots() const;
  // Job instances the aggregator offers at this address (JOIN_ACK shards).
  int shards_offered() const;
  UdpClientStats stats() const;

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// What the multi-instance reducer needs of each instance to wait on several at once.
struct InstanceView {
  static uint64_t next_due(UdpReducer& r, uint64_t now);
  static int fd(UdpReducer& r);
  static bool pending(UdpReducer& r);
  static void progress(UdpReducer& r);
};

// A job over one or several aggregator addresses (see above); a single address with one shard
// is a plain UdpReducer. dpdk:// addresses need a channel factory (the C API provides it).
using ChannelFactory = std::unique_ptr<DatagramChannel> (*)(const std::string& address, const void* ctx);
std::unique_ptr<Reducer> make_aggregator_reducer(const UdpClientOptions& opt, ChannelFactory dpdk = nullptr,
                                                 const void* dpdk_ctx = nullptr);
std::unique_ptr<Reducer> make_udp_client(const UdpClientOptions& opt);

// The tenant key for workers: THC_AGGREGATOR_KEY ("ID:HEX") or else the first non-operator key of
// the file THC_AGGREGATOR_KEY_FILE. Throws thc::Error(kInvalidArgument) when neither gives one.
switch_offload::auth::Key aggregator_key_from_env();

}  // namespace thc::transport
