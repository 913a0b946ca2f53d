// Test support: run a real thc-aggregator process on 127.0.0.1 (or another local IPv4 address) and
// an ephemeral port with a key file of its own (operator key id 0, tenant keys 1 and 2), query its
// counters over the protocol, stop it with a signal. Also a tiny raw UDP socket for sending
// hand-made (including malformed) datagrams.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "switch_offload/aggregator/stats.h"
#include "switch_offload/protocol/builder.h"

extern char** environ;

namespace thc::test {

inline std::string env_or(const char* name, const char* dflt) {
  const char* v = std::getenv(name);
  return v && *v ? v : dflt;
}

// A STATS nonce: the aggregator refuses an operator STATS whose nonce does not grow, and every
// process of a test run shares the clock, so nanoseconds since the epoch (strictly increasing
// within this process).
inline uint64_t stats_nonce() {
  static uint64_t last = 0;
  uint64_t n = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  if (n <= last) n = last + 1;
  last = n;
  return n;
}

// A directory of this process's own ($TMPDIR or /tmp, made by mkdtemp), so that a test's files
// never meet files another process left behind: a test process killed before its destructors ran
// leaves its key file (created with O_EXCL, as keys must be) under a name that a later process with
// the same pid would have chosen. Removed with everything in it when the process that made it
// exits normally (not by a child that inherited it).
inline const std::string& temp_dir() {
  static const std::string dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/thc_switch_test_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr)
      throw std::runtime_error("cannot make a temporary directory from " + tmpl + ": " + std::strerror(errno));
    return tmpl;
  }();
  static const pid_t owner = [] {
    std::atexit([] {
      if (::getpid() == owner) {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
      }
    });
    return ::getpid();
  }();
  return dir;
}

inline std::string temp_path(const std::string& stem) {
  static int counter = 0;
  return temp_dir() + "/" + std::to_string(counter++) + "_" + stem;
}

// Spawn argv[0] with argv; stdout+stderr go to log (if not empty); extra environment appended.
inline pid_t spawn(const std::vector<std::string>& argv, const std::string& log,
                   const std::vector<std::string>& extra_env = {}) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (!log.empty()) {
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_store;
  for (char** e = environ; *e; ++e) env_store.emplace_back(*e);
  for (const auto& e : extra_env) env_store.push_back(e);
  std::vector<char*> envp;
  for (auto& e : env_store) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0], &fa, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("posix_spawn " + argv[0] + ": " + std::strerror(rc));
  return pid;
}

// waitpid with a deadline; returns the raw status, or -1 on timeout (the child is then killed).
inline int wait_child(pid_t pid, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    int st = 0;
    const pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) return st;
    if (r < 0) return -1;
    if (std::chrono::steady_clock::now() > end) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Unconnected UDP socket for hand-made datagrams, bound to `ip` (an IPv4 address) and sending to
// that same address.
class RawUdp {
 public:
  explicit RawUdp(const std::string& ip = "127.0.0.1") {
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (::inet_pton(AF_INET, ip.c_str(), &ip_) != 1) throw std::runtime_error("RawUdp: not an IPv4 address: " + ip);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr = ip_;
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  ~RawUdp() { ::close(fd_); }
  RawUdp(const RawUdp&) = delete;
  RawUdp& operator=(const RawUdp&) = delete;
  void send(uint16_t port, const std::vector<uint8_t>& p) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr = ip_;
    (void)::sendto(fd_, p.data(), p.size(), 0, reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  // Next datagram within ms milliseconds (empty if none).
  std::vector<uint8_t> recv(int ms) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, ms) <= 0) return {};
    std::vector<uint8_t> b(65536);
    const ssize_t n = ::recv(fd_, b.data(), b.size(), 0);
    b.resize(n > 0 ? static_cast<size_t>(n) : 0);
    return b;
  }

 private:
  int fd_ = -1;
  in_addr ip_{};
};

// The keys every test aggregator holds: fixed, so tests can make packets by hand.
inline thc::switch_offload::auth::Key test_key(uint32_t id) {
  thc::switch_offload::auth::Key k;
  k.id = id;
  for (size_t i = 0; i < thc::switch_offload::auth::kKeyBytes; ++i) k.bytes[i] = static_cast<uint8_t>(0xA5 ^ (i * 7) ^ (id * 13));
  return k;
}

// A key file (mode 0600) holding the operator key and tenant keys 1 and 2; removed by the destructor.
class TestKeyFile {
 public:
  TestKeyFile() : path_(temp_path("keys")) {
    std::string err;
    if (!thc::switch_offload::auth::write_key_file(path_, {test_key(0), test_key(1), test_key(2)}, &err))
      throw std::runtime_error(err);
  }
  ~TestKeyFile() { ::unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

class AggregatorProcess {
 public:
  // bind: the IPv4 address the aggregator listens on (url() and stats() use it).
  explicit AggregatorProcess(std::vector<std::string> extra = {}, int threads = 1, std::string bind = "127.0.0.1")
      : bind_(std::move(bind)) {
    const std::string bin = env_or("THC_AGGREGATOR_BIN", THC_AGGREGATOR_BIN);
    port_file_ = temp_path("port");
    log_ = temp_path("log");
    std::vector<std::string> argv = {bin, "--key-file", keys_.path(), "--port", "0", "--port-file", port_file_,
                                     "--threads", std::to_string(threads), "--bind", bind_, "--stats-interval",
                                     "0", "--seed", "1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    pid_ = spawn(argv, log_);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (port_ == 0) {
      std::ifstream f(port_file_);
      int p = 0;
      if (f >> p && p > 0) port_ = static_cast<uint16_t>(p);
      if (port_) break;
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("thc-aggregator exited at start: " + slurp(log_));
      }
      if (std::chrono::steady_clock::now() > end) throw std::runtime_error("thc-aggregator did not start: " + slurp(log_));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  ~AggregatorProcess() {
    if (pid_ > 0) stop(SIGKILL);
    ::unlink(port_file_.c_str());
    ::unlink(log_.c_str());
  }
  uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }
  // Resident memory of the process (bytes), from /proc.
  uint64_t resident_bytes() const {
    std::ifstream f("/proc/" + std::to_string(pid_) + "/statm");
    uint64_t size = 0, resident = 0;
    f >> size >> resident;
    return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  }
  const std::string& key_file() const { return keys_.path(); }
  // THC_AGGREGATOR_KEY_FILE=... for a worker process of this aggregator.
  std::string key_env() const { return "THC_AGGREGATOR_KEY_FILE=" + keys_.path(); }
  std::string url() const { return "udp://" + bind_ + ":" + std::to_string(port_); }
  const std::string& host() const { return bind_; }
  std::string output() const { return slurp(log_); }

  // Signal and reap; returns the exit status as waitpid reports it (-1: had to be killed).
  int stop(int sig = SIGTERM) {
    if (pid_ <= 0) return -1;
    ::kill(pid_, sig);
    const int st = wait_child(pid_, 20);
    pid_ = -1;
    return st;
  }

  // Server-wide counters (stats_names() order) via a STATS request.
  std::vector<uint64_t> stats() {
    using namespace thc::switch_offload::proto;
    RawUdp s(bind_);
    for (int attempt = 0; attempt < 50; ++attempt) {
      const uint64_t nonce = stats_nonce();
      const thc::switch_offload::auth::TagKey sk = thc::switch_offload::auth::stats_key(test_key(0));
      Header h;
      h.seq = nonce;
      s.send(port_, make_stats(nonce, &sk));
      for (;;) {
        auto r = s.recv(100);
        if (r.empty()) break;
        Header rh;
        const uint8_t* pl;
        size_t plen;
        if (parse(r.data(), r.size(), &rh, &pl, &plen) == ParseError::kOk && rh.type == MsgType::kStatsReply &&
            rh.seq == h.seq) {
          std::vector<uint64_t> v(rh.aux);
          for (uint32_t i = 0; i < rh.aux; ++i) v[i] = load_be64(pl + 8 * i);
          return v;
        }
      }
    }
    throw std::runtime_error("thc-aggregator did not answer STATS");
  }
  uint64_t stat(const std::string& name) { return thc::switch_offload::stats_get(stats(), name); }

 private:
  std::string bind_;
  TestKeyFile keys_;
  pid_t pid_ = -1;
  uint16_t port_ = 0;
  std::string port_file_, log_;
};

}  // namespace thc::test
