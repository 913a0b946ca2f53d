// thc-switchd's BMv2 backend against a real simple_switch running the THC v1model program (no
// interfaces needed, so no root): the contract's names resolved in the program, slot registers
// reset, jobs installed and removed with their admission, multicast and replica entries, a worker
// admitted again from another address replacing its entries, lookup tables written, and clear().
// Skipped (with the reason) when simple_switch or the compiled program is not there.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include <json/json.h>

#include "common/status.h"
#include "switch_offload/switchd/bmv2_dataplane.h"
#include "tests/switch_offload/aggregator_process.h"

namespace {

using namespace thc::switch_offload::switchd;
using thc::switch_offload::proto::WireInt;

std::string env(const char* n) {
  const char* v = std::getenv(n);
  return v ? v : "";
}

int free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  ::close(fd);
  return ntohs(a.sin_port);
}

// simple_switch with the program (or none), on a port and a notification socket of its own.
class SimpleSwitch {
 public:
  explicit SimpleSwitch(const std::string& json) {
    port_ = free_tcp_port();
    dir_ = thc::test::temp_path("bmv2");
    ::mkdir(dir_.c_str(), 0700);
    std::vector<std::string> argv = {env("THC_SIMPLE_SWITCH"), "--thrift-port", std::to_string(port_), "--device-id",
                                     std::to_string(100 + ::getpid() % 1000), "--notifications-addr",
                                     "ipc://" + dir_ + "/notifications.ipc"};
    if (json.empty()) argv.push_back("--no-p4");
    else argv.push_back(json);
    pid_ = thc::test::spawn(argv, dir_ + "/log");
  }
  ~SimpleSwitch() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      thc::test::wait_child(pid_, 10);
    }
    std::system(("rm -rf " + dir_).c_str());
  }
  // The backend, once simple_switch serves. It takes a moment to start, seconds more on a loaded
  // machine (a CI run once gave up after 10 s): waited for up to 90 s while it runs; if it exits
  // first, the failure says so with its log.
  std::unique_ptr<Bmv2DataPlane> connect() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
    for (;;) {
      try {
        return std::make_unique<Bmv2DataPlane>("127.0.0.1", port_);
      } catch (const thc::Error& e) {
        if (e.status() != thc::Status::kTransport || std::chrono::steady_clock::now() > deadline) throw;
      }
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("simple_switch exited before serving (status " + std::to_string(st) + "): " + log());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  std::string log() const { return thc::test::slurp(dir_ + "/log"); }

 private:
  int port_ = 0;
  pid_t pid_ = -1;
  std::string dir_;
};

#define REQUIRE_BMV2()                                                                                       \
  if (env("THC_SIMPLE_SWITCH").empty() || ::access(env("THC_SIMPLE_SWITCH").c_str(), X_OK) != 0)             \
    GTEST_SKIP() << "no simple_switch (THC_SIMPLE_SWITCH; the P4 toolchain is not installed)";               \
  if (env("THC_P4_JSON").empty() || ::access(env("THC_P4_JSON").c_str(), R_OK) != 0)                         \
    GTEST_SKIP() << "no compiled v1model program (THC_P4_JSON=" << env("THC_P4_JSON") << ": p4c-bm2-ss missing?)"

// The multicast group ids the PRE holds, and how many nodes each has.
std::map<int, int> groups(Bmv2DataPlane& dp) {
  Json::Value root;
  Json::CharReaderBuilder rb;
  std::string err;
  std::istringstream in(dp.multicast_entries());
  EXPECT_TRUE(Json::parseFromStream(rb, in, &root, &err)) << err;
  std::map<int, int> g;
  for (const auto& x : root["mgrps"]) g[x["id"].asInt()] = static_cast<int>(x["l1_handles"].size());
  return g;
}

Route route(uint32_t ip, uint16_t port, uint8_t last) {
  Route r;
  r.ip = ip;
  r.port = port;
  r.mac = {0x02, 0, 0, 0, 0, last};
  return r;
}

TEST(Bmv2DataPlane, InstallsAndRemovesJobs) {
  REQUIRE_BMV2();
  SimpleSwitch sw(env("THC_P4_JSON"));
  auto dp = sw.connect();
  EXPECT_EQ(dp->max_jobs(), 64);
  EXPECT_GE(dp->slot_capacity(), 1024u);
  dp->clear();
  const Mac smac{0x02, 0x54, 0x48, 0x43, 0, 1};
  dp->add_route(route(0x0A630001, 15, 1), smac);
  dp->add_route(route(0x0A63000B, 1, 0x11), smac);
  dp->add_service(0x0A630001, 9471);
  EXPECT_EQ(dp->table_entries("ipv4_fwd"), 2);
  EXPECT_EQ(dp->table_entries("thc_service"), 1);

  // Slot registers of the job's range are zeroed, the rest untouched.
  for (int i : {2 * 100 - 1, 2 * 100, 2 * 131 + 1, 2 * 132}) {
    dp->write_register("r_seq", i, 77);
    dp->write_register("r_bitmap", i, 5);
    dp->write_register("r_count", i, 3);
  }
  DpJob j;
  j.id = (uint64_t{1} << 32) | 5;
  j.index = 3;
  j.n = 2;
  j.slot_base = 100;
  j.nslots = 32;
  j.all_mask = 3;
  j.mgid = 4;
  dp->reset_slots(j.slot_base, j.nslots);
  EXPECT_EQ(dp->read_register("r_seq", 2 * 100 - 1), 77);
  EXPECT_EQ(dp->read_register("r_seq", 2 * 100), 0);
  EXPECT_EQ(dp->read_register("r_bitmap", 2 * 131 + 1), 0);
  EXPECT_EQ(dp->read_register("r_count", 2 * 131 + 1), 0);
  EXPECT_EQ(dp->read_register("r_seq", 2 * 132), 77);

  dp->install_job(j);
  DpWorker w0{0, 0x0A63000B, 40000, route(0x0A63000B, 1, 0x11)};
  DpWorker w1{1, 0x0A63000C, 40001, route(0x0A63000C, 2, 0x12)};
  dp->admit_worker(j, w0, smac);
  dp->admit_worker(j, w1, smac);
  EXPECT_EQ(dp->table_entries("admit"), 2);
  EXPECT_EQ(dp->table_entries("replica"), 2);
  // A worker that joins again from another port replaces its admission, never adds one.
  w0.udp_port = 40100;
  dp->admit_worker(j, w0, smac);
  EXPECT_EQ(dp->table_entries("admit"), 2);
  EXPECT_EQ(dp->table_entries("replica"), 2);
  EXPECT_EQ(groups(*dp), (std::map<int, int>{{4, 2}})) << dp->multicast_entries();

  int32_t t[256];
  for (int z = 0; z < 256; ++z) t[z] = z * 7 - 50;
  dp->write_table(j, 2, 4, WireInt::kU8, t);
  EXPECT_EQ(dp->read_register("r_lut", 3 * 1024 + 2 * 256 + 0), static_cast<int64_t>(static_cast<uint32_t>(-50)));
  EXPECT_EQ(dp->read_register("r_lut", 3 * 1024 + 2 * 256 + 15), 15 * 7 - 50);
  EXPECT_EQ(dp->table_entries("lut_meta"), 1);
  dp->write_table(j, 2, 4, WireInt::kU8, t);  // re-installed: still one meta entry
  EXPECT_EQ(dp->table_entries("lut_meta"), 1);
  EXPECT_EQ(dp->job_rx(3), 0u);
  const DpCounters c = dp->counters();
  EXPECT_EQ(c.job_rx.size(), 64u);
  EXPECT_EQ(c.result.size(), 64u);
  EXPECT_EQ(c.drop.size(), 16u);

  dp->remove_job(j);
  EXPECT_EQ(dp->table_entries("admit"), 0);
  EXPECT_EQ(dp->table_entries("replica"), 0);
  EXPECT_EQ(dp->table_entries("lut_meta"), 0);
  EXPECT_TRUE(groups(*dp).empty()) << dp->multicast_entries();
  EXPECT_EQ(dp->table_entries("ipv4_fwd"), 2) << "routes stay";

  // A second backend (thc-switchd restarted) starts from nothing: entries, groups and nodes go.
  dp->install_job(j);
  dp->admit_worker(j, w1, smac);
  auto again = sw.connect();
  again->clear();
  EXPECT_EQ(again->table_entries("admit"), 0);
  EXPECT_EQ(again->table_entries("ipv4_fwd"), 0);
  EXPECT_TRUE(groups(*again).empty()) << again->multicast_entries();
}

TEST(Bmv2DataPlane, RefusesASwitchWithoutTheProgram) {
  REQUIRE_BMV2();
  SimpleSwitch sw("");
  try {
    sw.connect();
    FAIL() << "connected to a switch without the THC program";
  } catch (const thc::Error& e) {
    // simple_switch --no-p4 serves an empty program: the first missing object is named.
    EXPECT_NE(std::string(e.what()).find("has no table 'ipv4_fwd'"), std::string::npos) << e.what();
  }
}

}  // namespace
