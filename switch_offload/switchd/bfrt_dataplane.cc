// UNTESTED: see bfrt_dataplane.h. Compiled against open-p4studio's bfruntime.proto, never run.
#include "switch_offload/switchd/bfrt_dataplane.h"

#include <grpcpp/grpcpp.h>
#include <json/json.h>
#include <unistd.h>

#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "bfruntime.grpc.pb.h"
#include "common/status.h"

namespace thc::switch_offload::switchd {

namespace bp = bfrt_proto;

namespace {

constexpr uint32_t kAllPipes = 0xffff;

struct Field {
  uint32_t id = 0;
  int width = 0;  // bits; 0 for arrays and booleans
  std::string name;
};

struct TableInfo {
  std::string name;
  uint32_t id = 0;
  int64_t size = 0;
  std::string type;
  std::vector<Field> keys;                 // in the program's key order
  std::map<std::string, Field> data;       // common data fields (registers, counters, PRE)
  std::map<std::string, std::pair<uint32_t, std::vector<Field>>> actions;  // name -> id, params
};

int width_of(const Json::Value& type) {
  if (type.isMember("width")) return type["width"].asInt();
  const std::string t = type["type"].asString();
  if (t == "uint64") return 64;
  if (t == "uint32") return 32;
  if (t == "uint16") return 16;
  if (t == "uint8") return 8;
  return 0;
}

bool ends_with_name(const std::string& n, const std::string& want) {
  return n == want || (n.size() > want.size() && n.compare(n.size() - want.size(), want.size(), want) == 0 &&
                       n[n.size() - want.size() - 1] == '.');
}

std::string be_bytes(uint64_t v, int bits, const std::string& what) {
  if (bits < 64 && (v >> bits) != 0)
    fail(Status::kInvalidArgument, "bfrt: " + what + ": value " + std::to_string(v) + " does not fit " +
                                       std::to_string(bits) + " bits");
  const int n = (bits + 7) / 8;
  std::string s(static_cast<size_t>(n), '\0');
  for (int i = n - 1; i >= 0; --i, v >>= 8) s[static_cast<size_t>(i)] = static_cast<char>(v & 0xff);
  return s;
}

uint64_t from_be(const std::string& s) {
  uint64_t v = 0;
  for (unsigned char c : s) v = (v << 8) | c;
  return v;
}

uint64_t mac_u64(const Mac& m) {
  uint64_t v = 0;
  for (uint8_t b : m) v = (v << 8) | b;
  return v;
}

}  // namespace

struct BfrtDataPlane::Impl {
  std::string address, p4;
  int device = 0;
  uint32_t client_id = 0;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<bp::BfRuntime::Stub> stub;
  grpc::ClientContext stream_ctx;
  std::unique_ptr<grpc::ClientReaderWriter<bp::StreamMessageRequest, bp::StreamMessageResponse>> stream;
  std::map<std::string, TableInfo> tables;  // by the program's full name

  struct Worker {
    bool live = false;
    std::vector<uint64_t> admit_key;
    uint32_t node = 0;
  };
  struct Job {
    bool live = false;
    std::map<int, Worker> workers;
    std::map<int, int> luts;  // table id -> lookup handle
  };
  std::vector<Job> jobs;
  // Lookup tables (CONTRACT.md "TNA"): 16 handles switch-wide, each naming one installed table
  // whose 2^b entries sit in the 64 per-lane tables lut_lo<k> / lut_hi<k>.
  static constexpr int kLutHandles = 16;
  int lut_bits[kLutHandles] = {};  // 0: free
  int max_jobs = 0;
  uint32_t slots = 0;

  [[noreturn]] void grpc_fail(const std::string& what, const grpc::Status& st) {
    fail(st.error_code() == grpc::StatusCode::UNAVAILABLE ? Status::kTransport : Status::kInternal,
         "bfrt " + address + ": " + what + ": " + st.error_message() + " (gRPC code " +
             std::to_string(static_cast<int>(st.error_code())) + ")");
  }

  const TableInfo& table(const std::string& want) const {
    const TableInfo* hit = nullptr;
    for (const auto& kv : tables)
      if (ends_with_name(kv.first, want)) {
        if (hit) fail(Status::kInvalidArgument, "bfrt: table '" + want + "' is ambiguous (" + hit->name + ", " + kv.first + ")");
        hit = &kv.second;
      }
    if (!hit) fail(Status::kInvalidArgument, "bfrt: the program has no table '" + want + "' (CONTRACT.md)");
    return *hit;
  }
  std::vector<const TableInfo*> tables_named(const std::string& prefix) const {
    // Registers whose short name starts with prefix (a 64-bit bitmap may be two halves on Tofino).
    std::vector<const TableInfo*> out;
    for (const auto& kv : tables) {
      if (kv.second.type != "Register") continue;
      const size_t dot = kv.first.rfind('.');
      const std::string shortname = dot == std::string::npos ? kv.first : kv.first.substr(dot + 1);
      if (shortname.compare(0, prefix.size(), prefix) == 0) out.push_back(&kv.second);
    }
    return out;
  }

  void read_info(const std::string& json, bool p4_tables) {
    Json::Value root;
    Json::CharReaderBuilder rb;
    std::string err;
    std::istringstream in(json);
    if (!Json::parseFromStream(rb, in, &root, &err))
      fail(Status::kInvalidArgument, "bfrt " + address + ": bfruntime info does not parse: " + err);
    for (const auto& t : root["tables"]) {
      TableInfo ti;
      ti.name = t["name"].asString();
      ti.id = t["id"].asUInt();
      ti.size = t["size"].asInt64();
      ti.type = t["table_type"].asString();
      for (const auto& k : t["key"]) ti.keys.push_back({k["id"].asUInt(), width_of(k["type"]), k["name"].asString()});
      for (const auto& a : t["action_specs"]) {
        std::vector<Field> ps;
        for (const auto& d : a["data"]) ps.push_back({d["id"].asUInt(), width_of(d["type"]), d["name"].asString()});
        ti.actions[a["name"].asString()] = {a["id"].asUInt(), ps};
      }
      for (const auto& d : t["data"]) {
        const Json::Value& s = d["singleton"];
        if (!s.isNull()) ti.data[s["name"].asString()] = {s["id"].asUInt(), width_of(s["type"]), s["name"].asString()};
      }
      (void)p4_tables;
      tables[ti.name] = ti;
    }
  }

  bp::WriteRequest request() const {
    bp::WriteRequest w;
    w.mutable_target()->set_device_id(static_cast<uint32_t>(device));
    w.mutable_target()->set_pipe_id(kAllPipes);
    w.set_client_id(client_id);
    w.set_p4_name(p4);
    return w;
  }
  void write(const bp::WriteRequest& w, const std::string& what) {
    grpc::ClientContext ctx;
    bp::WriteResponse r;
    const grpc::Status st = stub->Write(&ctx, w, &r);
    if (!st.ok()) grpc_fail(what, st);
  }
  bp::TableEntry* add_update(bp::WriteRequest* w, bp::Update::Type type, const TableInfo& t,
                             const std::vector<uint64_t>& key) {
    bp::Update* u = w->add_updates();
    u->set_type(type);
    bp::TableEntry* e = u->mutable_entity()->mutable_table_entry();
    e->set_table_id(t.id);
    if (key.size() != t.keys.size())
      fail(Status::kInvalidArgument, "bfrt: table " + t.name + " has " + std::to_string(t.keys.size()) + " key fields, " +
                                         std::to_string(key.size()) + " given");
    for (size_t i = 0; i < key.size(); ++i) {
      bp::KeyField* f = e->mutable_key()->add_fields();
      f->set_field_id(t.keys[i].id);
      f->mutable_exact()->set_value(be_bytes(key[i], t.keys[i].width, t.name + " key " + t.keys[i].name));
    }
    return e;
  }
  void set_action(bp::TableEntry* e, const TableInfo& t, const std::string& action, const std::vector<uint64_t>& ps) {
    for (const auto& kv : t.actions) {
      if (!ends_with_name(kv.first, action)) continue;
      if (kv.second.second.size() != ps.size())
        fail(Status::kInvalidArgument, "bfrt: action " + kv.first + " takes " + std::to_string(kv.second.second.size()) +
                                           " parameters; CONTRACT.md says " + std::to_string(ps.size()));
      e->mutable_data()->set_action_id(kv.second.first);
      for (size_t i = 0; i < ps.size(); ++i) {
        bp::DataField* f = e->mutable_data()->add_fields();
        f->set_field_id(kv.second.second[i].id);
        f->set_stream(be_bytes(ps[i], kv.second.second[i].width, kv.first + " " + kv.second.second[i].name));
      }
      return;
    }
    fail(Status::kInvalidArgument, "bfrt: table " + t.name + " has no action '" + action + "'");
  }
  const Field& data_field(const TableInfo& t, const std::string& name) const {
    auto it = t.data.find(name);
    if (it == t.data.end()) fail(Status::kInvalidArgument, "bfrt: table " + t.name + " has no data field " + name);
    return it->second;
  }
  void entry(const std::string& table_name, bp::Update::Type type, const std::vector<uint64_t>& key,
             const std::string& action, const std::vector<uint64_t>& ps) {
    const TableInfo& t = table(table_name);
    bp::WriteRequest w = request();
    bp::TableEntry* e = add_update(&w, type, t, key);
    if (type != bp::Update::DELETE) set_action(e, t, action, ps);
    write(w, t.name);
  }
  // Every data field of a register entry gets `value` (both halves of a pair register).
  void registers(const std::vector<const TableInfo*>& regs, uint64_t first, uint64_t end,
                 const std::vector<uint64_t>& values) {
    for (const TableInfo* t : regs) {
      for (uint64_t i = first; i < end;) {
        bp::WriteRequest w = request();
        for (int n = 0; n < 1024 && i < end; ++n, ++i) {
          bp::TableEntry* e = add_update(&w, bp::Update::MODIFY, *t, {i});
          for (const auto& kv : t->data) {
            bp::DataField* f = e->mutable_data()->add_fields();
            f->set_field_id(kv.second.id);
            f->set_stream(be_bytes(values.empty() ? 0 : values[i - first] & (kv.second.width >= 64 ? ~0ull
                                                                              : ((1ull << kv.second.width) - 1)),
                                   kv.second.width, t->name));
          }
        }
        write(w, "write " + t->name);
      }
    }
  }
  uint64_t counter(const std::string& name, int index) {
    const TableInfo& t = table(name);
    bp::ReadRequest rq;
    rq.mutable_target()->set_device_id(static_cast<uint32_t>(device));
    rq.mutable_target()->set_pipe_id(kAllPipes);
    rq.set_client_id(client_id);
    rq.set_p4_name(p4);
    bp::TableEntry* e = rq.add_entities()->mutable_table_entry();
    e->set_table_id(t.id);
    e->mutable_table_flags()->set_from_hw(true);
    bp::KeyField* k = e->mutable_key()->add_fields();
    k->set_field_id(t.keys.at(0).id);
    k->mutable_exact()->set_value(be_bytes(static_cast<uint64_t>(index), t.keys.at(0).width, t.name));
    const uint32_t pkts = data_field(t, "$COUNTER_SPEC_PKTS").id;
    grpc::ClientContext ctx;
    auto reader = stub->Read(&ctx, rq);
    bp::ReadResponse r;
    uint64_t sum = 0;
    while (reader->Read(&r))
      for (const auto& ent : r.entities())
        for (const auto& f : ent.table_entry().data().fields())
          if (f.field_id() == pkts) sum += from_be(f.stream());
    const grpc::Status st = reader->Finish();
    if (!st.ok()) grpc_fail("read " + t.name, st);
    return sum;
  }
  // The multicast group of job j: every admitted worker's node.
  void write_group(int index, uint16_t mgid, bp::Update::Type type) {
    const TableInfo& g = table("$pre.mgid");
    bp::WriteRequest w = request();
    bp::TableEntry* e = add_update(&w, type, g, {mgid});
    auto* nodes = e->mutable_data()->add_fields();
    nodes->set_field_id(data_field(g, "$MULTICAST_NODE_ID").id);
    auto* xv = e->mutable_data()->add_fields();
    xv->set_field_id(data_field(g, "$MULTICAST_NODE_L1_XID_VALID").id);
    auto* xid = e->mutable_data()->add_fields();
    xid->set_field_id(data_field(g, "$MULTICAST_NODE_L1_XID").id);
    for (const auto& kv : jobs[static_cast<size_t>(index)].workers) {
      if (!kv.second.live) continue;
      nodes->mutable_int_arr_val()->add_val(kv.second.node);
      xv->mutable_bool_arr_val()->add_val(false);
      xid->mutable_int_arr_val()->add_val(0);
    }
    write(w, "multicast group " + std::to_string(mgid));
  }
  // T into the 64 per-lane tables under `handle` (type INSERT), or out of them (DELETE).
  void lut_entries(int handle, int bits, const int32_t* values, bp::Update::Type type) {
    for (const char* half : {"lo", "hi"})
      for (int k = 0; k < 32; ++k) {
        const TableInfo& t = table(std::string("lut_") + half + std::to_string(k));
        bp::WriteRequest w = request();
        for (int z = 0; z < (1 << bits); ++z) {
          bp::TableEntry* e = add_update(&w, type, t, {static_cast<uint64_t>(handle), static_cast<uint64_t>(z)});
          if (type != bp::Update::DELETE)
            set_action(e, t, std::string("lut_value_") + half + std::to_string(k), {static_cast<uint32_t>(values[z])});
        }
        write(w, t.name);
      }
  }
  void free_lut(int handle) {
    if (lut_bits[handle] == 0) return;
    lut_entries(handle, lut_bits[handle], nullptr, bp::Update::DELETE);
    lut_bits[handle] = 0;
  }
  void drop_worker(const DpJob& j, Worker& wk) {
    if (!wk.live) return;
    wk.live = false;
    entry("admit", bp::Update::DELETE, wk.admit_key, "", {});
    entry("replica", bp::Update::DELETE, {static_cast<uint64_t>(wk.node - 1)}, "", {});
    write_group(j.index, j.mgid, bp::Update::MODIFY);
    const TableInfo& n = table("$pre.node");
    bp::WriteRequest w = request();
    add_update(&w, bp::Update::DELETE, n, {wk.node});
    write(w, "delete multicast node");
  }
  Job& job(const DpJob& j) {
    if (j.index < 0 || static_cast<size_t>(j.index) >= jobs.size())
      fail(Status::kInternal, "bfrt: job index " + std::to_string(j.index) + " out of range");
    return jobs[static_cast<size_t>(j.index)];
  }
};

BfrtDataPlane::BfrtDataPlane(const std::string& address, int device_id, const std::string& p4_name)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.address = address;
  m.device = device_id;
  m.p4 = p4_name;
  m.client_id = 1 + static_cast<uint32_t>(::getpid() % 1000);
  m.channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  m.stub = bp::BfRuntime::NewStub(m.channel);
  // A client must subscribe on the stream channel, then bind to the program, before it may write.
  m.stream = m.stub->StreamChannel(&m.stream_ctx);
  bp::StreamMessageRequest sub;
  sub.set_client_id(m.client_id);
  sub.mutable_subscribe()->set_device_id(static_cast<uint32_t>(device_id));
  if (!m.stream->Write(sub)) fail(Status::kTransport, "bfrt " + address + ": cannot open the stream channel (is bf_switchd running?)");
  bp::StreamMessageResponse ack;
  if (!m.stream->Read(&ack) || !ack.has_subscribe() || ack.subscribe().status().code() != 0)
    fail(Status::kTransport, "bfrt " + address + ": subscription refused");
  {
    grpc::ClientContext ctx;
    bp::SetForwardingPipelineConfigRequest rq;
    bp::SetForwardingPipelineConfigResponse rs;
    rq.set_device_id(static_cast<uint32_t>(device_id));
    rq.set_client_id(m.client_id);
    rq.set_action(bp::SetForwardingPipelineConfigRequest::BIND);
    rq.add_config()->set_p4_name(p4_name);
    const grpc::Status st = m.stub->SetForwardingPipelineConfig(&ctx, rq, &rs);
    if (!st.ok()) m.grpc_fail("bind to program " + p4_name, st);
  }
  {
    grpc::ClientContext ctx;
    bp::GetForwardingPipelineConfigRequest rq;
    bp::GetForwardingPipelineConfigResponse rs;
    rq.set_device_id(static_cast<uint32_t>(device_id));
    rq.set_client_id(m.client_id);
    const grpc::Status st = m.stub->GetForwardingPipelineConfig(&ctx, rq, &rs);
    if (!st.ok()) m.grpc_fail("get the pipeline config", st);
    bool found = false;
    for (const auto& c : rs.config())
      if (c.p4_name() == p4_name) {
        m.read_info(c.bfruntime_info(), true);
        found = true;
      }
    if (!found) fail(Status::kInvalidArgument, "bfrt " + address + ": device " + std::to_string(device_id) +
                                                   " runs no program '" + p4_name + "'");
    m.read_info(rs.non_p4_config().bfruntime_info(), false);
  }
  for (const char* t : {"ipv4_fwd", "thc_service", "admit", "lut_meta", "replica", "$pre.mgid", "$pre.node",
                        "c_job_rx", "c_result", "c_drop", "r_seq", "lut_lo0", "lut_hi31"})
    (void)m.table(t);
  m.max_jobs = static_cast<int>(std::min<int64_t>(m.table("c_job_rx").size, proto::kMaxWorkers));
  m.slots = static_cast<uint32_t>(m.table("r_seq").size / 2);
  m.jobs.resize(static_cast<size_t>(m.max_jobs));
}

BfrtDataPlane::~BfrtDataPlane() {
  impl_->stream->WritesDone();
  impl_->stream_ctx.TryCancel();
}

std::string BfrtDataPlane::describe() const {
  return "tofino bfrt " + impl_->address + " device " + std::to_string(impl_->device) + " program " + impl_->p4 +
         " (UNTESTED backend; " + std::to_string(impl_->max_jobs) + " job indices, " + std::to_string(impl_->slots) +
         " slots)";
}
int BfrtDataPlane::max_jobs() const { return impl_->max_jobs; }
uint32_t BfrtDataPlane::slot_capacity() const { return impl_->slots; }

void BfrtDataPlane::clear() {
  Impl& m = *impl_;
  // A DELETE of a table entry without a key clears the table (BfRt's table clear).
  std::vector<std::string> names = {"admit", "replica", "lut_meta", "ipv4_fwd", "thc_service", "$pre.mgid", "$pre.node"};
  for (const char* half : {"lo", "hi"})
    for (int k = 0; k < 32; ++k) names.push_back(std::string("lut_") + half + std::to_string(k));
  for (const std::string& t : names) {
    bp::WriteRequest w = m.request();
    bp::Update* u = w.add_updates();
    u->set_type(bp::Update::DELETE);
    u->mutable_entity()->mutable_table_entry()->set_table_id(m.table(t).id);
    m.write(w, "clear " + t);
  }
  for (auto& j : m.jobs) j = Impl::Job{};
  for (int& b : m.lut_bits) b = 0;
}

void BfrtDataPlane::add_route(const Route& r, const Mac& smac) {
  impl_->entry("ipv4_fwd", bfrt_proto::Update::INSERT, {r.ip}, "forward", {r.port, mac_u64(smac), mac_u64(r.mac)});
}

void BfrtDataPlane::add_service(uint32_t ip, uint16_t udp_port) {
  impl_->entry("thc_service", bfrt_proto::Update::INSERT, {ip, udp_port}, "thc_here", {});
}

void BfrtDataPlane::reset_slots(uint32_t first, uint32_t count) {
  Impl& m = *impl_;
  std::vector<const TableInfo*> regs;
  for (const char* p : {"r_seq", "r_bitmap", "r_count"})
    for (const TableInfo* t : m.tables_named(p)) regs.push_back(t);
  m.registers(regs, 2ull * first, 2ull * (first + count), {});
}

void BfrtDataPlane::install_job(const DpJob& j) {
  Impl& m = *impl_;
  Impl::Job& jb = m.job(j);
  if (jb.live) remove_job(j);
  jb.live = true;
  m.write_group(j.index, j.mgid, bfrt_proto::Update::INSERT);
}

void BfrtDataPlane::admit_worker(const DpJob& j, const DpWorker& w, const Mac& smac) {
  Impl& m = *impl_;
  Impl::Job& jb = m.job(j);
  Impl::Worker& wk = jb.workers[w.worker];
  m.drop_worker(j, wk);
  const uint64_t rid = static_cast<uint64_t>(j.index) * proto::kMaxWorkers + w.worker;
  wk.node = static_cast<uint32_t>(rid + 1);
  {
    const TableInfo& n = m.table("$pre.node");
    bfrt_proto::WriteRequest wr = m.request();
    bfrt_proto::TableEntry* e = m.add_update(&wr, bfrt_proto::Update::INSERT, n, {wk.node});
    auto* f = e->mutable_data()->add_fields();
    f->set_field_id(m.data_field(n, "$MULTICAST_RID").id);
    f->set_stream(be_bytes(rid, m.data_field(n, "$MULTICAST_RID").width, "$MULTICAST_RID"));
    f = e->mutable_data()->add_fields();
    f->set_field_id(m.data_field(n, "$MULTICAST_LAG_ID").id);
    f->mutable_int_arr_val();
    f = e->mutable_data()->add_fields();
    f->set_field_id(m.data_field(n, "$DEV_PORT").id);
    f->mutable_int_arr_val()->add_val(w.route.port);
    m.write(wr, "multicast node");
  }
  wk.live = true;
  m.write_group(j.index, j.mgid, bfrt_proto::Update::MODIFY);
  m.entry("replica", bfrt_proto::Update::INSERT, {rid}, "to_worker",
          {w.worker, w.ip, w.udp_port, mac_u64(smac), mac_u64(w.route.mac)});
  wk.admit_key = {j.id, w.worker, w.ip, w.udp_port};
  m.entry("admit", bfrt_proto::Update::INSERT, wk.admit_key, "admit_worker",
          {static_cast<uint64_t>(j.index), j.slot_base, j.nslots, j.n, j.all_mask, j.mgid});
}

void BfrtDataPlane::write_table(const DpJob& j, int tid, int bits, proto::WireInt sum, const int32_t* values) {
  Impl& m = *impl_;
  Impl::Job& jb = m.job(j);
  // A new handle for the new contents, switched to by lut_meta once its entries are in; the old
  // handle's entries go after (CONTRACT.md: entries before lut_meta, lut_meta first on removal).
  int handle = -1;
  for (int h = 0; h < Impl::kLutHandles && handle < 0; ++h)
    if (m.lut_bits[h] == 0) handle = h;
  if (handle < 0)
    fail(Status::kOutOfMemory, "bfrt: all " + std::to_string(Impl::kLutHandles) + " lookup-table handles in use");
  m.lut_entries(handle, bits, values, bfrt_proto::Update::INSERT);
  m.lut_bits[handle] = bits;
  const auto old = jb.luts.find(tid);
  m.entry("lut_meta", old == jb.luts.end() ? bfrt_proto::Update::INSERT : bfrt_proto::Update::MODIFY,
          {static_cast<uint64_t>(j.index), static_cast<uint64_t>(tid)}, "lut_ok",
          {static_cast<uint64_t>(bits), static_cast<uint64_t>(sum), static_cast<uint64_t>(handle)});
  if (old != jb.luts.end()) m.free_lut(old->second);
  jb.luts[tid] = handle;
}

void BfrtDataPlane::remove_job(const DpJob& j) {
  Impl& m = *impl_;
  Impl::Job& jb = m.job(j);
  for (auto& kv : jb.workers) m.drop_worker(j, kv.second);
  for (const auto& kv : jb.luts) {
    m.entry("lut_meta", bfrt_proto::Update::DELETE, {static_cast<uint64_t>(j.index), static_cast<uint64_t>(kv.first)}, "",
            {});
    m.free_lut(kv.second);
  }
  if (jb.live) {
    const TableInfo& g = m.table("$pre.mgid");
    bfrt_proto::WriteRequest w = m.request();
    m.add_update(&w, bfrt_proto::Update::DELETE, g, {j.mgid});
    m.write(w, "delete multicast group");
  }
  jb = Impl::Job{};
}

uint64_t BfrtDataPlane::job_rx(int index) { return impl_->counter("c_job_rx", index); }

DpCounters BfrtDataPlane::counters() {
  Impl& m = *impl_;
  DpCounters c;
  for (int i = 0; i < m.max_jobs; ++i) {
    c.job_rx.push_back(m.counter("c_job_rx", i));
    c.result.push_back(m.counter("c_result", i));
  }
  for (int64_t i = 0; i < m.table("c_drop").size; ++i) c.drop.push_back(m.counter("c_drop", static_cast<int>(i)));
  return c;
}

}  // namespace thc::switch_offload::switchd
