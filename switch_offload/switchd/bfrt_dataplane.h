// The data plane on an Intel Tofino, through BfRt's gRPC API (bfruntime.proto, served by the
// SDE's bf_switchd on port 50052): the same DataPlane operations as the BMv2 backend, on the TNA
// program (switch_offload/p4/tna/) with the names of CONTRACT.md.
//
// UNTESTED. Built only with -DTHC_WITH_TOFINO_BFRT=ON and the SDE's bfruntime.proto
// (THC_BFRT_PROTO_DIR); it has been compiled against open-p4studio's bfruntime.proto but never run:
// no Tofino, and no Tofino model, is available to this project. What it assumes of BfRt (from
// the SDE's documented BfRt conventions, not verified on a device):
//   - tables, actions and their key/data fields are resolved by name from the program's
//     bfrt.json (GetForwardingPipelineConfig), with any prefix ("pipe.ThcIngress.admit");
//   - registers are tables with the key "$REGISTER_INDEX" and one data field per register half
//     ("<name>.f1", or .lo/.hi pairs), written to every pipe (pipe_id 0xffff);
//   - lookup tables as CONTRACT.md's TNA section says: 16 handles switch-wide, each table's 2^b
//     entries in the 64 per-lane exact tables lut_lo<k> / lut_hi<k>, lut_meta naming the handle;
//   - counters are tables with the key "$COUNTER_INDEX" and the data field "$COUNTER_SPEC_PKTS",
//     read from the hardware (from_hw), summed over the pipes that answer;
//   - multicast is the fixed tables "$pre.node" ($MULTICAST_NODE_ID -> $MULTICAST_RID,
//     $MULTICAST_LAG_ID, $DEV_PORT) and "$pre.mgid" ($MGID -> $MULTICAST_NODE_ID,
//     $MULTICAST_NODE_L1_XID_VALID, $MULTICAST_NODE_L1_XID) of the non-P4 config;
//   - a route's port is the Tofino dev_port.
#pragma once

#include <memory>
#include <string>

#include "switch_offload/switchd/dataplane.h"

namespace thc::switch_offload::switchd {

class BfrtDataPlane final : public DataPlane {
 public:
  // Connects to bf_switchd's BfRt server (HOST:PORT), subscribes, binds to the program p4_name on
  // the device, and reads its bfrt.json (throws thc::Error with the reason).
  BfrtDataPlane(const std::string& address, int device_id, const std::string& p4_name);
  ~BfrtDataPlane() override;

  std::string describe() const override;
  int max_jobs() const override;
  uint32_t slot_capacity() const override;
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

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace thc::switch_offload::switchd
