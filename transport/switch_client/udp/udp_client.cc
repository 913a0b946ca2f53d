#include "transport/switch_client/udp/udp_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <vector>

#include "common/status.h"
#include "common/net.h"
#include "common/sys_check.h"
#include "switch_offload/protocol/wire.h"

namespace thc::transport {

namespace proto = switch_offload::proto;
using thc::FaultInjector;
using thc::mono_us;
using thc::PeerAddr;

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

// Host-order element i of a buffer of w-byte integers, as the low bits of a u32.
uint32_t host_get(const void* base, size_t w, uint64_t i) {
  const uint8_t* p = static_cast<const uint8_t*>(base) + i * w;
  if (w == 1) return *p;
  if (w == 2) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
void host_put(void* base, size_t w, uint64_t i, uint32_t v) {
  uint8_t* p = static_cast<uint8_t*>(base) + i * w;
  if (w == 1) {
    *p = static_cast<uint8_t>(v);
  } else if (w == 2) {
    const uint16_t x = static_cast<uint16_t>(v);
    std::memcpy(p, &x, 2);
  } else {
    std::memcpy(p, &v, 4);
  }
}

enum class Kind { kMax, kSum, kLookup };

struct Op {
  Kind kind = Kind::kSum;
  uint32_t id = 0;
  uint64_t count = 0;
  uint64_t first_seq = 0;
  uint64_t npkts = 0;
  proto::WireInt enc = proto::WireInt::kNone;  // sum type on the wire
  int bits = 0;
  uint8_t table_id = 0;
  const uint8_t* packed = nullptr;  // lookup: input indices
  void* data = nullptr;             // sum/max: input and output (in place); lookup: output
  uint64_t done = 0;
  bool have_bitmap = false;
  uint64_t bitmap = 0;
  bool inconsistent = false;
  bool complete() const { return done == npkts; }
};

struct Pkt {
  std::shared_ptr<Op> op;
  uint64_t seq = 0;
  uint64_t first_send = 0;
  uint64_t next_send = 0;
  double rto_us = 0;
  int sends = 0;
  bool done = false;
  std::vector<uint8_t> wire;
};

struct TableEntry {
  bool valid = false;
  int bits = 0;
  proto::WireInt sum = proto::WireInt::kNone;
  std::vector<int32_t> values;
  uint64_t last_use = 0;
};

}  // namespace

struct UdpReducer::Impl {
  UdpClientOptions opt;
  std::unique_ptr<DatagramChannel> ch;
  PeerAddr agg;  // the fault injectors' tag for the aggregator (unused otherwise)
  uint64_t seed = 0;
  uint32_t S = 0;
  uint32_t W = 0;
  uint64_t all = 0;
  FaultInjector tx_fault, rx_fault;
  UdpClientStats st;

  uint64_t next_seq = 0;   // next data packet sequence number to assign
  uint32_t next_op = 0;
  uint64_t base = 0;       // lowest seq without a result
  uint64_t sent_end = 0;   // seqs [base, sent_end) are in `window`
  std::deque<Pkt> window;
  std::deque<std::shared_ptr<Op>> ops;  // ops with packets not yet all sent or done

  TableEntry tables[proto::kTableIds];
  uint64_t table_clock = 0;

  // Control round trips (JOIN/TABLE/LEAVE) wait for a reply with their nonce.
  uint64_t ctl_nonce = 0;
  bool ctl_have = false;
  proto::Header ctl_hdr;
  std::vector<uint8_t> ctl_payload;

  bool broken = false;
  Status broken_status = Status::kSuccess;
  std::string broken_msg;

  std::vector<uint8_t> rbuf = std::vector<uint8_t>(proto::kMaxPacketBytes + 1);
  std::vector<FaultInjector::Datagram> fbuf;

  std::string where() const {
    return ch->kind() + " client (rank " + std::to_string(opt.rank) + ", job " + std::to_string(opt.job_id) + ", " +
           ch->peer() + ")";
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

  void raw_send(const uint8_t* p, size_t n) { ch->send(p, n); }
  void send_dgram(const uint8_t* p, size_t n) {
    st.packets_sent++;
    if (!tx_fault.active()) return raw_send(p, n);
    fbuf.clear();
    tx_fault.offer(p, n, agg, mono_us(), &fbuf);
    for (auto& d : fbuf) raw_send(d.bytes.data(), d.bytes.size());
  }
  void pump_faults(uint64_t now) {
    if (tx_fault.active()) {
      fbuf.clear();
      tx_fault.poll(now, &fbuf);
      for (auto& d : fbuf) raw_send(d.bytes.data(), d.bytes.size());
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

  void on_error(const proto::Header& h) {
    const auto code = static_cast<proto::ErrorCode>(h.aux);
    std::string what = std::string("aggregator rejected ") + (h.seq == ctl_nonce && h.op == 0 ? "a request" : "packet seq " + std::to_string(h.seq)) +
                       ": " + proto::error_code_name(code);
    Status s = Status::kTransport;
    switch (code) {
      case proto::ErrorCode::kBadToken: what += " (job id " + std::to_string(opt.job_id) + " belongs to a job with another token)"; break;
      case proto::ErrorCode::kUnknownJob: what += " (the aggregator restarted or expired the job)"; break;
      case proto::ErrorCode::kConfigMismatch:
        s = Status::kConfigMismatch;
        what += " (workers disagree on world size, quorum, quorum timeout, or on the operation sequence)";
        break;
      case proto::ErrorCode::kNoResources: what += " (aggregator --max-jobs/--max-memory reached)"; break;
      case proto::ErrorCode::kBadVersion: what += " (protocol version " + std::to_string(proto::kVersion) + " not spoken there)"; break;
      default: break;
    }
    die(s, where() + ": " + what);
  }

  void on_datagram(const uint8_t* p, size_t n) {
    proto::Header h;
    const uint8_t* pl = nullptr;
    size_t plen = 0;
    if (proto::parse(p, n, &h, &pl, &plen) != proto::ParseError::kOk || h.job != opt.job_id) {
      st.ignored++;
      return;
    }
    switch (h.type) {
      case proto::MsgType::kError:
        if (h.worker != opt.rank) break;
        return on_error(h);
      case proto::MsgType::kJoinAck:
      case proto::MsgType::kTableAck:
      case proto::MsgType::kLeaveAck:
        if (h.worker == opt.rank && h.seq == ctl_nonce && !ctl_have) {
          ctl_have = true;
          ctl_hdr = h;
          ctl_payload.assign(pl, pl + plen);
        }
        return;
      case proto::MsgType::kResult: return on_result(h, pl);
      case proto::MsgType::kAck:
        if (h.token == opt.token && h.worker == opt.rank && (h.flags & proto::kFlagNotCounted)) st.not_counted++;
        return;
      default: break;
    }
    st.ignored++;
  }

  void on_result(const proto::Header& h, const uint8_t* pl) {
    if (h.token != opt.token || h.worker != opt.rank || h.nworkers != opt.world) {
      st.ignored++;
      return;
    }
    if (h.seq < base || h.seq >= sent_end) {
      st.duplicate_results++;
      return;
    }
    Pkt& k = window[h.seq - base];
    if (k.done) {
      st.duplicate_results++;
      return;
    }
    Op& op = *k.op;
    const uint64_t idx = h.seq - op.first_seq;
    const uint64_t first = idx * proto::kLanes;
    const uint64_t cnt = std::min<uint64_t>(proto::kLanes, op.count - first);
    if (h.op != op.id || h.count != cnt || h.enc != op.enc) {
      st.ignored++;
      return;
    }
    const size_t w = proto::wire_int_bytes(op.enc);
    void* out = op.data;
    for (uint64_t i = 0; i < cnt; ++i) host_put(out, w, first + i, proto::load_lane(op.enc, pl, static_cast<int>(i)));
    if (!op.have_bitmap) {
      op.have_bitmap = true;
      op.bitmap = h.bitmap;
    } else if (op.bitmap != h.bitmap && op.kind != Kind::kMax) {
      op.inconsistent = true;
    }
    if (h.flags & proto::kFlagNotCounted) st.not_counted++;
    st.results++;
    k.done = true;
    op.done++;
    while (!window.empty() && window.front().done) {
      window.pop_front();
      ++base;
    }
    while (!ops.empty() && ops.front()->complete() && ops.front()->first_seq + ops.front()->npkts <= base) ops.pop_front();
  }

  // ---- outgoing ---------------------------------------------------------------------------------

  std::shared_ptr<Op> op_for_seq(uint64_t seq) {
    // Searched from the back: new packets belong to the newest ops.
    for (auto it = ops.rbegin(); it != ops.rend(); ++it)
      if (seq >= (*it)->first_seq && seq < (*it)->first_seq + (*it)->npkts) return *it;
    return nullptr;
  }

  void build(Pkt& k) {
    Op& op = *k.op;
    const uint64_t idx = k.seq - op.first_seq;
    const uint64_t first = idx * proto::kLanes;
    const uint64_t cnt = std::min<uint64_t>(proto::kLanes, op.count - first);
    proto::Header h;
    h.type = op.kind == Kind::kMax ? proto::MsgType::kDataMax
             : op.kind == Kind::kSum ? proto::MsgType::kDataValue
                                     : proto::MsgType::kDataIndex;
    h.job = opt.job_id;
    h.worker = static_cast<uint16_t>(opt.rank);
    h.nworkers = static_cast<uint16_t>(opt.world);
    h.slot = static_cast<uint16_t>(k.seq % S);
    h.shadow = static_cast<uint8_t>((k.seq / S) & 1);
    h.enc = op.enc;
    h.bits = static_cast<uint8_t>(op.kind == Kind::kLookup ? op.bits : 0);
    h.count = static_cast<uint16_t>(cnt);
    h.token = opt.token;
    h.seq = k.seq;
    h.op = op.id;
    h.aux = op.kind == Kind::kLookup ? op.table_id : 0;
    const size_t plen = proto::data_payload_bytes(h.type, h.enc, h.bits);
    k.wire.assign(proto::kHeaderBytes + plen, 0);
    proto::write_header(h, k.wire.data(), k.wire.size());
    uint8_t* pl = k.wire.data() + proto::kHeaderBytes;
    if (op.kind == Kind::kLookup) {
      proto::copy_indices(op.packed, first, cnt, op.bits, pl);
    } else {
      const size_t w = proto::wire_int_bytes(op.enc);
      for (uint64_t i = 0; i < cnt; ++i) proto::store_lane(op.enc, pl, static_cast<int>(i), host_get(op.data, w, first + i));
    }
  }

  void send_new(uint64_t now) {
    while (sent_end < next_seq && sent_end < base + W) {
      Pkt k;
      k.seq = sent_end;
      k.op = op_for_seq(k.seq);
      if (!k.op) die(Status::kInternal, where() + ": no operation for packet seq " + std::to_string(k.seq));
      build(k);
      k.first_send = now;
      k.rto_us = opt.rto_initial_ms * 1000.0;
      k.next_send = now + static_cast<uint64_t>(k.rto_us);
      k.sends = 1;
      send_dgram(k.wire.data(), k.wire.size());
      window.push_back(std::move(k));
      ++sent_end;
    }
  }

  void retransmit(uint64_t now) {
    for (Pkt& k : window) {
      if (k.done || k.next_send > now) continue;
      if (static_cast<double>(now - k.first_send) > opt.max_wait_ms * 1000.0) {
        std::string why = where() + ": timeout: no result for packet seq " + std::to_string(k.seq) + " (op " +
                          std::to_string(k.op->id) + ", slot " + std::to_string(k.seq % S) + ") after " +
                          std::to_string(k.sends) + " transmissions over " + std::to_string((now - k.first_send) / 1000) +
                          " ms; a worker of the job may have died or the aggregator is unreachable";
        why += last_error();
        die(Status::kTimeout, why);
      }
      const uint16_t flags = static_cast<uint16_t>(proto::load_be16(k.wire.data() + 6) | proto::kFlagRetransmit);
      proto::store_be16(k.wire.data() + 6, flags);
      send_dgram(k.wire.data(), k.wire.size());
      st.retransmissions++;
      k.sends++;
      k.rto_us = std::min(k.rto_us * opt.rto_backoff, opt.rto_max_ms * 1000.0);
      k.next_send = now + static_cast<uint64_t>(k.rto_us);
    }
  }

  // One nonblocking round: receive, retransmit, send what the window allows.
  void progress() {
    check_broken();
    receive_all();
    const uint64_t now = mono_us();
    pump_faults(now);
    retransmit(now);
    send_new(now);
  }

  // Block until pred() or a fatal error; poll() sleeps until the next retransmission is due.
  template <typename Pred>
  void wait_until(Pred pred) {
    for (;;) {
      progress();
      if (pred()) return;
      const uint64_t now = mono_us();
      uint64_t due = now + 20'000;
      for (const Pkt& k : window)
        if (!k.done) due = std::min(due, k.next_send);
      due = std::min(due, std::min(tx_fault.next_due(), rx_fault.next_due()));
      const int ms = due <= now ? 0 : static_cast<int>((due - now + 999) / 1000);
      ch->wait(ms);
    }
  }

  // ---- control round trips ------------------------------------------------------------------

  // Send a control message until its reply arrives; returns the reply header (payload in
  // ctl_payload). Data progress continues meanwhile.
  proto::Header control(proto::MsgType type, const std::vector<uint8_t>& body, proto::MsgType want, double max_wait_ms) {
    check_broken();
    ++ctl_nonce;
    ctl_have = false;
    proto::Header h;
    h.type = type;
    h.job = opt.job_id;
    h.worker = static_cast<uint16_t>(opt.rank);
    h.nworkers = static_cast<uint16_t>(opt.world);
    h.token = opt.token;
    h.seq = ctl_nonce;
    std::vector<uint8_t> pkt(proto::kHeaderBytes + body.size());
    proto::write_header(h, pkt.data(), pkt.size());
    std::copy(body.begin(), body.end(), pkt.begin() + proto::kHeaderBytes);
    const uint64_t start = mono_us();
    double rto = opt.rto_initial_ms * 1000.0;
    uint64_t next = start;
    int sends = 0;
    for (;;) {
      uint64_t now = mono_us();
      if (now >= next) {
        if (static_cast<double>(now - start) > max_wait_ms * 1000.0) {
          std::string why = where() + ": timeout: no reply to " + proto::msg_type_name(type) + " after " +
                            std::to_string(sends) + " transmissions over " + std::to_string((now - start) / 1000) +
                            " ms; is thc-aggregator running at " + ch->peer() + "?";
          why += last_error();
          die(Status::kTimeout, why);
        }
        send_dgram(pkt.data(), pkt.size());
        ++sends;
        next = now + static_cast<uint64_t>(rto);
        rto = std::min(rto * opt.rto_backoff, opt.rto_max_ms * 1000.0);
      }
      progress();
      if (ctl_have) {
        if (ctl_hdr.type != want) die(Status::kInternal, where() + ": unexpected reply type to " + proto::msg_type_name(type));
        return ctl_hdr;
      }
      now = mono_us();
      const uint64_t due = std::min(next, std::min(tx_fault.next_due(), rx_fault.next_due()));
      const int ms = due <= now ? 0 : static_cast<int>(std::min<uint64_t>((due - now + 999) / 1000, 20));
      ch->wait(ms);
    }
  }

  void join() {
    proto::JoinBody b;
    b.quorum = static_cast<uint16_t>(opt.quorum > 0 ? opt.quorum : opt.world);
    b.slots = static_cast<uint16_t>(std::min(opt.window, proto::kMaxSlots));
    b.quorum_timeout_us = opt.quorum_timeout_us;
    std::vector<uint8_t> body(proto::kMaxPacketBytes);
    body.resize(proto::write_join(b, body.data(), body.size()));
    control(proto::MsgType::kJoin, body, proto::MsgType::kJoinAck, opt.max_wait_ms);
    proto::JoinAckBody a;
    if (proto::parse_join_ack(ctl_payload.data(), ctl_payload.size(), &a) != proto::ParseError::kOk)
      die(Status::kTransport, where() + ": malformed JOIN_ACK");
    if (a.nworkers != opt.world || a.quorum != b.quorum)
      die(Status::kConfigMismatch, where() + ": the job has " + std::to_string(a.nworkers) + " workers, quorum " +
                                       std::to_string(a.quorum) + "; this worker asked for " + std::to_string(opt.world) +
                                       ", quorum " + std::to_string(b.quorum));
    seed = a.seed;
    S = a.slots;
    W = std::min<uint32_t>(S, static_cast<uint32_t>(opt.window));
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
      wait_until([&] { return window.empty() && sent_end == next_seq; });
    }
    proto::TableSpec spec;
    spec.id = static_cast<uint8_t>(id);
    spec.bits = static_cast<uint8_t>(t.bits);
    spec.sum = sum;
    std::copy(t.values.begin(), t.values.begin() + static_cast<std::ptrdiff_t>(entries), spec.values);
    std::vector<uint8_t> body(proto::kMaxPacketBytes);
    body.resize(proto::write_table(spec, body.data(), body.size()));
    control(proto::MsgType::kTable, body, proto::MsgType::kTableAck, opt.max_wait_ms);
    TableEntry& e = tables[id];
    e.valid = true;
    e.bits = t.bits;
    e.sum = sum;
    e.values.assign(t.values.begin(), t.values.begin() + static_cast<std::ptrdiff_t>(entries));
    e.last_use = table_clock;
    return static_cast<uint8_t>(id);
  }

  std::shared_ptr<Op> enqueue(std::shared_ptr<Op> op) {
    op->id = next_op++;
    op->first_seq = next_seq;
    op->npkts = (op->count + proto::kLanes - 1) / proto::kLanes;
    next_seq += op->npkts;
    if (op->npkts > 0) ops.push_back(op);
    send_new(mono_us());
    return op;
  }

  void leave() {
    if (!ch || broken) return;
    try {
      control(proto::MsgType::kLeave, {}, proto::MsgType::kLeaveAck, std::min(opt.max_wait_ms, 500.0));
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
    // The other workers need this worker's packets: finish the operation even if nobody waits
    // (error paths), unless the client is already broken.
    if (!op_->complete() && !impl_->broken) {
      try {
        wait();
      } catch (...) {
      }
    }
  }
  bool test() override {
    if (!op_->complete()) impl_->progress();
    return op_->complete();
  }
  void wait() override {
    if (!op_->complete()) impl_->wait_until([&] { return op_->complete(); });
    if (op_->inconsistent)
      fail(Status::kInternal, impl_->where() + ": packets of op " + std::to_string(op_->id) +
                                  " carry different contributor sets (aggregator bug)");
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
    fail(Status::kInvalidArgument, "udp client: world size " + std::to_string(opt.world) + " outside 1..64");
  if (opt.rank < 0 || opt.rank >= opt.world)
    fail(Status::kInvalidArgument, "udp client: rank " + std::to_string(opt.rank) + " outside 0.." + std::to_string(opt.world - 1));
  if (opt.quorum < 0 || opt.quorum > opt.world)
    fail(Status::kInvalidArgument, "udp client: quorum " + std::to_string(opt.quorum) + " outside 0..world");
  if (opt.window < 1) fail(Status::kInvalidArgument, "udp client: window must be >= 1");
  if (!(opt.rto_initial_ms > 0) || !(opt.rto_backoff >= 1) || !(opt.rto_max_ms >= opt.rto_initial_ms) || !(opt.max_wait_ms > 0))
    fail(Status::kInvalidArgument, "udp client: need rto_initial_ms > 0, rto_backoff >= 1, rto_max_ms >= rto_initial_ms, max_wait_ms > 0");
  if (opt.fault_from_env) {
    std::string bad;
    if (!thc::fault_options_from_env(&opt.fault, &bad))
      fail(Status::kInvalidArgument, "udp client: environment variable " + bad + " is malformed (probabilities 0..1, integers)");
  }
  m.all = opt.world >= 64 ? ~uint64_t{0} : (uint64_t{1} << opt.world) - 1;
  const uint64_t stream = static_cast<uint64_t>(opt.rank) * 2;
  m.tx_fault = FaultInjector(opt.fault, 1000 + stream);
  m.rx_fault = FaultInjector(opt.fault, 1001 + stream);
  m.ch = channel ? std::move(channel) : make_udp_channel(opt.address);
  m.join();
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
UdpClientStats UdpReducer::stats() const { return impl_->st; }

void UdpReducer::max_u32(uint32_t* data, size_t n) {
  auto op = std::make_shared<Op>();
  op->kind = Kind::kMax;
  op->count = n;
  op->enc = proto::WireInt::kU32;
  op->data = data;
  UdpRequest req(impl_.get(), impl_->enqueue(op));
  req.wait();
}

std::unique_ptr<Request> UdpReducer::start_sum(void* data, uint64_t count, IntType type) {
  impl_->check_broken();
  auto op = std::make_shared<Op>();
  op->kind = Kind::kSum;
  op->count = count;
  op->enc = wire_of(type);
  op->data = data;
  return std::make_unique<UdpRequest>(impl_.get(), impl_->enqueue(op));
}

std::unique_ptr<Request> UdpReducer::start_lookup_sum(const uint8_t* packed, uint64_t count, const LookupTable& table,
                                                      void* sums, IntType type, const DownstreamCodec* /*down*/) {
  impl_->check_broken();
  if (table.bits < 1 || table.bits > 8 || table.values.size() < (size_t{1} << table.bits))
    fail(Status::kInvalidArgument, "udp client: lookup table needs 1..8 bits and 2^bits values (got bits=" +
                                       std::to_string(table.bits) + ", " + std::to_string(table.values.size()) + " values)");
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

std::unique_ptr<Reducer> make_udp_client(const UdpClientOptions& opt) { return std::make_unique<UdpReducer>(opt); }

// ---- the UDP socket channel -----------------------------------------------------------------

namespace {

class UdpChannel final : public DatagramChannel {
 public:
  explicit UdpChannel(const std::string& address) {
    std::string host, err;
    uint16_t port = 0;
    if (!thc::parse_udp_url(address, &host, &port, &err)) fail(Status::kInvalidArgument, "udp client: " + err);
    if (!thc::resolve_udp(host, port, &agg_, &err)) fail(Status::kInvalidArgument, "udp client: " + err);
    fd_ = thc::open_udp_socket(agg_, 4 << 20);
    const sys::SysResult r = THC_SYS(::connect(fd_, reinterpret_cast<const sockaddr*>(&agg_.ss), agg_.len));
    if (!r.ok()) {
      ::close(fd_);
      r.fail(Status::kTransport);
    }
  }
  ~UdpChannel() override {
    flush();
    ::close(fd_);
  }
  // Batched: the client sends a window's worth back to back, then receives; one sendmmsg per
  // batch instead of one send per datagram. Flushed before every receive and wait.
  void send(const uint8_t* p, size_t n) override {
    if (n > kMaxDatagram) {
      err_ = EMSGSIZE;
      return;
    }
    std::memcpy(bufs_[queued_].data(), p, n);
    lens_[queued_] = n;
    if (++queued_ == kBatch) flush();
  }
  size_t recv(uint8_t* buf, size_t cap) override {
    flush();
    const sys::SysResult r = THC_SYS(::recv(fd_, buf, cap, MSG_DONTWAIT));
    if (!r.ok()) {
      if (!r.would_block()) err_ = r.err;  // e.g. ECONNREFUSED: nobody at the aggregator port
      return 0;
    }
    return static_cast<size_t>(r.rc);  // (an empty datagram reads as "none": the parser would drop it anyway)
  }
  void wait(int timeout_ms) override {
    flush();
    pollfd pfd{fd_, POLLIN, 0};
    (void)THC_SYS(::poll(&pfd, 1, timeout_ms));
  }
  std::string kind() const override { return "udp"; }
  std::string peer() const override { return agg_.str(); }
  std::string last_error() const override { return err_ ? std::strerror(err_) : std::string(); }

 private:
  void flush() {
    size_t done = 0;
    while (done < queued_) {
      mmsghdr msgs[kBatch];
      iovec iov[kBatch];
      const size_t m = queued_ - done;
      for (size_t i = 0; i < m; ++i) {
        iov[i] = iovec{bufs_[done + i].data(), lens_[done + i]};
        std::memset(&msgs[i], 0, sizeof msgs[i]);
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
      }
      const int rc = ::sendmmsg(fd_, msgs, static_cast<unsigned>(m), MSG_DONTWAIT);
      if (rc < 0) {
        if (errno == EINTR) continue;
        // EAGAIN/ENOBUFS/ECONNREFUSED: the rest of the batch is lost, retransmission recovers it.
        err_ = errno;
        break;
      }
      done += static_cast<size_t>(rc);
      if (rc == 0) break;
    }
    queued_ = 0;
  }

  static constexpr size_t kBatch = 32;
  static constexpr size_t kMaxDatagram = proto::kMaxPacketBytes;
  PeerAddr agg_;
  int fd_ = -1;
  int err_ = 0;
  std::vector<std::vector<uint8_t>> bufs_ = std::vector<std::vector<uint8_t>>(kBatch, std::vector<uint8_t>(kMaxDatagram));
  size_t lens_[kBatch] = {};
  size_t queued_ = 0;
};

}  // namespace

std::unique_ptr<DatagramChannel> make_udp_channel(const std::string& address) {
  return std::make_unique<UdpChannel>(address);
}

}  // namespace thc::transport
