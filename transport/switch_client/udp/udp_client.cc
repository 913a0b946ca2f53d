#include "transport/switch_client/udp/udp_client.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <limits>
#include <vector>

#include "common/net.h"
#include "common/status.h"
#include "common/sys_check.h"
#include "common/udp_batch.h"
#include "switch_offload/protocol/wire.h"

namespace thc::transport {

namespace proto = switch_offload::proto;
namespace auth = switch_offload::auth;

namespace {

proto::WireInt wire_of(IntType t) {
  switch (t) {
    case IntType::kU8: return proto::WireInt::kU8;
    case IntType::kU16: return proto::WireInt::kU16;
    case IntType::kU32: return proto::WireInt::kU32;
    case IntType::kI8: return proto::WireInt::kI8;
    case IntType::kI16: return proto::WireInt::kI16;
    case IntType::kI32: return proto::WireInt::kI32;
  }
  return proto::WireInt::kNone;
}

enum class Kind { kMax, kSum, kLookup };

struct Op {
  Kind kind = Kind::kSum;
  proto::MsgType type = proto::MsgType::kDataValue;
  uint32_t id = 0;
  uint64_t count = 0;
  uint64_t first_seq = 0;
  uint64_t npkts = 0;
  int lanes = 0;
  proto::WireInt enc = proto::WireInt::kNone;  // sum type on the wire
  int bits = 0;
  uint8_t table_id = 0;
  const uint8_t* packed = nullptr;  // lookup: input indices
  void* data = nullptr;             // sum/max: input and output (in place); lookup: output
  std::vector<uint8_t> owned_in, owned_out;  // the request was dropped early: our own copies
  uint64_t done = 0;
  bool have_bitmap = false;
  uint64_t bitmap = 0;
  bool inconsistent = false;
  Status failed = Status::kSuccess;
  std::string fail_msg;
  bool complete() const { return done == npkts || failed != Status::kSuccess; }
};

struct Pkt {
  Op* op = nullptr;
  uint64_t seq = 0;
  uint64_t first_send = 0;
  uint64_t last_send = 0;
  uint64_t xn = 0;         // transmission number of its newest copy (RACK's "sent after")
  uint32_t len = 0;
  int sends = 0;
  bool done = false;
  uint64_t plhash = 0;     // payload hash: a retransmission re-signs only the header
};

struct TableEntry {
  bool valid = false;
  int bits = 0;
  proto::WireInt sum = proto::WireInt::kNone;
  std::vector<int32_t> values;
  uint64_t last_use = 0;
};

constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

}  // namespace

struct UdpReducer::Impl {
  UdpClientOptions opt;
  std::unique_ptr<DatagramChannel> ch;
  PeerAddr agg;  // the fault injectors' tag for the aggregator (unused otherwise)
  uint64_t job = 0;
  auth::TagKey jkey, dkey;
  uint64_t seed = 0;
  uint32_t S = 0;
  int L = 0;        // max lanes
  int budget = 0;   // payload budget
  int shards = 1;
  uint64_t all = 0;
  // JOIN_ACK kAckDataPlane: a switch pipeline aggregates (switch_offload/p4/CONTRACT.md).
  bool data_plane = false;
  FaultInjector tx_fault, rx_fault;
  UdpClientStats st;

  uint64_t next_seq = 0;   // next data packet sequence number to assign
  uint32_t next_op = 0;
  uint64_t base = 0;       // lowest seq without a result
  uint64_t sent_end = 0;   // seqs [base, sent_end) were sent
  uint64_t inflight = 0;   // of which without a result: what the congestion window bounds
  std::vector<Pkt> ring;   // [seq % S]
  std::vector<uint8_t> arena;  // [seq % S] * max_dgram: the packets' bytes, built once
  size_t max_dgram = 0;
  std::deque<std::shared_ptr<Op>> ops;  // ops with packets not yet all sent or done

  // Congestion control.
  double cwnd = 0;
  bool slow_start = true;
  double srtt = 0, rttvar = 0, min_rtt = 0;
  bool have_rtt = false;
  double tokens = 0;       // pacing credit, bytes
  uint64_t token_time = 0;
  // The retransmission timer (one per instance, as TCP's): it expires rto (doubled per expiry
  // without an answer in between) after the last result, or after the oldest send in flight.
  uint64_t timer_ref = 0;
  int backoff = 0;
  double round_min = 1e18, standing = 0;  // smallest RTT sample of this / the last round trip
  uint64_t round_start = 0;
  uint64_t collapse_time = 0;  // the window was reset then, and no answer has come since
  double cwnd_before_collapse = 0;
  bool slow_start_before = false;
  // Loss detection (RACK, RFC 8985): first transmissions (xq) and resends (rq) in send order,
  // (xn, seq), oldest first (entries of packets answered or sent again since are skipped when
  // they come to the front); the newest transmission answered, and how long its answer took.
  std::deque<std::pair<uint64_t, uint64_t>> xq, rq;
  uint64_t xn_next = 1;
  uint64_t rack_xn = 0;
  uint64_t rack_xn_resend = 0;  // the newest resend answered: evidence against older resends only
  uint64_t rack_rtt = 0;
  uint64_t rack_deadline = kNever;  // reordering timer: a candidate's answer is overdue then
  // Loss rate per measurement period (at least a round trip and kLossSample outcomes).
  uint64_t lp_start = 0, lp_delivered = 0, lp_lost = 0;
  double lp_rate = 0;   // moving average of the periods' loss fractions
  // Sleeps since the last result or timeout, by what held sending back (cwnd, slots, other): a
  // timeout books them as waiting on the RTO, a result or the end of a wait under their cause.
  uint64_t pend_sleep[3] = {0, 0, 0};
  double cwnd_sum = 0;

  TableEntry tables[proto::kTableIds];
  uint64_t table_clock = 0;

  // Control round trips (JOIN/TABLE/LEAVE) wait for a reply with their nonce. Nonces grow over
  // every life of this worker and never repeat an earlier one's: they start from the wall clock
  // (ns), so neither the aggregator's replay check on JOINs rejects a restarted worker nor does a
  // recorded reply to an earlier process (JOIN_ACK, ERROR) match a request of this one.
  uint64_t ctl_nonce = 0;
  bool ctl_pending = false;
  bool ctl_have = false;
  proto::Header ctl_hdr;
  std::vector<uint8_t> ctl_payload;

  bool broken = false;
  Status broken_status = Status::kSuccess;
  std::string broken_msg;
  bool need_rejoin = false;
  bool rejoin_registered = false;

  std::vector<uint8_t> rbuf = std::vector<uint8_t>(proto::kMaxPacketBytes + 1);
  std::vector<FaultInjector::Datagram> fbuf;

  std::string where() const {
    return ch->kind() + " client (rank " + std::to_string(opt.rank) + ", job " + std::to_string(opt.job_label) +
           (opt.shard ? " shard " + std::to_string(opt.shard) : std::string()) + ", " + ch->peer() + ")";
  }
  std::string last_error() const {
    const std::string e = ch->last_error();
    return e.empty() ? std::string() : " (last " + ch->kind() + " error: " + e + ")";
  }

  [[noreturn]] void die(Status s, const std::string& msg) {
    if (!broken) {
      broken = true;
      broken_status = s;
      broken_msg = msg;
    }
    fail(broken_status, broken_msg);
  }
  void check_broken() {
    if (broken) fail(broken_status, broken_msg);
  }

  // ---- datagram I/O (through the fault injectors) ---------------------------------------------

  void send_dgram(const uint8_t* p, size_t n) {
    st.packets_sent++;
    st.bytes_sent += n;
    if (!tx_fault.active()) return ch->send(p, n);
    fbuf.clear();
    tx_fault.offer(p, n, agg, mono_us(), &fbuf);
    for (auto& d : fbuf) ch->send(d.bytes.data(), d.bytes.size());
  }
  void pump_faults(uint64_t now) {
    if (tx_fault.active()) {
      fbuf.clear();
      tx_fault.poll(now, &fbuf);
      for (auto& d : fbuf) ch->send(d.bytes.data(), d.bytes.size());
    }
    if (rx_fault.active()) {
      std::vector<FaultInjector::Datagram> in;
      rx_fault.poll(now, &in);
      for (auto& d : in) on_datagram(d.bytes.data(), d.bytes.size());
    }
  }
  void receive_all() {
    for (;;) {
      const size_t n = ch->recv(rbuf.data(), rbuf.size());
      if (n == 0) return;
      st.bytes_received += n;
      if (rx_fault.active()) {
        std::vector<FaultInjector::Datagram> in;
        rx_fault.offer(rbuf.data(), n, agg, mono_us(), &in);
        for (auto& d : in) on_datagram(d.bytes.data(), d.bytes.size());
      } else {
        on_datagram(rbuf.data(), n);
      }
    }
  }

  // ---- incoming ---------------------------------------------------------------------------------

  void fail_inflight(Status s, const std::string& msg) {
    for (auto& op : ops)
      if (!op->complete()) {
        op->failed = s;
        op->fail_msg = msg;
      }
    ops.clear();
    base = sent_end = next_seq;
    reset_flight();
  }

  // data_key: the error verified under the data key (an answer to a data or TABLE/LEAVE packet);
  // else under the join key (an answer to a JOIN).
  void on_error(const proto::Header& h, bool data_key) {
    const auto code = static_cast<proto::ErrorCode>(h.aux);
    // An error answers one request: the control request in progress, or a data packet in flight.
    // Anything else is a late duplicate or a recording of an earlier answer (replayed to stop
    // this worker), and is ignored.
    const bool ctl = ctl_pending && h.seq == ctl_nonce && h.op == 0 && h.slot == 0 && h.shadow == 0;
    bool data = false;
    if (data_key && S > 0 && h.seq >= base && h.seq < sent_end) {
      const Pkt& k = ring[h.seq % S];
      data = k.seq == h.seq && !k.done && k.op && k.op->id == h.op;
    }
    if (!ctl && !data) {
      st.ignored++;
      return;
    }
    if (ctl && code == proto::ErrorCode::kJobBusy) {
      // An answer to our JOIN, not a failure yet: join() waits and asks again.
      ctl_have = true;
      ctl_hdr = h;
      ctl_payload.clear();
      return;
    }
    std::string what = std::string("aggregator rejected ") + (ctl ? "a request" : "packet seq " + std::to_string(h.seq)) +
                       ": " + proto::error_code_name(code);
    Status s = Status::kTransport;
    switch (code) {
      case proto::ErrorCode::kLeftBehind: {
        st.left_behind++;
        need_rejoin = true;
        fail_inflight(Status::kLeftBehind,
                      where() + ": left behind: partial aggregation went on without this worker and the result of "
                                "packet seq " + std::to_string(h.seq) + " (op " + std::to_string(h.op) +
                                ") is gone; the input stays in the error-feedback residual and the next call "
                                "rejoins the job");
        return;
      }
      case proto::ErrorCode::kUnknownJob: what += " (the aggregator restarted or expired the job)"; break;
      case proto::ErrorCode::kConfigMismatch:
        s = Status::kConfigMismatch;
        what += " (workers disagree on world size, quorum, quorum timeout, lanes or path MTU, or on the operation "
                "sequence; or an earlier run of this job label that did not end cleanly still holds it: the "
                "aggregator frees it after its --job-idle-timeout of silence)";
        break;
      case proto::ErrorCode::kNoResources:
        what += " (aggregator --max-jobs, --max-memory or --max-jobs-per-source reached)";
        break;
      case proto::ErrorCode::kNotSupported:
        s = Status::kUnsupported;
        what += opt.quorum > 0 && opt.quorum < opt.world
                    ? " (the aggregator is a switch data plane, thc-switchd: it takes no quorum jobs; quorum " +
                          std::to_string(opt.quorum) + " < " + std::to_string(opt.world) +
                          " workers needs a software aggregator, thc-aggregator or thc-aggregator-dpdk)"
                    : " (the aggregator is a switch data plane, thc-switchd: it needs the Tofino profile, 256 lanes in "
                      "a 1024-byte payload, a route to this worker's address and, for index form, b in {1,2,4,8} with "
                      "8- or 16-bit sums; "
                      "see thc-switchd's log)";
        break;
      default: break;
    }
    die(s, where() + ": " + what);
  }

  void on_datagram(const uint8_t* p, size_t n) {
    proto::Header h;
    const uint8_t* pl = nullptr;
    size_t plen = 0;
    if (proto::parse(p, n, &h, &pl, &plen) != proto::ParseError::kOk || h.job != job || h.shard != opt.shard ||
        h.worker != opt.rank) {
      st.ignored++;
      return;
    }
    // Join-phase replies are tagged with the join key, everything else with the data key (an
    // ERROR with either, depending on what it answers); what does not verify is somebody else's
    // (or forged) and ignored, never acted upon.
    bool ok, data_key = false;
    if (h.type == proto::MsgType::kChallenge || h.type == proto::MsgType::kJoinAck) {
      ok = auth::verify(jkey, p, n);
    } else if (h.type == proto::MsgType::kError) {
      data_key = seed != 0 && auth::verify(dkey, p, n);
      ok = data_key || auth::verify(jkey, p, n);
    } else {
      ok = seed != 0 && auth::verify(dkey, p, n);
      // A switch pipeline cannot compute SipHash: its RESULTs carry tag 0. Taken only on a job whose
      // JOIN_ACK (authenticated) said so, from the joined address (the channel takes datagrams
      // from the aggregator's address only), and by on_result only for a packet in flight with
      // every worker counted; everything else stays authenticated (protocol README "Tofino").
      if (!ok && data_plane && h.type == proto::MsgType::kResult && h.tag == 0) {
        if (h.flags == 0 && h.bitmap == all && h.contributors == opt.world) return on_result(h, pl, plen);
        st.ignored++;
        return;
      }
    }
    if (!ok) {
      st.bad_tags++;
      return;
    }
    switch (h.type) {
      case proto::MsgType::kError: return on_error(h, data_key);
      case proto::MsgType::kChallenge:
      case proto::MsgType::kJoinAck:
      case proto::MsgType::kTableAck:
      case proto::MsgType::kLeaveAck:
        if (h.seq == ctl_nonce && !ctl_have) {
          ctl_have = true;
          ctl_hdr = h;
          ctl_payload.assign(pl, pl + plen);
        }
        return;
      case proto::MsgType::kResult: return on_result(h, pl, plen);
      case proto::MsgType::kAck:
        if (h.flags & proto::kFlagNotCounted) st.not_counted++;
        return;
      default: break;
    }
    st.ignored++;
  }

  void on_rtt(uint64_t rtt_us, uint64_t now) {
    const double r = static_cast<double>(rtt_us);
    if (!have_rtt) {
      srtt = r;
      rttvar = r / 2;
      min_rtt = r;
      have_rtt = true;
      round_start = now;
      round_min = r;
    } else {
      rttvar = 0.75 * rttvar + 0.25 * std::fabs(srtt - r);
      srtt = 0.875 * srtt + 0.125 * r;
      min_rtt = std::min(min_rtt, r);
    }
    // The delay signal is the smallest sample of the last round trip (the standing RTT, as Copa
    // and BBR use): a queue raises every sample, while a worker or the aggregator waiting for a
    // core (the 2-core testbed runs 4 workers and the aggregator) or for a slow worker's packet
    // raises only some.
    round_min = std::min(round_min, r);
    const bool round_over = static_cast<double>(now - round_start) >= std::max(srtt, 200.0);
    if (round_over) {
      standing = round_min;
      round_start = now;
      round_min = 1e18;
    }
    // Delay ceiling: a standing queue of target_delay keeps the bottleneck busy; more only adds
    // latency (and, in a shallow buffer, loss).
    const double target = min_rtt + opt.target_delay_ms * 1000.0;
    if (standing <= target) {
      cwnd += slow_start ? 1.0 : 1.0 / std::max(cwnd, 1.0);
    } else if (round_over) {
      slow_start = false;
      cwnd *= std::max(0.5, 1.0 - 0.8 * (standing - target) / standing);
      st.delay_cuts++;
    }
    clamp_cwnd();
  }
  // Random loss is not congestion: a worker sees the holes of every worker's uplink and of its
  // own downlink, so 1 % loss per datagram leaves ~5 % of a 4-worker job's slots with a hole,
  // and halving the window for each (TCP Reno's rule) would hold it near sqrt(1.5/0.05) ~ 5
  // packets. Congestion shows as queueing delay (the ceiling in on_rtt) long before a buffer
  // overflows; loss counts only as a rate: when the share of first transmissions found lost,
  // taken as independent losses on the n + 1 path crossings a slot's result depends on, exceeds
  // loss_tolerance per crossing (a policer, a shallow buffer, a failing link), the window
  // shrinks by 30 %, at most once per period.
  static constexpr uint64_t kLossSample = 64;
  void loss_period(uint64_t now) {
    const uint64_t n = lp_delivered + lp_lost;
    if (n < kLossSample || static_cast<double>(now - lp_start) < std::max(srtt, 200.0)) return;
    // Holes come in bursts (a stall ends, a batch of answers reveals them at once), so a period
    // of 64 says little alone: the rate is averaged over about four.
    const double f = static_cast<double>(lp_lost) / static_cast<double>(n);
    lp_rate = 0.75 * lp_rate + 0.25 * f;
    const double per_crossing = 1.0 - std::pow(1.0 - lp_rate, 1.0 / (opt.world + 1));
    if (per_crossing > opt.loss_tolerance) {
      slow_start = false;
      cwnd *= 0.7;
      st.loss_cuts++;
      clamp_cwnd();
    }
    lp_start = now;
    lp_delivered = lp_lost = 0;
  }
  // The timer expired three times in a row, nothing answered for seven timeouts: nothing gets
  // through (a blackout, or a queue that overflowed hard). Start over from the smallest window
  // (QUIC's persistent congestion). A worker or the aggregator waiting for a core (several ms
  // on a shared host) stalls every answer just the same; that shows when a packet sent before
  // the reset and never resent is answered (its first copy went through) before anything sent
  // after it, and the reset is undone (F-RTO, RFC 5682; the probes themselves, the oldest
  // packets, are answered first either way).
  void on_persistent_loss(uint64_t now) {
    if (collapse_time) return;  // once per silence
    cwnd_before_collapse = cwnd;
    slow_start_before = slow_start;
    collapse_time = now;
    cwnd = opt.window_min;
    slow_start = true;
    st.collapses++;
    clamp_cwnd();
  }
  void after_collapse(const Pkt& k) {
    if (k.first_send >= collapse_time) {
      collapse_time = 0;  // new packets are answered: the reset stands
    } else if (k.sends == 1) {
      if (cwnd_before_collapse > cwnd) {
        cwnd = cwnd_before_collapse;
        slow_start = slow_start_before;
        st.spurious++;
      }
      collapse_time = 0;
    }
  }
  double window_cap() const {
    const double mx = opt.window_max > 0 ? std::min<double>(opt.window_max, S) : S;
    return std::max(mx, 1.0);
  }
  void clamp_cwnd() { cwnd = std::clamp(cwnd, std::min<double>(opt.window_min, window_cap()), window_cap()); }
  // RFC 6298 from the measured round trips, with rto_min as the granularity term (QUIC's
  // kGranularity): a floor near the real round trip, not a fixed 25 ms that a 50 us loopback or a
  // few-ms cluster would spend idle at the tail of every operation that lost a packet there.
  uint64_t rto_us(int backoff = 0) const {
    const double base_rto =
        have_rtt ? srtt + std::max(4 * rttvar, opt.rto_min_ms * 1000.0) : opt.rto_initial_ms * 1000.0;
    const double r = std::ldexp(std::min(base_rto, opt.rto_max_ms * 1000.0), std::min(backoff, 16));
    return static_cast<uint64_t>(std::clamp(r, opt.rto_min_ms * 1000.0, opt.rto_max_ms * 1000.0));
  }
  uint64_t reo_wnd() const {
    // RFC 8985 grows it when a resend turns out spurious (a DSACK); here a second answer to one
    // packet mostly means that the missing worker's repair raced this worker's resend, which a
    // wider window would not avoid (both resend at the same moment), so it stays min_rtt/4.
    return static_cast<uint64_t>(std::min(min_rtt / 4, std::max(srtt, 1.0)));
  }
  void reset_flight() {
    inflight = 0;
    xq.clear();
    rq.clear();
    rack_xn = rack_xn_resend = 0;
    rack_deadline = kNever;
    backoff = 0;
  }

  void write_out(Op& op, uint64_t first, uint64_t cnt, const uint8_t* pl) {
    const size_t w = proto::wire_int_bytes(op.enc);
    uint8_t* out = static_cast<uint8_t*>(op.data) + first * w;
    if (w == 1) {
      std::memcpy(out, pl, cnt);
    } else if (w == 2) {
      for (uint64_t i = 0; i < cnt; ++i) {
        const uint16_t v = proto::load_be16(pl + 2 * i);
        std::memcpy(out + 2 * i, &v, 2);
      }
    } else {
      for (uint64_t i = 0; i < cnt; ++i) {
        const uint32_t v = proto::load_be32(pl + 4 * i);
        std::memcpy(out + 4 * i, &v, 4);
      }
    }
  }

  void on_result(const proto::Header& h, const uint8_t* pl, size_t plen) {
    if (h.nworkers != opt.world) {
      st.ignored++;
      return;
    }
    if (h.seq < base || h.seq >= sent_end) {
      st.duplicate_results++;
      return;
    }
    Pkt& k = ring[h.seq % S];
    if (k.done || k.seq != h.seq) {
      st.duplicate_results++;
      return;
    }
    Op& op = *k.op;
    const uint64_t idx = h.seq - op.first_seq;
    const uint64_t first = idx * static_cast<uint64_t>(op.lanes);
    const uint64_t cnt = std::min<uint64_t>(static_cast<uint64_t>(op.lanes), op.count - first);
    const proto::WireInt want_enc = op.kind == Kind::kMax ? proto::WireInt::kU32 : op.enc;
    if (h.op != op.id || h.count != cnt || h.enc != want_enc || h.lanes != op.lanes ||
        plen < cnt * proto::wire_int_bytes(want_enc)) {
      st.ignored++;
      return;
    }
    write_out(op, first, cnt, pl);
    if (!op.have_bitmap) {
      op.have_bitmap = true;
      op.bitmap = h.bitmap;
    } else if (op.bitmap != h.bitmap && op.kind != Kind::kMax) {
      op.inconsistent = true;
    }
    if (h.flags & proto::kFlagNotCounted) st.not_counted++;
    st.results++;
    const uint64_t now = mono_us();
    if (collapse_time) after_collapse(k);
    if (k.sends == 1) on_rtt(now - k.first_send, now);
    // The newest transmission known answered. Only first copies count: a result does not say
    // which copy of a resent packet it answers (after a stall, the original's answer comes late),
    // and a resend to a finished slot is answered at once while a first copy waits for every
    // worker's, so a resend's answer says nothing about what was sent before it.
    if (k.sends == 1 && k.xn > rack_xn) {
      rack_xn = k.xn;
      rack_rtt = now - k.last_send;
    }
    if (k.sends > 1) rack_xn_resend = std::max(rack_xn_resend, k.xn);
    k.done = true;
    op.done++;
    inflight--;
    if (k.sends == 1) lp_delivered++;  // first copies answered; resent packets (fate unclear) count neither way
    timer_ref = now;
    backoff = 0;
    book_sleeps(false);
    cwnd_sum += cwnd;
    st.cwnd_min = st.results == 1 ? cwnd : std::min(st.cwnd_min, cwnd);
    while (base < sent_end && ring[base % S].done) ++base;
    while (!ops.empty() && ops.front()->complete() && ops.front()->first_seq + ops.front()->npkts <= base) ops.pop_front();
    detect_losses(now);
    loss_period(now);
  }

  // Results come back in the order the packets were sent: a slot completes when the last of its
  // workers' packets arrives, and every worker sends in seq order over one path. So a packet
  // (first copy or resend) still without a result once a first copy sent after it is answered
  // was lost, or its result was: resend it as soon as its answer is overdue by the reordering
  // window (RACK, RFC 8985). This finds holes anywhere in the window, lost resends and lost
  // results of finished slots (the aggregator answers the new attempt from the slot) about one
  // round trip after the loss, with no timer; the timer stays the backstop for the tail of an
  // operation, where nothing sent later can tell.
  //
  // A resend is declared lost again only a smoothed round trip after it went out at the soonest:
  // a worker whose own copy arrived cannot tell its resend from the missing worker's, and must
  // not resend every few microseconds until that worker's repair comes in. Answers to later
  // resends count against it too (at the tail of an operation the holes being repaired are all
  // that is still answered), but not against first copies: a resend to a finished slot is
  // answered at once, while a first copy waits for every worker's.
  void detect_losses(uint64_t now) {
    rack_deadline = kNever;
    const uint64_t d = rack_rtt + reo_wnd();
    lp_lost += scan_lost(xq, d, rack_xn, now);
    scan_lost(rq, std::max<uint64_t>(d, static_cast<uint64_t>(srtt)), std::max(rack_xn, rack_xn_resend), now);
  }
  // Resends the packets of q (send order) overdue by `delay` with something sent later (before
  // transmission `evidence`) answered; returns how many.
  uint64_t scan_lost(std::deque<std::pair<uint64_t, uint64_t>>& q, uint64_t delay, uint64_t evidence, uint64_t now) {
    uint64_t lost = 0;
    while (!q.empty()) {
      const uint64_t xn = q.front().first, seq = q.front().second;
      Pkt& p = ring[seq % S];
      if (seq < base || seq >= sent_end || p.seq != seq || p.done || p.xn != xn) {
        q.pop_front();  // answered, or sent again since (a newer entry stands for it)
        continue;
      }
      if (xn >= evidence) break;  // nothing sent after it has been answered yet
      const uint64_t due = p.last_send + delay;
      if (now < due) {
        rack_deadline = std::min(rack_deadline, due);  // send times grow along q: the rest are due later
        break;
      }
      q.pop_front();
      resend(p, now);
      st.fast_retransmits++;
      ++lost;
    }
    return lost;
  }

  void resend(Pkt& k, uint64_t now) {
    uint8_t* w = arena.data() + (k.seq % S) * max_dgram;
    proto::store_be16(w + 6, static_cast<uint16_t>(proto::load_be16(w + 6) | proto::kFlagRetransmit));
    // The attempt number (header bytes 28..29 of upstream data): the aggregator answers each
    // attempt once, so a recorded copy replayed by somebody else draws nothing.
    proto::store_be16(w + 28, static_cast<uint16_t>(std::min(k.sends, 65535)));
    proto::store_be64(w + proto::kTagOffset, auth::tag_from_hash(dkey, w, k.plhash));
    send_dgram(w, k.len);
    st.retransmissions++;
    k.sends++;
    k.last_send = now;
    k.xn = xn_next++;
    rq.emplace_back(k.xn, k.seq);
  }

  // ---- outgoing ---------------------------------------------------------------------------------

  Op* op_for_seq(uint64_t seq) {
    // Searched from the back: new packets belong to the newest ops.
    for (auto it = ops.rbegin(); it != ops.rend(); ++it)
      if (seq >= (*it)->first_seq && seq < (*it)->first_seq + (*it)->npkts) return it->get();
    return nullptr;
  }

  void build(Pkt& k) {
    Op& op = *k.op;
    const uint64_t idx = k.seq - op.first_seq;
    const uint64_t first = idx * static_cast<uint64_t>(op.lanes);
    const uint64_t cnt = std::min<uint64_t>(static_cast<uint64_t>(op.lanes), op.count - first);
    proto::Header h;
    h.type = op.type;
    h.flags = idx == 0 ? proto::kFlagFirst : 0;
    h.job = job;
    h.shard = opt.shard;
    h.worker = static_cast<uint16_t>(opt.rank);
    h.nworkers = static_cast<uint16_t>(opt.world);
    h.slot = static_cast<uint16_t>(k.seq % S);
    h.shadow = static_cast<uint8_t>((k.seq / S) & 1);
    h.lanes = static_cast<uint16_t>(op.lanes);
    h.enc = op.enc;
    h.bits = static_cast<uint8_t>(op.kind == Kind::kLookup ? op.bits : 0);
    h.count = static_cast<uint16_t>(cnt);
    h.seq = k.seq;
    h.op = op.id;
    h.aux = op.kind == Kind::kLookup ? op.table_id : 0;
    const size_t plen = proto::data_payload_bytes(h.type, h.enc, h.bits, op.lanes);
    uint8_t* w = arena.data() + (k.seq % S) * max_dgram;
    proto::write_header(h, w, max_dgram);
    uint8_t* pl = w + proto::kHeaderBytes;
    // Only the last packet of an op has lanes beyond its count; they travel as zeros.
    if (cnt < static_cast<uint64_t>(op.lanes)) std::memset(pl, 0, plen);
    if (op.kind == Kind::kLookup) {
      proto::copy_indices(op.packed, first, cnt, op.bits, pl);
    } else {
      const size_t wb = proto::wire_int_bytes(op.enc);
      const uint8_t* in = static_cast<const uint8_t*>(op.data) + first * wb;
      if (wb == 1) {
        std::memcpy(pl, in, cnt);
      } else if (wb == 2) {
        for (uint64_t i = 0; i < cnt; ++i) {
          uint16_t v;
          std::memcpy(&v, in + 2 * i, 2);
          proto::store_be16(pl + 2 * i, v);
        }
      } else {
        for (uint64_t i = 0; i < cnt; ++i) {
          uint32_t v;
          std::memcpy(&v, in + 4 * i, 4);
          proto::store_be32(pl + 4 * i, v);
        }
      }
    }
    k.len = static_cast<uint32_t>(proto::kHeaderBytes + plen);
    k.plhash = auth::payload_hash(dkey, pl, plen);
    proto::store_be64(w + proto::kTagOffset, auth::tag_from_hash(dkey, w, k.plhash));
  }

  // Pacing: credit accrues at gain * cwnd / srtt packets' worth of bytes per second, up to one
  // GSO buffer's worth of burst.
  void refill(uint64_t now) {
    if (!opt.pacing || !have_rtt) {
      tokens = 1e18;
      return;
    }
    const double pkt = static_cast<double>(max_dgram);
    const double gain = slow_start ? 2.0 : 1.25;
    const double rate = gain * cwnd * pkt / std::max(srtt, 1.0);  // bytes per us
    tokens = std::min(tokens + rate * static_cast<double>(now - token_time), 64.0 * pkt);
    token_time = now;
  }

  void send_new(uint64_t now) {
    refill(now);
    const uint64_t win = static_cast<uint64_t>(std::max(1.0, std::floor(cwnd)));
    // The window bounds the packets without a result, not the distance from the oldest one: a
    // hole being repaired does not stop the packets behind it (only the job's slots do).
    while (sent_end < next_seq && inflight < win && sent_end < base + S) {
      if (tokens < static_cast<double>(max_dgram) && tokens < 1e17) break;
      Pkt& k = ring[sent_end % S];
      k = Pkt{};
      k.seq = sent_end;
      k.op = op_for_seq(k.seq);
      if (!k.op) die(Status::kInternal, where() + ": no operation for packet seq " + std::to_string(k.seq));
      build(k);
      k.first_send = k.last_send = now;
      k.sends = 1;
      k.xn = xn_next++;
      xq.emplace_back(k.xn, k.seq);
      if (inflight == 0) timer_ref = now;
      send_dgram(arena.data() + (k.seq % S) * max_dgram, k.len);
      st.data_packets++;
      if (tokens < 1e17) tokens -= k.len;
      ++sent_end;
      ++inflight;
    }
  }

  // When send_new can go on (pacing), or kNever.
  uint64_t next_send_time(uint64_t now) const {
    const uint64_t win = static_cast<uint64_t>(std::max(1.0, std::floor(cwnd)));
    if (!(sent_end < next_seq && inflight < win && sent_end < base + S)) return kNever;
    if (!opt.pacing || !have_rtt || tokens >= static_cast<double>(max_dgram)) return now;
    const double gain = slow_start ? 2.0 : 1.25;
    const double rate = gain * cwnd * static_cast<double>(max_dgram) / std::max(srtt, 1.0);
    return now + static_cast<uint64_t>((static_cast<double>(max_dgram) - tokens) / std::max(rate, 1e-9)) + 1;
  }

  uint64_t timer_at() const { return inflight == 0 ? kNever : timer_ref + rto_us(backoff); }

  // The timer is the backstop for what no later result can reveal: the tail of an operation,
  // a hole that filled the whole window (the job's slots). Restarted by every result, it expires
  // only when nothing has been answered for a timeout, and then resends the kProbes oldest
  // packets without a result: the oldest slot not complete anywhere is the one every worker
  // waits for, so its loser resends it at its first expiry; a process waiting for a core stalls
  // every answer alike, and resending the whole window for that would only load the aggregator.
  static constexpr int kProbes = 2;
  void retransmit(uint64_t now) {
    if (now >= rack_deadline) detect_losses(now);
    if (now < timer_at()) return;
    Pkt* probe[kProbes] = {};
    for (uint64_t s = base; s < sent_end; ++s) {
      Pkt& k = ring[s % S];
      if (k.done) continue;
      if (static_cast<double>(now - k.first_send) > opt.max_wait_ms * 1000.0) {
        std::string why = where() + ": timeout: no result for packet seq " + std::to_string(k.seq) + " (op " +
                          std::to_string(k.op->id) + ", slot " + std::to_string(k.seq % S) + ") after " +
                          std::to_string(k.sends) + " transmissions over " + std::to_string((now - k.first_send) / 1000) +
                          " ms; a worker of the job may have died (without a quorum the job waits for every "
                          "worker), or the aggregator is unreachable or restarted";
        why += last_error();
        if (data_plane)
          why += "; the aggregator is a switch data plane, which drops what it refuses without an error (see the "
                 "data plane's drop counters in thc-switchd's STATS)";
        die(Status::kTimeout, why);
      }
      for (Pkt*& p : probe)
        if (!p) {
          p = &k;
          break;
        }
    }
    book_sleeps(true);
    for (Pkt* p : probe)
      if (p) {
        resend(*p, now);
        st.timeouts++;
      }
    if (++backoff >= 3) on_persistent_loss(now);
    timer_ref = now;
  }

  // One nonblocking round: receive, retransmit, send what the window and pacing allow.
  void progress() {
    check_broken();
    receive_all();
    const uint64_t now = mono_us();
    pump_faults(now);
    retransmit(now);
    send_new(now);
    ch->flush();
  }

  // When this instance next needs attention (retransmission, pacing, fault release).
  uint64_t next_due(uint64_t now) const {
    uint64_t due = std::min({timer_at(), rack_deadline, next_send_time(now)});
    due = std::min(due, std::min(tx_fault.next_due(), rx_fault.next_due()));
    return due;
  }

  // Block until pred() or a fatal error.
  template <typename Pred>
  void wait_until(Pred pred) {
    const uint64_t t0 = mono_us();
    for (;;) {
      progress();
      if (pred()) break;
      const uint64_t now = mono_us();
      const uint64_t due = std::min(next_due(now), now + 20'000);
      if (ch->pending()) continue;
      sleep_until(now, due);
    }
    book_sleeps(false);
    st.wait_us += mono_us() - t0;
  }
  // Sleeps until due or a datagram arrives, noting what held sending back meanwhile.
  void sleep_until(uint64_t now, uint64_t due) {
    int why = 2;
    if (sent_end < next_seq) {
      if (sent_end >= base + S) why = 1;
      else if (inflight >= static_cast<uint64_t>(std::max(1.0, std::floor(cwnd)))) why = 0;
    }
    ch->wait_us(due <= now ? 0 : due - now);
    pend_sleep[why] += mono_us() - now;
  }
  void book_sleeps(bool timeout) {
    if (timeout) {
      st.rto_wait_us += pend_sleep[0] + pend_sleep[1] + pend_sleep[2];
    } else {
      st.cwnd_wait_us += pend_sleep[0];
      st.slots_wait_us += pend_sleep[1];
    }
    pend_sleep[0] = pend_sleep[1] = pend_sleep[2] = 0;
  }

  // ---- control round trips ------------------------------------------------------------------

  // Send a control message until a reply with its nonce arrives; returns the reply header
  // (payload in ctl_payload). Data progress continues meanwhile. The JOIN path takes any of its
  // reply types (CHALLENGE or JOIN_ACK).
  proto::Header control(proto::MsgType type, const std::vector<uint8_t>& body, const auth::TagKey& key,
                        double max_wait_ms) {
    check_broken();
    ++ctl_nonce;
    ctl_have = false;
    ctl_pending = true;
    proto::Header h;
    h.type = type;
    h.job = job;
    h.shard = opt.shard;
    h.worker = static_cast<uint16_t>(opt.rank);
    h.nworkers = static_cast<uint16_t>(opt.world);
    h.seq = ctl_nonce;
    std::vector<uint8_t> pkt(proto::kHeaderBytes + body.size());
    proto::write_header(h, pkt.data(), pkt.size());
    std::copy(body.begin(), body.end(), pkt.begin() + proto::kHeaderBytes);
    auth::sign(key, pkt.data(), pkt.size());
    const uint64_t start = mono_us();
    double rto = std::max(opt.rto_initial_ms, 1.0) * 1000.0;
    uint64_t next = start;
    int sends = 0;
    for (;;) {
      uint64_t now = mono_us();
      if (now >= next) {
        if (static_cast<double>(now - start) > max_wait_ms * 1000.0) {
          std::string why = where() + ": timeout: no reply to " + proto::msg_type_name(type) + " after " +
                            std::to_string(sends) + " transmissions over " + std::to_string((now - start) / 1000) +
                            " ms; is an aggregator (protocol version " + std::to_string(proto::kVersion) +
                            ") running at " + ch->peer() + ", and does it hold key id " + std::to_string(opt.key.id) +
                            "? (it drops what it cannot authenticate, silently)";
          why += last_error();
          die(Status::kTimeout, why);
        }
        send_dgram(pkt.data(), pkt.size());
        ++sends;
        next = now + static_cast<uint64_t>(rto);
        rto = std::min(rto * 2, opt.rto_max_ms * 1000.0 * 5);
      }
      progress();
      if (ctl_have) {
        ctl_pending = false;
        return ctl_hdr;
      }
      now = mono_us();
      const uint64_t due = std::min(next, next_due(now));
      if (!ch->pending()) {
        ch->wait_us(due <= now ? 0 : std::min<uint64_t>(due - now, 20'000));
        st.wait_us += mono_us() - now;
      }
    }
  }

  // A JOIN (handshake with the cookie). rejoin: ask where to resume; register_only: return once the
  // aggregator knows this worker wants back in (it then joins the view at the next call), even if
  // the resume point is not known yet.
  void join(bool rejoin, bool register_only = false) {
    const uint64_t start = mono_us();
    uint8_t cookie[proto::kCookieBytes] = {};
    bool busy = false;  // the aggregator answered "job busy": what the wait is for, if it runs out
    auto busy_msg = [&] {
      return where() + ": the job is busy: an earlier run of job label " + std::to_string(opt.job_label) +
             " still holds it at the aggregator (some of its workers have neither restarted nor left). It is "
             "replaced as soon as every worker of that run has restarted, freed when they all LEAVE, or after "
             "the aggregator's --job-idle-timeout (default 600 s) of silence; or use another job label";
    };
    for (;;) {
      proto::JoinBody b;
      std::memcpy(b.cookie, cookie, sizeof cookie);
      b.quorum = static_cast<uint16_t>(opt.quorum > 0 ? opt.quorum : opt.world);
      b.slots = static_cast<uint16_t>(std::clamp(opt.slots, 1, proto::kMaxSlots));
      b.quorum_timeout_us = opt.quorum_timeout_us;
      b.max_lanes = static_cast<uint16_t>(opt.max_lanes);
      b.payload_budget = static_cast<uint16_t>(budget_wanted());
      b.flags = rejoin ? proto::kJoinRejoin : 0;
      std::vector<uint8_t> body(proto::kJoinFixedBytes + proto::kTableHeaderBytes);
      body.resize(proto::write_join(b, body.data(), body.size()));
      const double left = opt.max_wait_ms - static_cast<double>(mono_us() - start) / 1000.0;
      if (left <= 0)
        die(Status::kTimeout, busy ? busy_msg() : where() + ": timeout: could not (re)join the job within max_wait_ms");
      const proto::Header r = control(proto::MsgType::kJoin, body, jkey, left);
      if (r.type == proto::MsgType::kChallenge) {
        std::memcpy(cookie, ctl_payload.data(), sizeof cookie);
        continue;
      }
      if (r.type == proto::MsgType::kError) {
        // Job busy: this worker restarted while the job's earlier run holds the job instance. It is
        // replaced once every worker of that run has come back (a run restarted after a crash starts
        // one worker at a time), so ask again shortly, within max_wait_ms.
        busy = true;
        if (static_cast<double>(mono_us() - start) / 1000.0 + 50 >= opt.max_wait_ms) die(Status::kTimeout, busy_msg());
        const uint64_t t0 = mono_us();
        while (mono_us() - t0 < 50'000) {
          progress();
          ch->wait_us(5'000);
        }
        continue;
      }
      if (r.type != proto::MsgType::kJoinAck) die(Status::kTransport, where() + ": unexpected reply to JOIN");
      proto::JoinAckBody a;
      if (proto::parse_join_ack(ctl_payload.data(), ctl_payload.size(), &a) != proto::ParseError::kOk)
        die(Status::kTransport, where() + ": malformed JOIN_ACK");
      if (a.nworkers != opt.world || a.quorum != b.quorum)
        die(Status::kConfigMismatch, where() + ": the job has " + std::to_string(a.nworkers) + " workers, quorum " +
                                         std::to_string(a.quorum) + "; this worker asked for " +
                                         std::to_string(opt.world) + ", quorum " + std::to_string(b.quorum));
      if (rejoin && !(a.resume_flags & proto::kResumeKnown)) {
        rejoin_registered = true;
        if (register_only) return;
        // The job's next call has not started yet: ask again shortly (its first packet tells the
        // aggregator where it starts). The cookie stays valid.
        const uint64_t t0 = mono_us();
        while (mono_us() - t0 < 1000) {
          progress();
          ch->wait_us(200);
        }
        continue;
      }
      const bool fresh = seed == 0;
      if (!fresh && a.seed != seed)
        die(Status::kTransport, where() + ": the aggregator restarted the job (new seed) while this worker was away");
      seed = a.seed;
      dkey = auth::data_key(opt.key, job, seed);
      L = a.max_lanes;
      budget = a.payload_budget;
      shards = a.shards;
      data_plane = (a.resume_flags & proto::kAckDataPlane) != 0;
      if (fresh) {
        S = a.slots;
        max_dgram = proto::kHeaderBytes + static_cast<size_t>(budget);
        ring.assign(S, Pkt{});
        arena.assign(static_cast<size_t>(S) * max_dgram, 0);
        cwnd = std::min<double>(opt.window_init, S);
        clamp_cwnd();
      }
      if (rejoin) {
        next_op = a.resume_op;
        next_seq = a.resume_seq;
        base = sent_end = next_seq;
        reset_flight();
        for (TableEntry& t : tables) t = TableEntry{};  // reinstall on use
        st.rejoins++;
        need_rejoin = false;
        rejoin_registered = false;
      }
      return;
    }
  }

  int budget_wanted() const {
    const int path = ch->payload_budget();
    const int want = opt.payload_budget > 0 ? std::min(opt.payload_budget, path) : path;
    return std::clamp(want, proto::kLaneQuantum / 2, proto::kMaxPayloadBudget);
  }

  // Table id for (table, sum type), installing it on first use.
  uint8_t table_for(const LookupTable& t, proto::WireInt sum) {
    const size_t entries = size_t{1} << t.bits;
    ++table_clock;
    for (int i = 0; i < proto::kTableIds; ++i) {
      TableEntry& e = tables[i];
      if (e.valid && e.bits == t.bits && e.sum == sum && std::equal(e.values.begin(), e.values.end(), t.values.begin())) {
        e.last_use = table_clock;
        return static_cast<uint8_t>(i);
      }
    }
    int id = -1;
    for (int i = 0; i < proto::kTableIds && id < 0; ++i)
      if (!tables[i].valid) id = i;
    if (id < 0) {
      id = 0;
      for (int i = 1; i < proto::kTableIds; ++i)
        if (tables[i].last_use < tables[id].last_use) id = i;
      // Recycling an id: our earlier requests must be complete, so every slot that could still
      // look the old table up is Done (every worker's ops precede ours in the same order).
      wait_until([&] { return base == next_seq; });
    }
    proto::TableSpec spec;
    spec.id = static_cast<uint8_t>(id);
    spec.bits = static_cast<uint8_t>(t.bits);
    spec.sum = sum;
    std::copy(t.values.begin(), t.values.begin() + static_cast<std::ptrdiff_t>(entries), spec.values);
    std::vector<uint8_t> body(proto::kTableHeaderBytes + 4 * proto::kMaxTableEntries);
    body.resize(proto::write_table(spec, body.data(), body.size()));
    control(proto::MsgType::kTable, body, dkey, opt.max_wait_ms);
    TableEntry& e = tables[id];
    e.valid = true;
    e.bits = t.bits;
    e.sum = sum;
    e.values.assign(t.values.begin(), t.values.begin() + static_cast<std::ptrdiff_t>(entries));
    e.last_use = table_clock;
    return static_cast<uint8_t>(id);
  }

  void before_enqueue() {
    check_broken();
    if (need_rejoin) join(true);
  }
  // Left behind: tell the aggregator at once that this worker wants back in, so that the job's
  // next call waits for it (up to the quorum timeout) rather than racing it.
  void register_rejoin() {
    if (!need_rejoin || rejoin_registered || broken) return;
    try {
      join(true, true);
    } catch (const Error&) {
      // The next call tries again (and reports what fails).
    }
  }

  std::shared_ptr<Op> enqueue(std::shared_ptr<Op> op) {
    op->type = op->kind == Kind::kMax ? proto::MsgType::kDataMax
               : op->kind == Kind::kSum ? proto::MsgType::kDataValue
                                        : proto::MsgType::kDataIndex;
    op->lanes = proto::lanes_for(op->type, op->enc, op->bits, L, budget);
    if (op->lanes < proto::kLaneQuantum)
      die(Status::kInvalidArgument, where() + ": the job's payload budget (" + std::to_string(budget) +
                                        " bytes) cannot carry 64 lanes of this encoding");
    op->id = next_op++;
    op->first_seq = next_seq;
    op->npkts = (op->count + static_cast<uint64_t>(op->lanes) - 1) / static_cast<uint64_t>(op->lanes);
    next_seq += op->npkts;
    if (op->npkts > 0) ops.push_back(op);
    send_new(mono_us());
    ch->flush();
    return op;
  }

  void leave() {
    if (!ch || broken || seed == 0) return;
    try {
      // Give queued operations of dropped requests a bounded chance to finish first.
      const uint64_t t0 = mono_us();
      while (base < next_seq && mono_us() - t0 < 200'000) {
        progress();
        ch->wait_us(1000);
      }
      control(proto::MsgType::kLeave, {}, dkey, std::min(opt.max_wait_ms, 500.0));
    } catch (const Error&) {
      // Best effort: an unreachable aggregator expires the job by idleness.
    }
  }
};

namespace {

class UdpRequest final : public Request {
 public:
  UdpRequest(UdpReducer::Impl* impl, std::shared_ptr<Op> op) : impl_(impl), op_(std::move(op)) {}
  ~UdpRequest() override {
    // Never blocks: the other workers still need this worker's packets, so an unfinished
    // operation keeps going on copies of its buffers, driven by later calls.
    Op& op = *op_;
    if (op.complete() || impl_->broken) return;
    const size_t w = proto::wire_int_bytes(op.enc);
    if (op.kind == Kind::kLookup) {
      op.owned_in.assign(op.packed, op.packed + (op.count * static_cast<uint64_t>(op.bits) + 7) / 8);
      op.packed = op.owned_in.data();
      op.owned_out.assign(op.count * w, 0);
      op.data = op.owned_out.data();
    } else {
      const size_t bytes = op.count * (op.kind == Kind::kMax ? 4 : w);
      const uint8_t* d = static_cast<const uint8_t*>(op.data);
      op.owned_in.assign(d, d + bytes);
      op.data = op.owned_in.data();
    }
  }
  bool test() override {
    if (!op_->complete()) impl_->progress();
    return op_->complete();
  }
  void wait() override {
    if (!op_->complete()) impl_->wait_until([&] { return op_->complete(); });
    if (op_->failed == Status::kLeftBehind) impl_->register_rejoin();
    if (op_->failed != Status::kSuccess) fail(op_->failed, op_->fail_msg);
    if (op_->inconsistent)
      fail(Status::kTimeout, impl_->where() + ": a worker of the job stopped in the middle of op " +
                                 std::to_string(op_->id) +
                                 " (its packets carry different contributor sets): this call's result is incomplete "
                                 "and was not used; the job goes on without that worker");
  }
  int contributors() const override {
    return op_->npkts == 0 ? impl_->opt.world : __builtin_popcountll(op_->bitmap);
  }
  bool self_counted() const override { return op_->npkts == 0 || ((op_->bitmap >> impl_->opt.rank) & 1) != 0; }

 private:
  UdpReducer::Impl* impl_;
  std::shared_ptr<Op> op_;
};

}  // namespace

UdpReducer::UdpReducer(const UdpClientOptions& o, std::unique_ptr<DatagramChannel> channel)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.opt = o;
  UdpClientOptions& opt = m.opt;
  if (opt.world < 1 || opt.world > proto::kMaxWorkers)
    fail(Status::kInvalidArgument, "aggregator client: world size " + std::to_string(opt.world) + " outside 1..64");
  if (opt.rank < 0 || opt.rank >= opt.world)
    fail(Status::kInvalidArgument, "aggregator client: rank " + std::to_string(opt.rank) + " outside 0.." +
                                       std::to_string(opt.world - 1));
  if (opt.quorum < 0 || opt.quorum > opt.world)
    fail(Status::kInvalidArgument, "aggregator client: quorum " + std::to_string(opt.quorum) + " outside 0..world");
  if (opt.key.id == auth::kOperatorKeyId)
    fail(Status::kInvalidArgument, "aggregator client: no tenant key (THC_AGGREGATOR_KEY or THC_AGGREGATOR_KEY_FILE; "
                                   "key id 0 is the operator's and creates no jobs)");
  if (opt.window_init < 1 || opt.window_min < 1 || opt.slots < 1)
    fail(Status::kInvalidArgument, "aggregator client: window_init, window_min and slots must be >= 1");
  if (opt.max_lanes < proto::kLaneQuantum || opt.max_lanes > proto::kMaxLanes)
    fail(Status::kInvalidArgument, "aggregator client: max_lanes must be 64..8192");
  if (!(opt.rto_initial_ms > 0) || !(opt.rto_min_ms > 0) || !(opt.rto_max_ms >= opt.rto_min_ms) ||
      !(opt.max_wait_ms > 0) || !(opt.target_delay_ms > 0) || !(opt.loss_tolerance > 0 && opt.loss_tolerance <= 1))
    fail(Status::kInvalidArgument,
         "aggregator client: need rto_initial_ms > 0, rto_min_ms > 0, rto_max_ms >= rto_min_ms, max_wait_ms > 0, "
         "target_delay_ms > 0, 0 < loss_tolerance <= 1");
  if (opt.fault_from_env) {
    std::string bad;
    if (!fault_options_from_env(&opt.fault, &bad))
      fail(Status::kInvalidArgument,
           "aggregator client: environment variable " + bad + " is malformed (probabilities 0..1, integers)");
  }
  m.all = opt.world >= 64 ? ~uint64_t{0} : (uint64_t{1} << opt.world) - 1;
  const uint64_t stream = static_cast<uint64_t>(opt.rank) * 2 + static_cast<uint64_t>(opt.shard) * 1024;
  m.tx_fault = FaultInjector(opt.fault, 1000 + stream);
  m.rx_fault = FaultInjector(opt.fault, 1001 + stream);
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  m.ctl_nonce = static_cast<uint64_t>(now.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(now.tv_nsec);
  m.job = proto::make_job_id(opt.key.id, opt.job_label);
  m.jkey = auth::join_key(opt.key, m.job);
  m.ch = channel ? std::move(channel) : make_udp_channel(opt.address);
  m.join(false);
}

UdpReducer::~UdpReducer() {
  if (!impl_) return;
  impl_->leave();
}

std::string UdpReducer::name() const { return impl_->ch->kind(); }
int UdpReducer::rank() const { return impl_->opt.rank; }
int UdpReducer::size() const { return impl_->opt.world; }
uint64_t UdpReducer::shared_seed() const { return impl_->seed; }
int UdpReducer::slots() const { return static_cast<int>(impl_->S); }
int UdpReducer::shards_offered() const { return impl_->shards; }

UdpClientStats UdpReducer::stats() const {
  UdpClientStats s = impl_->st;
  s.min_rtt_us = impl_->min_rtt;
  s.srtt_us = impl_->srtt;
  s.cwnd = impl_->cwnd;
  s.cwnd_mean = s.results ? impl_->cwnd_sum / static_cast<double>(s.results) : 0;
  s.lanes = proto::lanes_for(proto::MsgType::kDataIndex, proto::WireInt::kU8, 4, impl_->L, impl_->budget);
  return s;
}

std::string UdpReducer::wire_stats() const {
  const UdpClientStats s = stats();
  char buf[640];
  auto u = [](uint64_t v) { return static_cast<unsigned long long>(v); };
  std::snprintf(buf, sizeof buf,
                "packets=%llu retransmissions=%llu (%.2f%%) fast=%llu timeouts=%llu lanes=%d cwnd=%.0f "
                "cwnd_mean=%.1f cwnd_min=%.1f loss_cuts=%llu delay_cuts=%llu collapses=%llu srtt=%.0fus min_rtt=%.0fus "
                "wait_ms=%.1f rto_wait_ms=%.1f cwnd_wait_ms=%.1f slots_wait_ms=%.1f results=%llu dup_results=%llu "
                "spurious=%llu not_counted=%llu left_behind=%llu",
                u(s.data_packets), u(s.retransmissions),
                s.data_packets ? 100.0 * static_cast<double>(s.retransmissions) / static_cast<double>(s.data_packets) : 0.0,
                u(s.fast_retransmits), u(s.timeouts), s.lanes, s.cwnd, s.cwnd_mean, s.cwnd_min, u(s.loss_cuts),
                u(s.delay_cuts), u(s.collapses), s.srtt_us, s.min_rtt_us, s.wait_us / 1e3, s.rto_wait_us / 1e3, s.cwnd_wait_us / 1e3,
                s.slots_wait_us / 1e3, u(s.results), u(s.duplicate_results), u(s.spurious), u(s.not_counted),
                u(s.left_behind));
  return buf;
}

bool UdpReducer::wire_counters(WireCounters* out) const {
  out->bytes_sent = impl_->st.bytes_sent;
  out->bytes_received = impl_->st.bytes_received;
  out->packets = impl_->st.data_packets;
  out->retransmissions = impl_->st.retransmissions;
  return true;
}

uint64_t InstanceView::next_due(UdpReducer& r, uint64_t now) { return r.impl().next_due(now); }
int InstanceView::fd(UdpReducer& r) { return r.impl().ch->poll_fd(); }
bool InstanceView::pending(UdpReducer& r) { return r.impl().ch->pending(); }
void InstanceView::progress(UdpReducer& r) { r.impl().progress(); }

void UdpReducer::max_u32(uint32_t* data, size_t n) {
  impl_->before_enqueue();
  auto op = std::make_shared<Op>();
  op->kind = Kind::kMax;
  op->count = n;
  op->enc = proto::WireInt::kU32;
  op->data = data;
  UdpRequest req(impl_.get(), impl_->enqueue(op));
  req.wait();
}

std::unique_ptr<Request> UdpReducer::start_sum(void* data, uint64_t count, IntType type) {
  impl_->before_enqueue();
  auto op = std::make_shared<Op>();
  op->kind = Kind::kSum;
  op->count = count;
  op->enc = wire_of(type);
  op->data = data;
  return std::make_unique<UdpRequest>(impl_.get(), impl_->enqueue(op));
}

std::unique_ptr<Request> UdpReducer::start_lookup_sum(const uint8_t* packed, uint64_t count, const LookupTable& table,
                                                      void* sums, IntType type, const DownstreamCodec* /*down*/) {
  impl_->before_enqueue();
  if (table.bits < 1 || table.bits > 8 || table.values.size() < (size_t{1} << table.bits))
    fail(Status::kInvalidArgument, "aggregator client: lookup table needs 1..8 bits and 2^bits values (got bits=" +
                                       std::to_string(table.bits) + ", " + std::to_string(table.values.size()) + " values)");
  const size_t w = proto::wire_int_bytes(wire_of(type));
  if (impl_->data_plane && ((table.bits != 1 && table.bits != 2 && table.bits != 4 && table.bits != 8) || w == 4)) {
    // A switch takes the index form for byte-aligned widths and 8/16-bit sums only (CONTRACT.md):
    // look the codes up here and send the values (Cnat's b = 5), summed in place in `sums`.
    auto* out = static_cast<uint8_t*>(sums);
    for (uint64_t i = 0; i < count; ++i) {
      const uint32_t v = static_cast<uint32_t>(table.values[proto::get_index(packed, i, table.bits)]);
      if (w == 1) {
        out[i] = static_cast<uint8_t>(v);
      } else if (w == 2) {
        const uint16_t x = static_cast<uint16_t>(v);
        std::memcpy(out + 2 * i, &x, 2);
      } else {
        std::memcpy(out + 4 * i, &v, 4);
      }
    }
    return start_sum(sums, count, type);
  }
  auto op = std::make_shared<Op>();
  op->kind = Kind::kLookup;
  op->count = count;
  op->enc = wire_of(type);
  op->bits = table.bits;
  op->packed = packed;
  op->data = sums;
  if (count > 0) op->table_id = impl_->table_for(table, op->enc);
  return std::make_unique<UdpRequest>(impl_.get(), impl_->enqueue(op));
}

// ---- the UDP socket channel -----------------------------------------------------------------

namespace {

// An on/off environment switch, on when unset.
bool env_switch(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v || std::strcmp(v, "1") == 0) return true;
  if (std::strcmp(v, "0") == 0) return false;
  fail(Status::kInvalidArgument, std::string(name) + "='" + v + "': expected 0 or 1");
}

class UdpChannel final : public DatagramChannel {
 public:
  explicit UdpChannel(const std::string& address) {
    std::string host, err;
    uint16_t port = 0;
    if (!parse_udp_url(address, &host, &port, &err)) fail(Status::kInvalidArgument, "udp client: " + err);
    if (!resolve_udp(host, port, &agg_, &err)) fail(Status::kInvalidArgument, "udp client: " + err);
    fd_ = open_udp_socket(agg_, 8 << 20);
    const sys::SysResult r = THC_SYS(::connect(fd_, reinterpret_cast<const sockaddr*>(&agg_.ss), agg_.len));
    if (!r.ok()) {
      ::close(fd_);
      r.fail(Status::kTransport);
    }
    // THC_AGG_UDP_GSO=0 / THC_AGG_UDP_GRO=0 turn the offloads off (a path that mishandles them);
    // where the kernel refuses them the channel sends and receives one datagram per message.
    const bool want_gso = env_switch("THC_AGG_UDP_GSO"), want_gro = env_switch("THC_AGG_UDP_GRO");
    io_ = std::make_unique<UdpBatch>(fd_, true, want_gso, want_gro);
    if ((want_gso && !io_->gso()) || (want_gro && !io_->gro())) {
      if (const char* d = std::getenv("THC_DEBUG"); d && *d && std::strcmp(d, "0") != 0)
        std::fprintf(stderr, "thc: udp client to %s: the kernel refused%s%s; one datagram per message\n",
                     agg_.str().c_str(), want_gso && !io_->gso() ? " UDP_SEGMENT (GSO)" : "",
                     want_gro && !io_->gro() ? " UDP_GRO" : "");
    }
    // The path MTU the kernel knows for this destination (the route's or the interface's).
    int mtu = 0;
    socklen_t len = sizeof mtu;
    const bool v6 = agg_.ss.ss_family == AF_INET6;
    if (THC_SYS(::getsockopt(fd_, v6 ? IPPROTO_IPV6 : IPPROTO_IP, v6 ? IPV6_MTU : IP_MTU, &mtu, &len)).ok() && mtu >= 576)
      budget_ = mtu - (v6 ? 40 : 20) - 8 - static_cast<int>(proto::kHeaderBytes);
    else
      budget_ = proto::kPayloadBudget1500;
  }
  ~UdpChannel() override {
    flush();
    ::close(fd_);
  }
  void send(const uint8_t* p, size_t n) override {
    io_->queue(agg_, p, n);
    if (io_->queued() >= 256) flush();
  }
  void flush() override { io_->flush(); }
  size_t recv(uint8_t* buf, size_t cap) override {
    flush();
    if (next_ >= in_.size()) {
      next_ = 0;
      if (io_->recv_batch(&in_, 256) == 0) return 0;
    }
    const UdpBatch::Datagram& d = in_[next_++];
    const size_t n = std::min(cap, d.len);
    std::memcpy(buf, d.data, n);
    return n;
  }
  bool pending() const override { return next_ < in_.size(); }
  void wait_us(uint64_t timeout_us) override {
    flush();
    if (pending()) return;
    pollfd pfd{fd_, POLLIN, 0};
    timespec ts{static_cast<time_t>(timeout_us / 1'000'000), static_cast<long>((timeout_us % 1'000'000) * 1000)};
    (void)THC_SYS(::ppoll(&pfd, 1, &ts, nullptr));
  }
  int poll_fd() const override { return fd_; }
  int payload_budget() const override { return budget_; }
  std::string kind() const override { return "udp"; }
  std::string peer() const override { return agg_.str(); }
  std::string last_error() const override {
    const int e = io_->stats().last_errno;
    return e ? std::strerror(e) : std::string();
  }

 private:
  PeerAddr agg_;
  int fd_ = -1;
  int budget_ = proto::kPayloadBudget1500;
  std::unique_ptr<UdpBatch> io_;
  std::vector<UdpBatch::Datagram> in_;
  size_t next_ = 0;
};

}  // namespace

std::unique_ptr<DatagramChannel> make_udp_channel(const std::string& address) {
  return std::make_unique<UdpChannel>(address);
}

auth::Key aggregator_key_from_env() {
  std::string err;
  auth::Key k;
  if (const char* v = std::getenv("THC_AGGREGATOR_KEY"); v && *v) {
    if (!auth::parse_key(v, &k, &err)) fail(Status::kInvalidArgument, "THC_AGGREGATOR_KEY: " + err);
    if (k.id == auth::kOperatorKeyId)
      fail(Status::kInvalidArgument, "THC_AGGREGATOR_KEY: key id 0 is the operator key; workers need a tenant key");
    return k;
  }
  if (const char* f = std::getenv("THC_AGGREGATOR_KEY_FILE"); f && *f) {
    std::vector<auth::Key> keys;
    if (!auth::load_key_file(f, &keys, &err)) fail(Status::kInvalidArgument, "THC_AGGREGATOR_KEY_FILE: " + err);
    for (const auth::Key& x : keys)
      if (x.id != auth::kOperatorKeyId) return x;
    fail(Status::kInvalidArgument, std::string("THC_AGGREGATOR_KEY_FILE: ") + f + " holds no tenant key (id != 0)");
  }
  fail(Status::kInvalidArgument,
       "no aggregator key: set THC_AGGREGATOR_KEY=ID:HEX or THC_AGGREGATOR_KEY_FILE=PATH (the tenant key the "
       "aggregator's --key-file holds)");
}

}  // namespace thc::transport
