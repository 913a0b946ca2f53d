#include "switch_offload/switchd/bmv2_dataplane.h"

#include <json/json.h>
#include <thrift/protocol/TBinaryProtocol.h>
#include <thrift/protocol/TMultiplexedProtocol.h>
#include <thrift/transport/TBufferTransports.h>
#include <thrift/transport/TSocket.h>

#include <memory>
#include <sstream>
#include <vector>

#include "SimplePreLAG.h"
#include "Standard.h"
#include "common/status.h"

namespace thc::switch_offload::switchd {

namespace std_rt = bm_runtime::standard;
namespace pre_rt = bm_runtime::simple_pre_lag;
using apache::thrift::TException;

namespace {

// What the program must hold (CONTRACT.md), with the number of key fields / action parameters.
// `alt`: another name the object may have (P4 has one namespace for a control's tables and
// actions, so the admit table's action cannot be called admit too).
struct Want {
  const char* name;
  size_t arity;
  const char* alt = nullptr;
};
constexpr Want kTables[] = {{"ipv4_fwd", 1}, {"thc_service", 2}, {"admit", 4}, {"lut_meta", 2}, {"replica", 1}};
constexpr Want kActions[] = {{"forward", 3}, {"thc_here", 0}, {"admit", 6, "admit_worker"}, {"lut_ok", 2},
                             {"to_worker", 5}};
constexpr const char* kRegisters[] = {"r_lut", "r_seq", "r_bitmap", "r_count"};
constexpr const char* kCounters[] = {"c_job_rx", "c_drop", "c_result"};

// The program's name for `want`: itself, or the one name ending in "." + want.
std::string resolve(const std::vector<std::string>& names, const std::string& want, const std::string& kind,
                    const char* alt = nullptr) {
  std::vector<std::string> hits;
  for (const std::string& n : names) {
    if (n == want) return n;
    if (n.size() > want.size() && n.compare(n.size() - want.size(), want.size(), want) == 0 &&
        n[n.size() - want.size() - 1] == '.')
      hits.push_back(n);
  }
  if (hits.size() == 1) return hits[0];
  if (hits.empty() && alt) return resolve(names, alt, kind);
  if (hits.empty())
    fail(Status::kInvalidArgument, "bmv2: the loaded P4 program has no " + kind + " '" + want +
                                       "' (switch_offload/p4/CONTRACT.md); is it the THC program?");
  std::string all;
  for (const auto& h : hits) all += " " + h;
  fail(Status::kInvalidArgument, "bmv2: " + kind + " '" + want + "' is ambiguous in the loaded program:" + all);
}

// Big-endian bytes of v in a field of `bits` bits, as the runtime takes match keys and action data.
std::string be_bytes(uint64_t v, int bits, const std::string& what) {
  if (bits < 64 && (v >> bits) != 0)
    fail(Status::kInvalidArgument, "bmv2: " + what + ": value " + std::to_string(v) + " does not fit " +
                                       std::to_string(bits) + " bits");
  const int n = (bits + 7) / 8;
  std::string s(static_cast<size_t>(n), '\0');
  for (int i = n - 1; i >= 0; --i, v >>= 8) s[static_cast<size_t>(i)] = static_cast<char>(v & 0xff);
  return s;
}

uint64_t mac_u64(const Mac& m) {
  uint64_t v = 0;
  for (uint8_t b : m) v = (v << 8) | b;
  return v;
}

template <typename Map>
std::string code_name(const Map& names, int code) {
  auto it = names.find(code);
  return it == names.end() ? "code " + std::to_string(code) : it->second;
}

}  // namespace

struct Bmv2DataPlane::Impl {
  struct Table {
    std::string name;
    std::vector<int> key_bits;
  };
  struct Action {
    std::string name;
    std::vector<int> param_bits;
  };
  struct Worker {
    int32_t admit = -1, replica = -1, node = -1;
  };
  struct Job {
    bool live = false;
    int32_t mgrp = -1;
    std::map<int, Worker> workers;
    std::map<int, int32_t> lut_meta;  // by table id
  };

  std::string where;
  std::shared_ptr<apache::thrift::transport::TTransport> transport;
  std::unique_ptr<std_rt::StandardClient> rt;
  std::unique_ptr<pre_rt::SimplePreLAGClient> pre;
  std::map<std::string, Table> tables;
  std::map<std::string, Action> actions;
  std::map<std::string, std::string> registers, counters;
  std::map<std::string, int64_t> register_size, counter_size;
  std::string egress_drop;  // optional (CONTRACT.md: ThcEgress.c_egress_drop)
  int64_t egress_drop_size = 0;
  std::vector<Job> jobs;

  // Every runtime call goes through here: its failure becomes a thc::Error that says what failed.
  template <typename F>
  auto call(const std::string& what, F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const std_rt::InvalidTableOperation& e) {
      fail(Status::kInternal, "bmv2 " + where + ": " + what + ": " +
                                  code_name(std_rt::_TableOperationErrorCode_VALUES_TO_NAMES, e.code));
    } catch (const std_rt::InvalidRegisterOperation& e) {
      fail(Status::kInternal, "bmv2 " + where + ": " + what + ": " +
                                  code_name(std_rt::_RegisterOperationErrorCode_VALUES_TO_NAMES, e.code));
    } catch (const std_rt::InvalidCounterOperation& e) {
      fail(Status::kInternal, "bmv2 " + where + ": " + what + ": " +
                                  code_name(std_rt::_CounterOperationErrorCode_VALUES_TO_NAMES, e.code));
    } catch (const pre_rt::InvalidMcOperation& e) {
      fail(Status::kInternal, "bmv2 " + where + ": " + what + ": " +
                                  code_name(pre_rt::_McOperationErrorCode_VALUES_TO_NAMES, e.code));
    } catch (const TException& e) {
      fail(Status::kTransport, "bmv2 " + where + ": " + what + ": " + e.what() +
                                   " (is simple_switch running with this --thrift-port?)");
    }
  }

  void read_program() {
    std::string cfg;
    call("bm_get_config", [&] { rt->bm_get_config(cfg); });
    Json::Value root;
    Json::CharReaderBuilder rb;
    std::string err;
    std::istringstream in(cfg);
    if (cfg.empty() || !Json::parseFromStream(rb, in, &root, &err))
      fail(Status::kInvalidArgument, "bmv2 " + where + ": no P4 program loaded (or its JSON does not parse: " + err + ")");
    // Field widths: header instance -> header type -> field -> bits.
    std::map<std::string, std::map<std::string, int>> type_fields;
    for (const auto& t : root["header_types"])
      for (const auto& f : t["fields"]) type_fields[t["name"].asString()][f[0].asString()] = f[1].asInt();
    std::map<std::string, std::string> instance_type;
    for (const auto& h : root["headers"]) instance_type[h["name"].asString()] = h["header_type"].asString();

    std::vector<std::string> names;
    std::map<std::string, const Json::Value*> by_name;
    for (const auto& p : root["pipelines"])
      for (const auto& t : p["tables"]) {
        names.push_back(t["name"].asString());
        by_name[t["name"].asString()] = &t;
      }
    for (const Want& w : kTables) {
      Table t;
      t.name = resolve(names, w.name, "table");
      const Json::Value& js = *by_name[t.name];
      for (const auto& k : js["key"]) {
        if (k["match_type"].asString() != "exact")
          fail(Status::kInvalidArgument, "bmv2: table " + t.name + ": key " + k["name"].asString() +
                                             " is not exact (CONTRACT.md: exact keys)");
        const std::string inst = k["target"][0].asString(), field = k["target"][1].asString();
        const auto& fields = type_fields[instance_type[inst]];
        const auto fi = fields.find(field);
        if (fi == fields.end())
          fail(Status::kInvalidArgument, "bmv2: table " + t.name + ": cannot find the width of key " + inst + "." + field);
        t.key_bits.push_back(fi->second);
      }
      if (t.key_bits.size() != w.arity)
        fail(Status::kInvalidArgument, "bmv2: table " + t.name + " has " + std::to_string(t.key_bits.size()) +
                                           " key fields; CONTRACT.md says " + std::to_string(w.arity));
      tables[w.name] = t;
    }
    names.clear();
    std::map<std::string, const Json::Value*> act_by_name;
    for (const auto& a : root["actions"]) {
      names.push_back(a["name"].asString());
      act_by_name[a["name"].asString()] = &a;
    }
    for (const Want& w : kActions) {
      Action a;
      a.name = resolve(names, w.name, "action", w.alt);
      for (const auto& p : (*act_by_name[a.name])["runtime_data"]) a.param_bits.push_back(p["bitwidth"].asInt());
      if (a.param_bits.size() != w.arity)
        fail(Status::kInvalidArgument, "bmv2: action " + a.name + " takes " + std::to_string(a.param_bits.size()) +
                                           " parameters; CONTRACT.md says " + std::to_string(w.arity));
      actions[w.name] = a;
    }
    names.clear();
    std::map<std::string, int64_t> sizes;
    for (const auto& r : root["register_arrays"]) {
      names.push_back(r["name"].asString());
      sizes[r["name"].asString()] = r["size"].asInt64();
    }
    for (const char* r : kRegisters) {
      registers[r] = resolve(names, r, "register");
      register_size[r] = sizes[registers[r]];
    }
    names.clear();
    sizes.clear();
    for (const auto& c : root["counter_arrays"]) {
      names.push_back(c["name"].asString());
      sizes[c["name"].asString()] = c["size"].asInt64();
    }
    for (const char* c : kCounters) {
      counters[c] = resolve(names, c, "counter");
      counter_size[c] = sizes[counters[c]];
    }
    for (const std::string& n : names)
      if (n == "c_egress_drop" || (n.size() > 14 && n.compare(n.size() - 14, 14, ".c_egress_drop") == 0)) {
        egress_drop = n;
        egress_drop_size = sizes[n];
      }
  }

  std_rt::BmMatchParams key(const std::string& table, const std::vector<uint64_t>& values) {
    const Table& t = tables.at(table);
    std_rt::BmMatchParams k;
    for (size_t i = 0; i < values.size(); ++i) {
      std_rt::BmMatchParamExact e;
      e.__set_key(be_bytes(values[i], t.key_bits[i], "table " + t.name + " key " + std::to_string(i)));
      std_rt::BmMatchParam p;
      p.__set_type(std_rt::BmMatchParamType::EXACT);
      p.__set_exact(e);
      k.push_back(p);
    }
    return k;
  }
  std_rt::BmActionData data(const std::string& action, const std::vector<uint64_t>& values) {
    const Action& a = actions.at(action);
    std_rt::BmActionData d;
    for (size_t i = 0; i < values.size(); ++i)
      d.push_back(be_bytes(values[i], a.param_bits[i], "action " + a.name + " parameter " + std::to_string(i)));
    return d;
  }
  int32_t add(const std::string& table, const std::vector<uint64_t>& k, const std::string& action,
              const std::vector<uint64_t>& d) {
    const std_rt::BmMatchParams mk = key(table, k);
    const std_rt::BmActionData ad = data(action, d);
    const std::string& tn = tables.at(table).name;
    return call("add an entry to " + tn, [&] {
      return rt->bm_mt_add_entry(0, tn, mk, actions.at(action).name, ad, std_rt::BmAddEntryOptions());
    });
  }
  void del(const std::string& table, int32_t& handle) {
    if (handle < 0) return;
    const std::string& tn = tables.at(table).name;
    call("delete entry " + std::to_string(handle) + " of " + tn, [&] { rt->bm_mt_delete_entry(0, tn, handle); });
    handle = -1;
  }
  void drop_worker(Job& jb, Worker& w) {
    del("admit", w.admit);
    del("replica", w.replica);
    if (w.node >= 0) {
      const int32_t node = w.node;
      w.node = -1;
      if (jb.mgrp >= 0) call("dissociate a multicast node", [&] { pre->bm_mc_node_dissociate(0, jb.mgrp, node); });
      call("destroy a multicast node", [&] { pre->bm_mc_node_destroy(0, node); });
    }
  }
  Job& job(const DpJob& j) {
    if (j.index < 0 || static_cast<size_t>(j.index) >= jobs.size())
      fail(Status::kInternal, "bmv2: job index " + std::to_string(j.index) + " outside the program's " +
                                  std::to_string(jobs.size()));
    return jobs[static_cast<size_t>(j.index)];
  }
};

Bmv2DataPlane::Bmv2DataPlane(const std::string& host, int thrift_port) : impl_(std::make_unique<Impl>()) {
  using namespace apache::thrift;
  Impl& m = *impl_;
  m.where = host + ":" + std::to_string(thrift_port);
  // Thrift prints its transport errors to stderr as well; they are in the thrown errors already.
  apache::thrift::GlobalOutput.setOutputFunction([](const char*) {});
  auto socket = std::make_shared<transport::TSocket>(host, thrift_port);
  socket->setConnTimeout(5000);
  socket->setRecvTimeout(30000);
  socket->setSendTimeout(30000);
  m.transport = std::make_shared<transport::TBufferedTransport>(socket);
  auto bin = std::make_shared<protocol::TBinaryProtocol>(m.transport);
  m.rt = std::make_unique<std_rt::StandardClient>(std::make_shared<protocol::TMultiplexedProtocol>(bin, "standard"));
  m.pre = std::make_unique<pre_rt::SimplePreLAGClient>(
      std::make_shared<protocol::TMultiplexedProtocol>(bin, "simple_pre_lag"));
  m.call("connect", [&] { m.transport->open(); });
  m.read_program();
  max_jobs_ = static_cast<int>(std::min<int64_t>(m.counter_size["c_job_rx"], proto::kMaxWorkers));
  slots_ = static_cast<uint32_t>(m.register_size["r_seq"] / 2);
  if (max_jobs_ < 1 || slots_ < 1 || m.register_size["r_lut"] < int64_t{max_jobs_} * 1024)
    fail(Status::kInvalidArgument, "bmv2: the program's c_job_rx (" + std::to_string(m.counter_size["c_job_rx"]) +
                                       "), r_seq (" + std::to_string(m.register_size["r_seq"]) + ") or r_lut (" +
                                       std::to_string(m.register_size["r_lut"]) + ") are too small (CONTRACT.md)");
  m.jobs.resize(static_cast<size_t>(max_jobs_));
}

Bmv2DataPlane::~Bmv2DataPlane() {
  try {
    impl_->transport->close();
  } catch (const TException&) {
    // Nothing to do about a failing close.
  }
}

std::string Bmv2DataPlane::describe() const {
  return "bmv2 simple_switch thrift " + impl_->where + " (" + std::to_string(max_jobs_) + " job indices, " +
         std::to_string(slots_) + " slots, admit table " + impl_->tables.at("admit").name + ")";
}

void Bmv2DataPlane::clear() {
  Impl& m = *impl_;
  // reset_state empties every table and register; the PRE's groups and nodes are removed by hand,
  // since whether reset_state reaches the PRE differs between BMv2 versions.
  m.call("reset_state", [&] { m.rt->bm_reset_state(); });
  for (const auto& kv : m.tables) {
    const std::string& tn = kv.second.name;
    m.call("clear " + tn, [&] { m.rt->bm_mt_clear_entries(0, tn, false); });
  }
  std::string mc;
  m.call("read the multicast groups", [&] { m.pre->bm_mc_get_entries(mc, 0); });
  Json::Value root;
  Json::CharReaderBuilder rb;
  std::string err;
  std::istringstream in(mc);
  if (!Json::parseFromStream(rb, in, &root, &err))
    fail(Status::kInternal, "bmv2 " + m.where + ": the multicast entries do not parse: " + err);
  for (const auto& g : root["mgrps"]) {
    // BMv2's PRE lists groups by id; a group's handle is its id (McSimplePre::mc_mgrp_create).
    const int32_t gh = g["id"].asInt();
    for (const auto& l1 : g["l1_handles"]) {
      const int32_t h = l1.asInt();
      m.call("dissociate a multicast node", [&] { m.pre->bm_mc_node_dissociate(0, gh, h); });
    }
    m.call("destroy a multicast group", [&] { m.pre->bm_mc_mgrp_destroy(0, gh); });
  }
  for (const auto& l1 : root["l1_handles"]) {
    const int32_t h = l1["handle"].asInt();
    m.call("destroy a multicast node", [&] { m.pre->bm_mc_node_destroy(0, h); });
  }
  for (auto& j : m.jobs) j = Impl::Job{};
}

void Bmv2DataPlane::add_route(const Route& r, const Mac& smac) {
  impl_->add("ipv4_fwd", {r.ip}, "forward", {r.port, mac_u64(smac), mac_u64(r.mac)});
}

void Bmv2DataPlane::add_service(uint32_t ip, uint16_t udp_port) {
  impl_->add("thc_service", {ip, udp_port}, "thc_here", {});
}

void Bmv2DataPlane::reset_slots(uint32_t first, uint32_t count) {
  Impl& m = *impl_;
  if (first + count > slots_ || count == 0)
    fail(Status::kInternal, "bmv2: slots [" + std::to_string(first) + ", " + std::to_string(first + count) +
                                ") outside the program's " + std::to_string(slots_));
  for (const char* r : {"r_seq", "r_bitmap", "r_count"}) {
    const std::string& rn = m.registers[r];
    m.call("reset " + rn, [&] {
      m.rt->bm_register_write_range(0, rn, static_cast<int32_t>(2 * first), static_cast<int32_t>(2 * (first + count)), 0);
    });
  }
}

void Bmv2DataPlane::install_job(const DpJob& j) {
  Impl& m = *impl_;
  Impl::Job& jb = m.job(j);
  if (jb.live) remove_job(j);
  jb.mgrp = m.call("create multicast group " + std::to_string(j.mgid),
                   [&] { return m.pre->bm_mc_mgrp_create(0, static_cast<int32_t>(j.mgid)); });
  jb.live = true;
}

void Bmv2DataPlane::admit_worker(const DpJob& j, const DpWorker& w, const Mac& smac) {
  Impl& m = *impl_;
  Impl::Job& jb = m.job(j);
  if (!jb.live) fail(Status::kInternal, "bmv2: admit to job index " + std::to_string(j.index) + ", not installed");
  Impl::Worker& wk = jb.workers[w.worker];
  m.drop_worker(jb, wk);  // an earlier admission (another address) goes first
  // Replication first, admission last: once a packet of this worker is admitted, its results
  // already reach it.
  const int32_t rid = j.index * proto::kMaxWorkers + w.worker;
  // Port map: a string of '0'/'1' whose last character is port 0.
  const std::string ports = "1" + std::string(w.route.port, '0');
  wk.node = m.call("create a multicast node", [&] { return m.pre->bm_mc_node_create(0, rid, ports, ""); });
  const int32_t node = wk.node;
  m.call("associate a multicast node", [&] { m.pre->bm_mc_node_associate(0, jb.mgrp, node); });
  wk.replica = m.add("replica", {static_cast<uint64_t>(rid)}, "to_worker",
                     {w.worker, w.ip, w.udp_port, mac_u64(smac), mac_u64(w.route.mac)});
  wk.admit = m.add("admit", {j.id, w.worker, w.ip, w.udp_port}, "admit",
                   {static_cast<uint64_t>(j.index), j.slot_base, j.nslots, j.n, j.all_mask, j.mgid});
}

void Bmv2DataPlane::write_table(const DpJob& j, int tid, int bits, proto::WireInt sum, const int32_t* values) {
  Impl& m = *impl_;
  Impl::Job& jb = m.job(j);
  const std::string& rn = m.registers["r_lut"];
  // The entries first, the meta entry that enables the table last (a client installs a table
  // before it sends packets that use it, so nothing looks it up half written).
  for (int z = 0; z < (1 << bits); ++z) {
    const int32_t idx = j.index * 1024 + tid * 256 + z;
    const int64_t v = static_cast<uint32_t>(values[z]);
    m.call("write " + rn, [&] { m.rt->bm_register_write(0, rn, idx, v); });
  }
  const std::vector<uint64_t> meta = {static_cast<uint64_t>(bits), static_cast<uint64_t>(sum)};
  auto it = jb.lut_meta.find(tid);
  if (it == jb.lut_meta.end()) {
    jb.lut_meta[tid] = m.add("lut_meta", {static_cast<uint64_t>(j.index), static_cast<uint64_t>(tid)}, "lut_ok", meta);
  } else {
    // Modified in place: a delete and an add would leave a moment without the table.
    const std_rt::BmActionData ad = m.data("lut_ok", meta);
    const std::string& tn = m.tables.at("lut_meta").name;
    const int32_t h = it->second;
    m.call("modify an entry of " + tn, [&] { m.rt->bm_mt_modify_entry(0, tn, h, m.actions.at("lut_ok").name, ad); });
  }
}

void Bmv2DataPlane::remove_job(const DpJob& j) {
  Impl& m = *impl_;
  Impl::Job& jb = m.job(j);
  for (auto& kv : jb.workers) m.drop_worker(jb, kv.second);
  for (auto& kv : jb.lut_meta) m.del("lut_meta", kv.second);
  if (jb.mgrp >= 0) {
    const int32_t g = jb.mgrp;
    m.call("destroy a multicast group", [&] { m.pre->bm_mc_mgrp_destroy(0, g); });
  }
  jb = Impl::Job{};
}

uint64_t Bmv2DataPlane::job_rx(int index) {
  Impl& m = *impl_;
  std_rt::BmCounterValue v;
  const std::string& cn = m.counters["c_job_rx"];
  m.call("read " + cn, [&] { m.rt->bm_counter_read(v, 0, cn, index); });
  return static_cast<uint64_t>(v.packets);
}

DpCounters Bmv2DataPlane::counters() {
  Impl& m = *impl_;
  DpCounters c;
  auto read_all = [&](const char* name, std::vector<uint64_t>* out) {
    const std::string& cn = m.counters[name];
    for (int64_t i = 0; i < m.counter_size[name]; ++i) {
      std_rt::BmCounterValue v;
      m.call("read " + cn, [&] { m.rt->bm_counter_read(v, 0, cn, static_cast<int32_t>(i)); });
      out->push_back(static_cast<uint64_t>(v.packets));
    }
  };
  read_all("c_job_rx", &c.job_rx);
  read_all("c_result", &c.result);
  read_all("c_drop", &c.drop);
  if (!m.egress_drop.empty()) {
    // Egress drops (a replica without its entry) share the reason numbering.
    for (size_t i = 0; i < c.drop.size() && static_cast<int64_t>(i) < m.egress_drop_size; ++i) {
      std_rt::BmCounterValue v;
      m.call("read " + m.egress_drop, [&] { m.rt->bm_counter_read(v, 0, m.egress_drop, static_cast<int32_t>(i)); });
      c.drop[i] += static_cast<uint64_t>(v.packets);
    }
  }
  return c;
}

std::string Bmv2DataPlane::register_name(const std::string& contract_name) const {
  auto it = impl_->registers.find(contract_name);
  return it == impl_->registers.end() ? std::string() : it->second;
}

int64_t Bmv2DataPlane::read_register(const std::string& contract_name, int index) {
  Impl& m = *impl_;
  const std::string rn = register_name(contract_name);
  return m.call("read " + rn, [&] { return m.rt->bm_register_read(0, rn, index); });
}

void Bmv2DataPlane::write_register(const std::string& contract_name, int index, int64_t value) {
  Impl& m = *impl_;
  const std::string rn = register_name(contract_name);
  m.call("write " + rn, [&] { m.rt->bm_register_write(0, rn, index, value); });
}

int64_t Bmv2DataPlane::table_entries(const std::string& contract_name) {
  Impl& m = *impl_;
  const std::string& tn = m.tables.at(contract_name).name;
  return m.call("count the entries of " + tn, [&] { return m.rt->bm_mt_get_num_entries(0, tn); });
}

std::string Bmv2DataPlane::multicast_entries() {
  Impl& m = *impl_;
  std::string mc;
  m.call("read the multicast groups", [&] { m.pre->bm_mc_get_entries(mc, 0); });
  return mc;
}

}  // namespace thc::switch_offload::switchd
