// The data plane on BMv2's simple_switch, through its Thrift runtime API (the services `standard`
// and `simple_pre_lag`, multiplexed on --thrift-port, binary protocol over a buffered socket). The
// C++ client is generated at build time from BMv2's IDL (switch_offload/switchd/thrift/) with
// Debian's thrift-compiler.
//
// Names: the contract's names (CONTRACT.md: ipv4_fwd, admit, r_seq, c_job_rx, ...) are resolved
// against the loaded program's own (bm_get_config: p4c prefixes them with their control, e.g.
// "ThcIngress.admit"), and the key and action-parameter widths are taken from it, so the program
// may name its controls as it likes; a program that lacks an object, or whose action takes another
// number of parameters than the contract says, is refused at connect with the name.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "switch_offload/switchd/dataplane.h"

namespace thc::switch_offload::switchd {

class Bmv2DataPlane final : public DataPlane {
 public:
  // Connects and reads the loaded program (throws thc::Error: unreachable, no program loaded,
  // or a program that does not follow CONTRACT.md).
  Bmv2DataPlane(const std::string& host, int thrift_port);
  ~Bmv2DataPlane() override;

  std::string describe() const override;
  int max_jobs() const override { return max_jobs_; }
  uint32_t slot_capacity() const override { return slots_; }
  void clear() override;
  void add_route(const Route& r, const Mac& smac) override;
  void add_service(uint32_t ip, uint16_t udp_port) override;
  void reset_slots(uint32_t first, uint32_t count) override;
  void install_job(const DpJob& j) override;
  void admit_worker(const DpJob& j, const DpWorker& w, const Mac& smac) override;
  void write_table(const DpJob& j, int tid, int bits, proto::WireInt sum, const int32_t* values) override;
  void remove_job(const DpJob& j) override;
  uint64_t job_rx(int index) override;
  DpCounters counters() override;

  // Read-back for tests and diagnostics, by contract name.
  std::string register_name(const std::string& contract_name) const;
  int64_t read_register(const std::string& contract_name, int index);
  void write_register(const std::string& contract_name, int index, int64_t value);
  int64_t table_entries(const std::string& contract_name);
  std::string multicast_entries();  // the PRE's groups and nodes (BMv2's JSON)

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  int max_jobs_ = 0;
  uint32_t slots_ = 0;
};

}  // namespace thc::switch_offload::switchd
