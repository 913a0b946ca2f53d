#include "collectives/capi/hier.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "collectives/codec/codec_simd.h"
#include "collectives/engine/agreement.h"
#include "collectives/engine/device.h"
#include "collectives/engine/dtype.h"
#include "collectives/engine/knobs.h"
#include "collectives/engine/plan_rules.h"

namespace thc::capi {

// The defaults of HierNet: through max_u32 (one slot per rank or per host; MAX with zeros
// elsewhere is exact, every slot having one writer).
std::vector<uint64_t> HierNet::allgather_u64(uint64_t mine, const char* what) {
  const size_t n = static_cast<size_t>(size());
  std::vector<uint32_t> w(2 * n, 0);
  w[2 * static_cast<size_t>(rank())] = static_cast<uint32_t>(mine);
  w[2 * static_cast<size_t>(rank()) + 1] = static_cast<uint32_t>(mine >> 32);
  max_u32(w.data(), w.size(), what);
  std::vector<uint64_t> out(n);
  for (size_t r = 0; r < n; ++r) out[r] = w[2 * r] | (uint64_t{w[2 * r + 1]} << 32);
  return out;
}
void HierNet::share_from_first(const std::vector<int>& local, int host, int hosts, void* buf, size_t n,
                               const char* what) {
  const size_t words = (n + 3) / 4;
  std::vector<uint32_t> w(words * static_cast<size_t>(hosts), 0);
  if (!local.empty() && local[0] == rank()) std::memcpy(w.data() + words * static_cast<size_t>(host), buf, n);
  max_u32(w.data(), w.size(), what);
  std::memcpy(buf, w.data() + words * static_cast<size_t>(host), n);
}

namespace {

using Clock = std::chrono::steady_clock;
using Naming = std::function<void(uint32_t*, size_t)>;

// Every wait bounded by THC_TIMEOUT_MS (<= 0: none), and the communicator broken after a
// failed or abandoned operation (the ranks are out of step then), as the flat backends do.
struct Waits {
  long timeout_ms = 0;
  bool broken = false;
  std::string why;
  HierNet* net = nullptr;

  void check_usable() const {
    if (broken)
      fail(Status::kTransport, "hierarchical allreduce: an earlier operation on this communicator failed (" + why +
                                   "); its exchanges cannot be cancelled, so the ranks are out of step: create a new "
                                   "communicator or end the job");
  }
  [[noreturn]] void fail_broken(Status s, const std::string& msg) {
    if (!broken) {
      broken = true;
      why = msg;
      if (net) net->broken();
    }
    fail(s, msg);
  }
  // Runs an operation of the net; its failure breaks the communicator.
  template <typename Fn>
  auto on_net(Fn&& fn) -> decltype(fn()) {
    try {
      return fn();
    } catch (const Error& e) {
      fail_broken(e.status(), e.what());
    }
  }
  // Element-wise MAX over every rank, in place.
  void max_u32(uint32_t* data, size_t n, const char* what) {
    on_net([&] { net->max_u32(data, n, what); });
  }
  // The exchange that names every rank a failure concerns (agreement.h name_ranks).
  Naming naming() {
    return [this](uint32_t* d, size_t n) { max_u32(d, n, "naming the ranks"); };
  }
};

// Agreement words: a status (MAX of the failures of ranks that failed before exchanging), the
// lowest and highest of those ranks, the lowest and highest rank with a flag of the exchange's
// own (NaN/Inf in a call's input; no arena at creation), whether some rank has device buffers,
// then each field as (v, ~v) in 2 + 2 words: under MAX the pair stays complementary only if
// every rank has the same v.
constexpr size_t kWordStatus = 0, kWordFailed = 1, kWordRanks = 3, kWordDevice = 5, kWordFields = 6;
using engine::field_agrees;
using engine::put_field;

struct Field {
  const char* what;
  uint64_t value;
};

uint32_t status_word(const Error& e) {
  return static_cast<uint32_t>(e.status() == Status::kSuccess ? Status::kInternal : e.status());
}

// Throws what the exchanged words say: a rank's failure before the exchange (the own error for
// the rank that failed), then disagreeing fields, then (nonfinite) NaN/Inf input. Every rank
// calls it alike: naming several ranks takes one more exchange, in which all take part.
void judge(const uint32_t* w, const std::vector<Field>& fields, int rank, int size, const Error* own, bool flagged,
           bool nonfinite, const char* stage, const Naming& naming) {
  if (w[kWordStatus] != 0) {
    const std::string who = engine::name_ranks(&w[kWordFailed], size, rank, own ? status_word(*own) : 0,
                                               w[kWordStatus], naming, engine::status_word);
    if (own) throw *own;
    fail(static_cast<Status>(w[kWordStatus]), "hierarchical allreduce: " + who + " failed " + stage +
                                                  " (their own error messages say why); nothing was reduced");
  }
  std::string bad;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (field_agrees(&w[kWordFields + 4 * i])) continue;
    bad += std::string(bad.empty() ? "" : ", ") + fields[i].what + " (this rank: " + std::to_string(fields[i].value) + ")";
  }
  if (!bad.empty()) fail(Status::kConfigMismatch, "hierarchical allreduce: ranks disagree on " + bad + "; nothing was reduced");
  if (nonfinite && engine::any_rank(&w[kWordRanks]))
    fail(Status::kNonFinite, "input contains NaN or Inf on " +
                                 engine::name_ranks(&w[kWordRanks], size, rank, flagged ? 1u : 0u, 1u, naming,
                                                    [](uint32_t) { return std::string(); }) +
                                 "; nothing was reduced");
}

// Words for an exchange of `fields` with this rank's failure (own, may be null).
std::vector<uint32_t> words(const std::vector<Field>& fields, int rank, const Error* own) {
  std::vector<uint32_t> w(kWordFields + 4 * fields.size(), 0);
  if (own) {
    w[kWordStatus] = status_word(*own);
    engine::put_rank(&w[kWordFailed], rank);
  }
  for (size_t i = 0; i < fields.size(); ++i) put_field(&w[kWordFields + 4 * i], fields[i].value);
  return w;
}

// Runs fn; an exception becomes *own (thc::Error; bad_alloc and others mapped) instead of
// propagating, so the rank still takes part in the exchange that follows.
template <typename Fn>
void capture(std::unique_ptr<Error>* own, Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    *own = std::make_unique<Error>(e);
  } catch (const std::bad_alloc&) {
    *own = std::make_unique<Error>(Status::kOutOfMemory, "hierarchical allreduce: out of memory");
  } catch (const std::exception& e) {
    *own = std::make_unique<Error>(Status::kInternal, std::string("hierarchical allreduce: internal error: ") + e.what());
  }
}

// ---- the host's shared memory
//
// An anonymous shared-memory object (memfd) of one host's ranks: local rank 0 creates it and
// keeps its descriptor open until every local rank has mapped it through /proc/<pid>/fd/<fd>.
// It never has a name, so nothing is left behind (in /dev/shm or anywhere) whatever happens to
// the processes, and /dev/shm's size (64 MB in a default Docker container) does not bound it.
struct ArenaHandle {
  int32_t err = 0;  // local rank 0's errno: no arena
  int32_t pid = 0;
  int32_t fd = -1;
  uint32_t nonce = 0;
  uint64_t bytes = 0;
};
static_assert(std::is_trivially_copyable<ArenaHandle>::value, "sent as bytes");

// The start of an arena: a barrier of the host's ranks, the next arena's handle (growing), then a
// status word per local rank (kStatusOffset).
struct ArenaCtl {
  std::atomic<uint32_t> arrived;
  std::atomic<uint32_t> gen;
  ArenaHandle next;
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "atomics in memory shared between processes");
constexpr size_t kStatusOffset = 64;
static_assert(sizeof(ArenaCtl) <= kStatusOffset, "the control block fits before the status words");
size_t ctl_bytes(int lsize) { return (kStatusOffset + 4 * static_cast<size_t>(lsize) + 4095) / 4096 * 4096; }

class Arena {
 public:
  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena() {
    if (base_ != nullptr) munmap(base_, bytes_);
    if (fd_ >= 0) close(fd_);
  }
  uint8_t* base() const { return static_cast<uint8_t*>(base_); }
  size_t bytes() const { return bytes_; }
  ArenaCtl* ctl() const { return static_cast<ArenaCtl*>(base_); }
  std::atomic<uint32_t>* status(int lrank) const {
    return reinterpret_cast<std::atomic<uint32_t>*>(base() + kStatusOffset) + lrank;
  }

  // Local rank 0: a new object of `bytes`, reserved now (a shortage is an error here, not a
  // SIGBUS later). Returns 0 or an errno; *h says how the other local ranks open it.
  int create(size_t bytes, ArenaHandle* h) {
    std::random_device rd;
    const uint32_t nonce = rd();
    char name[32];
    std::snprintf(name, sizeof name, "thc-hier-%08x", nonce);
    const int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0) return errno;
    int err = ftruncate(fd, static_cast<off_t>(bytes)) == 0 ? 0 : errno;
    if (err == 0) err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (err == 0) err = attach(fd, bytes);
    if (err != 0) {
      close(fd);
      return err;
    }
    fd_ = fd;
    *h = ArenaHandle{0, static_cast<int32_t>(getpid()), fd, nonce, bytes};
    return 0;
  }
  // The other local ranks: the object of h. Returns 0 or an errno (ESTALE: the descriptor there
  // is no longer that object, local rank 0 having given up on it).
  int open(const ArenaHandle& h) {
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/fd/%d", h.pid, h.fd);
    const int fd = ::open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return errno;
    char self[64], target[128], want[48];
    std::snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    std::snprintf(want, sizeof want, "/memfd:thc-hier-%08x", h.nonce);
    const ssize_t len = readlink(self, target, sizeof target - 1);
    struct stat st {};
    int err = 0;
    if (len < 0) {
      err = errno;
    } else {
      target[len] = '\0';
      if (std::strncmp(target, want, std::strlen(want)) != 0 || fstat(fd, &st) != 0 ||
          static_cast<uint64_t>(st.st_size) != h.bytes)
        err = ESTALE;
    }
    if (err == 0) err = attach(fd, h.bytes);
    close(fd);
    return err;
  }
  // Local rank 0, once every local rank has it mapped: the mappings keep the memory.
  void close_fd() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int attach(int fd, size_t bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return errno;
    base_ = p;
    bytes_ = bytes;
    return 0;
  }
  void* base_ = nullptr;
  size_t bytes_ = 0;
  int fd_ = -1;
};

std::string errno_word(uint32_t e) { return " (" + std::string(std::strerror(static_cast<int>(e))) + ")"; }

// Which ranks share memory: the same kernel (its boot id) and the same PID namespace (what
// opening /proc/<pid>/fd of another process needs).
uint64_t machine_key() {
  uint64_t h = 0x6a09e667f3bcc908ull;
  std::string id;
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char b[64] = {};
    if (std::fgets(b, sizeof b, f)) id = b;
    std::fclose(f);
  }
  if (id.empty()) {
    char hn[256] = {};
    gethostname(hn, sizeof hn - 1);
    id = hn;
  }
  for (char c : id) h = engine::digest_mix(h, static_cast<unsigned char>(c));
  struct stat st {};
  if (stat("/proc/self/ns/pid", &st) == 0) {
    h = engine::digest_mix(h, static_cast<uint64_t>(st.st_dev));
    h = engine::digest_mix(h, static_cast<uint64_t>(st.st_ino));
  }
  return h;
}

// Sizes of emulated hosts, "2,2" -> {2, 2}; throws on anything else.
std::vector<int> parse_hosts(const std::string& s, int world, const char* world_name) {
  std::vector<int> out;
  size_t pos = 0;
  long total = 0;
  while (pos <= s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    const std::string item = s.substr(pos, comma - pos);
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1 || v > (1 << 20))
      fail(Status::kInvalidArgument, "THC_HIER_HOSTS='" + s + "': expected host sizes like 2,2 or 3,1");
    out.push_back(static_cast<int>(v));
    total += v;
    pos = comma + 1;
  }
  if (total != world)
    fail(Status::kInvalidArgument, "THC_HIER_HOSTS='" + s + "' places " + std::to_string(total) +
                                       " ranks, " + world_name + " has " + std::to_string(world));
  return out;
}

// Elements [first, first + n) of src as float32 into dst; false if any is NaN or infinite.
// Piece by piece, so the check reads what was just written while it is in cache.
bool load_checked(const void* src, engine::DType t, uint64_t first, uint64_t n, float* dst) {
  constexpr uint64_t kPiece = 16384;
  bool ok = true;
  for (uint64_t off = 0; off < n; off += kPiece) {
    const uint64_t m = std::min(kPiece, n - off);
    float* d = dst + off;
    engine::load_as_float(src, t, first + off, m, nullptr, d);
    bool bad = false;
    codec::kern::max_abs(d, m, &bad);  // (vectorized; sets bad on NaN or Inf)
    ok &= !bad;
  }
  return ok;
}

// Local ranks 0..L-1 of a host; the compressed stage's slices 0..S-1.
struct HostLayout {
  int hosts = 0, host_index = 0, lrank = 0, lsize = 1, slices = 1, lmax = 1;
  std::vector<int> local;  // this host's ranks (of the communicator), by local rank
  std::vector<int> slice;  // local rank `lrank` of every host, by host (this rank's slice group)
  std::vector<int> sizes;  // ranks per host
  std::vector<int> host_of;   // by rank: its host
  std::vector<int> lrank_of;  // by rank: its local rank on its host
};

// The collective of a call: an allreduce (of one tensor or a group), or a reduce-scatter or
// allgather whose tensors are the ranks' shards (tensor q: rank q's).
enum class Op : uint32_t { kAllreduce = 0, kReduceScatter = 1, kAllgather = 2 };

// A reduce-scatter's or allgather's arguments.
struct Shards {
  Op op;
  const void* send;
  void* recv;
  const uint64_t* counts;
  engine::DType dtype;
  engine::ErrorFeedback* ef;
};

constexpr uint64_t kMinWindow = 1024;  // elements per slice and rank an arena holds at least
constexpr uint64_t kFirstWindow = uint64_t{1} << 16;

class HierComm final : public capi::Composite {
 public:
  HierComm(const thc_config_t& cfg, std::unique_ptr<HierNet> net, int rank, int size, HostLayout lay, Waits w)
      : cfg_(cfg), net_(std::move(net)), rank_(rank), size_(size), lay_(std::move(lay)), lrank_(lay_.lrank),
        lsize_(lay_.lsize), hosts_(lay_.hosts), slices_(lay_.slices), w_(std::move(w)) {
    w_.net = net_.get();
    cap_bytes_ = std::max<size_t>(cfg.hier_arena_bytes > 0 ? static_cast<size_t>(cfg.hier_arena_bytes) : 0,
                                  arena_bytes(kMinWindow));
  }

  ~HierComm() override {
    inner_.reset();
    flat_.reset();
    arena_.reset();
    net_.reset();  // (told at the failure if the communicator broke: HierNet::broken)
  }

  // Creation, after the layout: the host's arena and the compressed stage's engine for slice
  // lrank; every rank agrees on the outcome. False: some host has no shared memory for its
  // ranks (why_flat() names them), and the communicator runs flat instead.
  bool create() {
    std::unique_ptr<Error> own;
    const int err = share_arena(arena_bytes(std::min(kFirstWindow, window_for(cap_bytes_))));
    if (lrank_ < slices_) {
      capture(&own, [&] {
        thc_config_t c = cfg_;
        // Independent randomness per slice; slice 0 keeps THC_SEED itself (one rank per host
        // and THC_HIER=1 then gives the flat engine's bits).
        if (c.seed != 0 && lrank_ > 0) c.seed = engine::digest_mix(c.seed, static_cast<uint64_t>(lrank_)) | 1;
        inner_ = std::make_unique<engine::Engine>(w_.on_net([&] { return net_->group_reducer(lay_.slice, c.timeout_ms); }), c);
      });
    }
    std::vector<uint32_t> w = words({}, rank_, own.get());
    if (err != 0) engine::put_rank(&w[kWordRanks], rank_);
    w[kWordDevice] = static_cast<uint32_t>(err);
    w_.max_u32(w.data(), w.size(), "creating the hierarchical communicator");
    judge(w.data(), {}, rank_, size_, own.get(), false, false, "while creating the communicator", w_.naming());
    if (engine::any_rank(&w[kWordRanks])) {
      why_flat_ = "no shared memory for the host's ranks on " +
                  engine::name_ranks(&w[kWordRanks], size_, rank_, static_cast<uint32_t>(err), w[kWordDevice],
                                     w_.naming(), errno_word);
      return false;
    }
    arena_->close_fd();  // every local rank has it mapped
    return true;
  }
  const std::string& why_flat() const { return why_flat_; }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const thc_config_t& config() const override { return cfg_; }
  int hosts() const override { return hosts_; }
  engine::EngineStats stats() const override { return stats_; }
  std::string wire_stats() const override {
    char b[256];
    std::snprintf(b, sizeof b,
                  "hierarchical: host %d of %d, local rank %d of %d, %s; %llu calls (%llu in rounds); shared memory %.1f MB",
                  lay_.host_index, hosts_, lrank_, lsize_, lrank_ < slices_ ? "compresses a slice" : "contributes only",
                  static_cast<unsigned long long>(stats_.calls), static_cast<unsigned long long>(streamed_),
                  arena_ ? arena_->bytes() / 1e6 : 0.0);
    return b;
  }

  // A group runs as one call (run): one first exchange, every tensor's host sums in one pass
  // through the arena, and per slice one compressed group over the tensors' pieces. With device
  // buffers on some rank it runs on the flat engine's stream path on every rank.
  //
  // Reduce-scatter and allgather run the same way with the ranks' shards as the tensors (shard q
  // is tensor q, sliced like a group's tensor), and a compressed stage of the collective itself:
  // a reduce-scatter's slice owners reduce their pieces across the hosts and each piece is
  // decoded on the host of its shard's rank alone (the host of rank q reads only shard q's sums);
  // an allgather's pieces are gathered on their rank's host (no sum), encoded there once and
  // decoded on every host (error feedback by the slice owner that encodes them, in its own state).
  // With device buffers on some rank they run on the flat engine's stream path on every rank.
  void allreduce_group(codec::Scheme scheme, const engine::Tensor* ts, size_t n, bool mean) override {
    run(scheme, ts, n, mean, true);
  }
  void reduce_scatter(codec::Scheme scheme, const void* send, void* recv, const uint64_t* counts, engine::DType dtype,
                      bool mean, engine::ErrorFeedback* ef) override {
    Shards sh{Op::kReduceScatter, send, recv, counts, dtype, ef};
    run_shards(scheme, sh, mean);
  }
  void allgather(codec::Scheme scheme, const void* send, void* recv, const uint64_t* counts, engine::DType dtype,
                 engine::ErrorFeedback* ef) override {
    Shards sh{Op::kAllgather, send, recv, counts, dtype, ef};
    run_shards(scheme, sh, false);
  }

  void fail_call(const Error& why) override {
    if (w_.broken) return;  // nothing can be exchanged any more: the caller reports its own error
    const uint32_t round = round_++;
    const std::vector<Field> fields = call_fields(nullptr, 0, false, round, 0);
    std::vector<uint32_t> hdr = words(fields, rank_, &why);
    try {
      w_.max_u32(hdr.data(), hdr.size(), "the first exchange of a call");
      judge(hdr.data(), fields, rank_, size_, &why, false, true, "this call before exchanging", w_.naming());
    } catch (const Error&) {
      // its own error (judge), or a broken communicator: the caller reports why
    }
  }

  // Nonblocking allreduces fuse into groups (requests.cc).
  bool fuses() const override { return true; }
  void max_u32(uint32_t* w, size_t n) override {
    w_.check_usable();
    w_.max_u32(w, n, "agreeing on the calls to fuse");
  }

  void allreduce(codec::Scheme scheme, const void* send, void* recv, uint64_t count, engine::DType dtype, bool mean,
                 engine::ErrorFeedback* ef) override {
    const engine::Tensor t{send, recv, count, dtype, ef};
    run(scheme, &t, 1, mean, false);
  }

 private:
  // A call on n tensors (group: a group's, else one allreduce's): every tensor is sliced as a
  // call on it alone would be, and slice l of the call holds the tensors' slices l one after
  // another (Piece). The compressed stage of slice l is one call of the inner engine on its
  // pieces (a group, on the engine's stream path: each piece's bits are those of its own call),
  // so a group's results are bit for bit those of its tensors' separate calls.
  //
  // sh: a reduce-scatter or allgather (given: the shards, tensor q rank q's; see run_shards).
  void run(codec::Scheme scheme, const engine::Tensor* given, size_t n, bool mean, bool group,
           const Shards* sh = nullptr) {
    const Op op = sh ? sh->op : Op::kAllreduce;
    uint64_t count = 0;
    size_t nonempty = 0;
    // A group's tensors or the shards: their counts in order (agreed like the count).
    uint64_t tensors = 0;
    if (group || sh) tensors = engine::digest_mix(0, 1);
    for (size_t i = 0; i < n; ++i) {
      count += given[i].count;
      if (sh) tensors = engine::digest_mix(tensors, given[i].count);
      if (given[i].count == 0) continue;
      ++nonempty;
      if (group) tensors = engine::digest_mix(tensors, given[i].count);
    }
    if (group || sh) tensors |= 1;
    if (count == 0) return;  // as a call of count 0: no exchange, on any rank
    // A reduce-scatter's state is bound to the whole input, an allgather's to the own shard.
    const uint64_t sh_bound = !sh ? 0 : (op == Op::kReduceScatter ? count : sh->counts[rank_]);
    w_.check_usable();
    // The counter advances before anything can fail, so every rank counts every call alike.
    const uint32_t round = round_++;
    std::unique_ptr<Error> own;
    bool finite = true, device = false, wrote = false;
    const codec::Codec* cod = nullptr;
    std::vector<engine::Tensor> ts(given, given + n);
    Slices sl;
    capture(&own, [&] {
      if (sh) {
        if (!sh->recv && (op == Op::kAllgather || sh->counts[rank_] > 0 || sh->send == nullptr || sh->send == THC_IN_PLACE))
          fail(Status::kInvalidArgument, std::string(op == Op::kAllgather ? "allgather" : "reduce-scatter") +
                                             ": recvbuf is NULL");
      } else {
        for (size_t i = 0; i < n; ++i) {
          engine::Tensor& t = ts[i];
          if (t.count == 0) continue;
          if (!t.recv)
            fail(Status::kInvalidArgument, group ? "tensor " + std::to_string(i) + ": recvbuf is NULL"
                                                 : std::string("allreduce: recvbuf is NULL"));
          if (!t.send || t.send == THC_IN_PLACE) t.send = t.recv;
        }
      }
      cod = &codec_for(scheme);  // a configuration that overflows fails here, before exchanging
      // (a reduce-scatter's or allgather's shards all lie in its two buffers)
      if (sh) {
        const void* in = sh->send == THC_IN_PLACE ? nullptr : sh->send;
        device = (in && engine::is_device_buffer(in)) || (sh->recv && engine::is_device_buffer(sh->recv));
      } else {
        for (const engine::Tensor& t : ts)
          if (t.count && (engine::is_device_buffer(t.send) || engine::is_device_buffer(t.recv))) device = true;
      }
      if (device) return;  // the flat engine checks the rest
      auto check_state = [](const engine::ErrorFeedback* ef, uint64_t bound, const std::string& who) {
        if (ef->count != 0 && ef->count != bound)
          fail(Status::kInvalidArgument, who + "error-feedback state was bound to count " + std::to_string(ef->count) +
                                             ", used with count " + std::to_string(bound));
        if (ef->device)
          fail(Status::kInvalidArgument, who + "error-feedback state was bound to device buffers, used with host buffers");
      };
      if (sh && sh->ef) check_state(sh->ef, sh_bound, "");
      std::set<const engine::ErrorFeedback*> efs;
      for (size_t i = 0; i < n; ++i) {
        const engine::ErrorFeedback* ef = ts[i].ef;
        if (!ef || ts[i].count == 0) continue;
        const std::string who = group ? "tensor " + std::to_string(i) + ": " : "";
        check_state(ef, ts[i].count, who);
        if (!efs.insert(ef).second)
          fail(Status::kInvalidArgument, who + "shares its error-feedback state with an earlier tensor of the group");
      }
      sl = slices(ts.data(), n);
      // With room in the arena for the whole call, the input the other slice owners read goes
      // there now (converted and checked in one pass; this rank's own slice stays in sendbuf);
      // the exchange below then also orders every rank's write before any read of it.
      if (sl.maxlen <= window()) {
        finite = put_input(ts.data(), sl, true);
        wrote = true;
      } else {
        for (int i = 0; i < slices_; ++i) finite &= check_finite(ts.data(), sl.p[i], 0, sl.len[i]);
      }
    });
    const std::vector<Field> fields = call_fields(cod, count, mean, round, tensors, op);
    std::vector<uint32_t> hdr = words(fields, rank_, own.get());
    if (!finite) engine::put_rank(&hdr[kWordRanks], rank_);
    hdr[kWordDevice] = device ? 1u : 0u;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    w_.max_u32(hdr.data(), hdr.size(), "the first exchange of a call");
    std::atomic_thread_fence(std::memory_order_seq_cst);
    judge(hdr.data(), fields, rank_, size_, own.get(), !finite, true, "this call before exchanging", w_.naming());

    if (hdr[kWordDevice] != 0) {
      // Device buffers (on some rank): the engine's GPU path, flat, on every rank.
      on_flat([&](engine::Engine& e) {
        if (op == Op::kReduceScatter) {
          e.reduce_scatter(scheme, sh->send, sh->recv, sh->counts, sh->dtype, mean, sh->ef);
        } else if (op == Op::kAllgather) {
          e.allgather(scheme, sh->send, sh->recv, sh->counts, sh->dtype, sh->ef);
        } else if (group) {
          e.allreduce_group(scheme, given, n, mean);
        } else {
          e.allreduce(scheme, given[0].send, given[0].recv, given[0].count, given[0].dtype, mean, given[0].ef);
        }
      });
      return;
    }

    // ---- intra-host reduce-scatter: slice lrank into P (in the arena's output when the whole
    // call fits, else in this rank's memory, round by round through the arena).
    bool single = wrote;
    if (!wrote) {
      if (sl.maxlen > window()) grow(sl.maxlen);
      if (sl.maxlen <= window()) {
        put_input(ts.data(), sl, false);
        barrier("every rank's input written");
        single = true;
      }
    }
    const uint64_t w = window();
    const bool owner = lrank_ < slices_;
    const std::vector<Piece> none;
    const std::vector<Piece>& mine = owner ? sl.p[static_cast<size_t>(lrank_)] : none;
    const uint64_t len = owner ? sl.len[static_cast<size_t>(lrank_)] : 0;
    float* P = nullptr;
    const uint64_t rounds = single ? 1 : (sl.maxlen + w - 1) / w;
    if (single) {
      if (owner) {
        P = output() + lrank_ * w;
        combine_slice(op, ts.data(), mine, 0, len, lrank_ * w, P);
      }
    } else {
      if (owner) {
        priv_.resize(len);
        P = priv_.data();
      }
      for (uint64_t k = 0; k < rounds; ++k) {
        if (k) barrier("a round's inputs read");
        write_round(ts.data(), sl, k, w);
        barrier("a round's inputs written");
        if (owner && k * w < len) combine_slice(op, ts.data(), mine, k * w, std::min(w, len - k * w), lrank_ * w, P + k * w);
      }
    }

    // ---- the compressed stage on this rank's slice: one inner call on its pieces.
    own.reset();
    uint64_t up = 0, down = 0;
    engine::Algo algo = engine::Algo::kInt;
    // A failure of any slice fails the call on every rank (below): the residuals are then put
    // back as they were, as if the call had not been made (the successful slices advanced
    // theirs). A state holds only what this rank's slice needs (bound to its tensor's count, as
    // the flat engine's; a residual shorter than the count reads as zero-padded, engine.h): a
    // piece's residual, the tensor's elements of this rank's slice; a reduce-scatter's state (of
    // the whole input), the residual of this rank's slice; an allgather's (bound to the own shard)
    // that of the pieces of this rank's slice that it encodes (its host's), one after another:
    // about as many elements as the shard (more when hosts have fewer slices than ranks).
    struct Binding {
      engine::ErrorFeedback* ef = nullptr;
      uint64_t len = 0;  // elements of this rank's slice it holds
    };
    std::vector<Binding> binds;
    if (op == Op::kAllreduce) {
      for (const Piece& p : mine) binds.push_back({ts[p.t].ef, p.len});
    } else if (op == Op::kReduceScatter && sh->ef && !mine.empty()) {
      binds.push_back({sh->ef, len});
    } else if (op == Op::kAllgather && sh->ef) {
      uint64_t owned = 0;
      for (const Piece& p : mine)
        if (lay_.host_of[p.t] == lay_.host_index) owned += p.len;
      if (owned) binds.push_back({sh->ef, owned});
    }
    // The inner calls update the residuals out of place, into the state's `next`, which replaces
    // the residual only once every slice has made it: a failed call leaves the residuals untouched
    // without a copy of them. `next` is the residual of the call before, equal to the residual
    // except where that call wrote (next_differs): only what this call will not overwrite of that
    // is copied (nothing while a state's slice keeps its length).
    std::vector<engine::ErrorFeedback> subs(binds.size());
    for (size_t j = 0; j < binds.size(); ++j) {
      engine::ErrorFeedback* ef = binds[j].ef;
      if (!ef) continue;
      const uint64_t len_j = binds[j].len;
      if (ef->count != 0 && ef->residual.size() < len_j) ef->residual.resize(len_j, 0.0f);  // (zeros: see engine.h)
      engine::ErrorFeedback::Buffer& res = ef->residual;
      if (ef->next.size() != res.size()) {
        ef->next = res;
      } else if (ef->next_differs > len_j) {
        const uint64_t to = std::min<uint64_t>(ef->next_differs, res.size());
        std::copy(res.begin() + static_cast<ptrdiff_t>(len_j), res.begin() + static_cast<ptrdiff_t>(to),
                  ef->next.begin() + static_cast<ptrdiff_t>(len_j));
      }
      ef->next_differs = len_j;  // (written by this call, whatever its outcome)
      subs[j].count = ef->count == 0 ? 0 : len_j;
      subs[j].residual = std::move(res);
      subs[j].out_of_place = true;
      subs[j].next = std::move(ef->next);
    }
    if (!mine.empty()) {
      capture(&own, [&] {
        const engine::EngineStats before = inner_->stats();
        if (op != Op::kAllreduce) {
          // The pieces' owners: the host (the slice group's rank) of their shard's rank.
          std::vector<engine::Engine::Part> parts;
          parts.reserve(mine.size());
          for (const Piece& p : mine) parts.push_back({p.o, p.len, lay_.host_of[p.t]});
          if (op == Op::kReduceScatter) {
            inner_->reduce_scatter_parts(scheme, P, len, parts.data(), parts.size(), false, binds.empty() ? nullptr : &subs[0]);
          } else {
            inner_->allgather_parts(scheme, P, len, parts.data(), parts.size(), binds.empty() ? nullptr : &subs[0]);
          }
        } else if (mine.size() == 1) {
          // One piece (every single allreduce): the engine's allreduce, whose host path (the PS
          // encoding into the transport's buffers) is the measured one; the same bits as a group.
          const Piece& p = mine[0];
          inner_->allreduce(scheme, P + p.o, P + p.o, p.len, engine::DType::kF32, false,
                            ts[p.t].ef ? &subs[0] : nullptr);
        } else {
          std::vector<engine::Tensor> pieces;
          pieces.reserve(mine.size());
          for (size_t j = 0; j < mine.size(); ++j)
            pieces.push_back(engine::Tensor{P + mine[j].o, P + mine[j].o, mine[j].len, engine::DType::kF32,
                                            ts[mine[j].t].ef ? &subs[j] : nullptr});
          inner_->allreduce_group(scheme, pieces.data(), pieces.size(), false);
        }
        const engine::EngineStats& after = inner_->stats();
        up = after.wire_bytes_up - before.wire_bytes_up;
        down = after.wire_bytes_down - before.wire_bytes_down;
        algo = op == Op::kAllgather ? engine::Algo::kPs : after.last_algo;
        if (mean) codec::kern::scale_by(P, len, 1.0f / static_cast<float>(size_));
      });
    }
    // As they were: the update waits in `next` for every slice's outcome.
    for (size_t j = 0; j < binds.size(); ++j) {
      if (engine::ErrorFeedback* ef = binds[j].ef) {
        ef->residual = std::move(subs[j].residual);
        ef->next = std::move(subs[j].next);
      }
    }
    // Every rank learns whether every slice made it before any output is written.
    std::vector<uint32_t> post = words({}, rank_, own.get());
    post.push_back(owner && !own ? (algo == engine::Algo::kPs ? 2u : 1u) : 0u);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    try {
      w_.max_u32(post.data(), post.size(), "after the compressed stage");
      std::atomic_thread_fence(std::memory_order_seq_cst);
      judge(post.data(), {}, rank_, size_, own.get(), false, false, "the compressed stage", w_.naming());
    } catch (const Error&) {
      for (size_t j = 0; j < binds.size(); ++j) {
        engine::ErrorFeedback* ef = binds[j].ef;
        if (ef && ef->count == 0) ef->residual.clear();  // (the inner call's zeros of a first use)
      }
      throw;
    }
    for (size_t j = 0; j < binds.size(); ++j)
      if (engine::ErrorFeedback* ef = binds[j].ef) std::swap(ef->residual, ef->next);
    // Every state of the call is bound to its tensor's count (a reduce-scatter's to the whole
    // input's), holding only this rank's slice of it (none where the rank owns no slice).
    auto bind = [](engine::ErrorFeedback* ef, uint64_t c) {
      if (ef->count == 0) ef->count = c;
    };
    for (const engine::Tensor& t : ts)
      if (t.ef && t.count) bind(t.ef, t.count);
    if (sh && sh->ef) bind(sh->ef, sh_bound);

    // ---- intra-host allgather: every rank reads the reduced slices.
    if (single) {
      for (int i = 0; i < slices_; ++i)
        store_range(ts.data(), sl.p[static_cast<size_t>(i)], 0, sl.len[static_cast<size_t>(i)],
                    output() + static_cast<uint64_t>(i) * w);
    } else {
      for (uint64_t k = 0; k < rounds; ++k) {
        if (k) barrier("a round's results read");
        if (owner && k * w < len) std::memcpy(output() + lrank_ * w, P + k * w, std::min(w, len - k * w) * sizeof(float));
        barrier("a round's results written");
        for (int i = 0; i < slices_; ++i) {
          const uint64_t a = k * w, li = sl.len[static_cast<size_t>(i)];
          if (a < li) store_range(ts.data(), sl.p[static_cast<size_t>(i)], a, std::min(w, li - a),
                                  output() + static_cast<uint64_t>(i) * w);
        }
      }
    }
    if (!single) ++streamed_;
    account(count, up, down, post.back() == 2u ? engine::Algo::kPs : engine::Algo::kInt);
    if (group || sh) stats_.calls += nonempty - 1;  // one per non-empty tensor (shard), as flat
    if (group) {
      if (nonempty > 1) {
        stats_.groups++;
        stats_.grouped_tensors += nonempty;
      }
    }
  }

  // The shards as the tensors of a call: tensor q is rank q's shard, read from this rank's input
  // (reduce-scatter: every shard; allgather: its own only) and written where this rank's result
  // goes (reduce-scatter: its own only; allgather: every shard).
  void run_shards(codec::Scheme scheme, const Shards& sh, bool mean) {
    const size_t es = engine::dtype_size(sh.dtype);
    const bool in_place = sh.send == nullptr || sh.send == THC_IN_PLACE;
    std::vector<engine::Tensor> ts(static_cast<size_t>(size_));
    uint64_t off = 0;
    for (int q = 0; q < size_; ++q) {
      engine::Tensor& t = ts[static_cast<size_t>(q)];
      t.count = sh.counts[q];
      t.dtype = sh.dtype;
      char* at = sh.recv ? static_cast<char*>(sh.recv) + off * es : nullptr;
      if (sh.op == Op::kReduceScatter) {
        const char* in = static_cast<const char*>(in_place ? sh.recv : sh.send);
        t.send = in ? in + off * es : nullptr;
        if (q == rank_) t.recv = sh.recv;
      } else {
        t.recv = at;
        if (q == rank_) t.send = in_place ? at : sh.send;
      }
      off += t.count;
    }
    run(scheme, ts.data(), ts.size(), mean, false, &sh);
  }

  // Elements [f, f + len) of tensor t, at offset o of its slice.
  struct Piece {
    size_t t = 0;
    uint64_t f = 0, len = 0, o = 0;
  };
  struct Slices {
    std::vector<std::vector<Piece>> p;  // by slice, in tensor order
    std::vector<uint64_t> len;          // by slice: its elements
    uint64_t maxlen = 0;
  };

  std::vector<Field> call_fields(const codec::Codec* cod, uint64_t count, bool mean, uint32_t round,
                                 uint64_t tensors, Op op = Op::kAllreduce) const {
    const int block_log2 = engine::log2_exact(cfg_.block);
    const uint64_t chunk_blocks =
        block_log2 < 0 ? 0 : std::max<uint64_t>(1, static_cast<uint64_t>(cfg_.chunk_bytes) / 4 / (uint64_t{1} << block_log2));
    return {
        {"the codec (scheme, THC_BITS/GRANULARITY/P/UNIFORM, THC_BLOCK, THC_NAT_*, THC_DNAT_NORM)", cod ? cod->digest() : 0},
        {"the count", count},
        {"the op (SUM or AVG)", mean ? 1u : 0u},
        {"the chunking (THC_CHUNK_BYTES, in blocks per chunk)", chunk_blocks},
        {"the algorithm (THC_ALGO)", static_cast<uint64_t>(cfg_.algo)},
        {"downstream re-compression (THC_BIDIR)", static_cast<uint64_t>(cfg_.bidir)},
        {"the call sequence (a rank skipped or added a call)", round},
        {"the tensors of a group or the shards (their counts, in order)", tensors},
        {"the collective (allreduce, reduce-scatter or allgather)", static_cast<uint64_t>(op)},
    };
  }

  const codec::Codec& codec_for(codec::Scheme scheme) {
    auto it = codecs_.find(static_cast<int>(scheme));
    if (it != codecs_.end()) return *it->second;
    if (engine::log2_exact(cfg_.block) < 10 || engine::log2_exact(cfg_.block) > 20)
      fail(Status::kInvalidArgument, "THC_BLOCK=" + std::to_string(cfg_.block) + " must be a power of two in 1024..1048576");
    // What the compressed stage's engines build: hosts_ workers (sizes the integer sums).
    auto c = std::make_unique<codec::Codec>(engine::codec_params(cfg_, scheme), hosts_);
    const codec::Codec& ref = *c;
    codecs_[static_cast<int>(scheme)] = std::move(c);
    return ref;
  }

  // ---- the arena: a control block, lsize_ input segments of S windows of w floats (window i
  // holds slice i's elements of a round), then the output of S windows.
  size_t arena_bytes(uint64_t w) const {
    return ctl_bytes(lsize_) + (static_cast<size_t>(lsize_) + 1) * static_cast<size_t>(slices_) * w * sizeof(float);
  }
  uint64_t window_for(size_t bytes) const {
    const size_t c = ctl_bytes(lsize_);
    return bytes <= c ? 0 : (bytes - c) / sizeof(float) / ((static_cast<size_t>(lsize_) + 1) * static_cast<size_t>(slices_));
  }
  uint64_t window() const { return arena_ ? window_for(arena_->bytes()) : 0; }
  float* data() const { return reinterpret_cast<float*>(arena_->base() + ctl_bytes(lsize_)); }
  float* input(int j) const { return data() + static_cast<size_t>(j) * slices_ * window(); }
  float* output() const { return input(lsize_); }

  // Creation: local rank 0 creates the arena and shares its handle (or its errno) with the other
  // local ranks, which open it. Returns 0 or this rank's errno; a timeout or a transport error
  // throws (the communicator is then broken).
  int share_arena(size_t bytes) {
    auto a = std::make_unique<Arena>();
    ArenaHandle h{};
    int err = 0;
    if (lrank_ == 0) {
      err = a->create(bytes, &h);
      h.err = err;
    }
    w_.on_net([&] { net_->share_from_first(lay_.local, lay_.host_index, hosts_, &h, sizeof h, "sharing the host's memory"); });
    if (lrank_ != 0) err = h.err != 0 ? h.err : a->open(h);
    if (err == 0) arena_ = std::move(a);
    return err;
  }

  // A larger arena for calls whose slices hold `maxlen` elements, up to THC_HIER_ARENA_BYTES,
  // agreed among the host's ranks through the current arena (every local rank calls this alike:
  // the same count, arena and bound). If it cannot be had, calls stream through the current one.
  void grow(uint64_t maxlen) {
    const uint64_t want_w = (maxlen + kFirstWindow - 1) / kFirstWindow * kFirstWindow;
    const size_t bytes = std::min(arena_bytes(want_w), cap_bytes_);
    if (bytes <= arena_->bytes() || bytes >= failed_bytes_) return;
    auto a = std::make_unique<Arena>();
    ArenaCtl* c = arena_->ctl();
    if (lrank_ == 0) {
      ArenaHandle h{};
      h.err = a->create(bytes, &h);
      c->next = h;
    }
    barrier("growing the host's shared memory");
    const ArenaHandle h = c->next;
    const int err = lrank_ == 0 ? h.err : (h.err != 0 ? h.err : a->open(h));
    arena_->status(lrank_)->store(err != 0 ? 1u : 0u, std::memory_order_relaxed);
    barrier("growing the host's shared memory");
    bool ok = true;
    for (int j = 0; j < lsize_; ++j) ok &= arena_->status(j)->load(std::memory_order_relaxed) == 0;
    if (!ok) {
      failed_bytes_ = bytes;
      if (cfg_.debug && lrank_ == 0)
        std::fprintf(stderr,
                     "thc: rank %d: THC_HIER: no shared memory of %zu bytes for the host's %d ranks%s; calls stream "
                     "through the %zu bytes it has, in rounds\n",
                     rank_, bytes, lsize_, h.err ? errno_word(static_cast<uint32_t>(h.err)).c_str() : "",
                     arena_->bytes());
      return;
    }
    a->close_fd();
    arena_ = std::move(a);
  }

  // Every local rank, bounded: a barrier in the arena (no MPI), which ranks sharing cores wait
  // for with growing naps.
  void barrier(const char* what) {
    ArenaCtl* c = arena_->ctl();
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const uint32_t g = c->gen.load(std::memory_order_acquire);
    if (c->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(lsize_)) {
      c->arrived.store(0, std::memory_order_relaxed);
      c->gen.store(g + 1, std::memory_order_release);
      return;
    }
    const auto until = w_.timeout_ms > 0 ? Clock::now() + std::chrono::milliseconds(w_.timeout_ms) : Clock::time_point::max();
    const auto start = Clock::now();
    uint64_t nap = 0;
    while (c->gen.load(std::memory_order_acquire) == g) {
      const auto now = Clock::now();
      if (now >= until)
        w_.fail_broken(Status::kTimeout, std::string("hierarchical allreduce: the host's ranks (") + what +
                                             "): a local rank did not arrive within " + std::to_string(w_.timeout_ms) +
                                             " ms (THC_TIMEOUT_MS)");
      if (now - start < std::chrono::microseconds(50)) continue;
      nap = nap ? std::min<uint64_t>(2 * nap, 20) : 10;
      std::this_thread::sleep_for(std::chrono::microseconds(nap));
    }
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }

  // Slice l of a call: of every tensor, its whole codec blocks [nb l / S, nb (l + 1) / S), as a
  // call on that tensor alone slices it; the slices cover every tensor.
  Slices slices(const engine::Tensor* ts, size_t n) const {
    Slices s;
    s.p.resize(static_cast<size_t>(slices_));
    s.len.assign(static_cast<size_t>(slices_), 0);
    const int lg = engine::log2_exact(cfg_.block);
    const uint64_t B = uint64_t{1} << (lg < 0 ? 0 : lg), S = static_cast<uint64_t>(slices_);
    for (size_t t = 0; t < n; ++t) {
      const uint64_t count = ts[t].count, nb = (count + B - 1) / B;
      for (uint64_t l = 0; l < S; ++l) {
        const uint64_t f = std::min(count, nb * l / S * B), e = std::min(count, nb * (l + 1) / S * B);
        if (e <= f) continue;
        s.p[l].push_back(Piece{t, f, e - f, s.len[l]});
        s.len[l] += e - f;
      }
    }
    for (uint64_t v : s.len) s.maxlen = std::max(s.maxlen, v);
    return s;
  }

  // fn(piece, first element of its tensor, elements, offset from a) for each part of the slice's
  // elements [a, a + n) (ps: the slice's pieces).
  template <typename Fn>
  static void each_part(const std::vector<Piece>& ps, uint64_t a, uint64_t n, Fn&& fn) {
    auto it = std::upper_bound(ps.begin(), ps.end(), a, [](uint64_t v, const Piece& p) { return v < p.o; });
    if (it != ps.begin()) --it;
    for (; it != ps.end() && it->o < a + n; ++it) {
      const uint64_t lo = std::max(a, it->o), hi = std::min(a + n, it->o + it->len);
      if (lo < hi) fn(*it, it->f + (lo - it->o), hi - lo, lo - a);
    }
  }
  // The slice's elements [a, a + n) as float32 into dst; with `check`, whether all are finite.
  static bool load_range(const engine::Tensor* ts, const std::vector<Piece>& ps, uint64_t a, uint64_t n, float* dst,
                         bool check) {
    bool ok = true;
    each_part(ps, a, n, [&](const Piece& p, uint64_t first, uint64_t m, uint64_t at) {
      const engine::Tensor& t = ts[p.t];
      if (!t.send) return;  // (an allgather's other shards)
      if (check) {
        ok &= load_checked(t.send, t.dtype, first, m, dst + at);
      } else {
        engine::load_as_float(t.send, t.dtype, first, m, nullptr, dst + at);
      }
    });
    return ok;
  }
  // src (the slice's elements [a, a + n)) into the tensors' recvbufs.
  static void store_range(const engine::Tensor* ts, const std::vector<Piece>& ps, uint64_t a, uint64_t n,
                          const float* src) {
    each_part(ps, a, n, [&](const Piece& p, uint64_t first, uint64_t m, uint64_t at) {
      const engine::Tensor& t = ts[p.t];
      if (!t.recv) return;  // (a reduce-scatter's other shards)
      engine::store_from_float(src + at, m, t.dtype, t.recv, first);
    });
  }

  // The whole call in one round: this rank's input outside its own slice into its segment, as
  // float32; with `check`, whether every element (the own slice's included) is finite.
  bool put_input(const engine::Tensor* ts, const Slices& sl, bool check) {
    const uint64_t w = window();
    bool ok = true;
    for (int i = 0; i < slices_; ++i) {
      const size_t si = static_cast<size_t>(i);
      if (i == lrank_) {
        if (check) ok &= check_finite(ts, sl.p[si], 0, sl.len[si]);
      } else {
        ok &= load_range(ts, sl.p[si], 0, sl.len[si], input(lrank_) + static_cast<uint64_t>(i) * w, check);
      }
    }
    return ok;
  }
  // Round k of a call that does not fit: each slice's elements [k w, (k+1) w).
  void write_round(const engine::Tensor* ts, const Slices& sl, uint64_t k, uint64_t w) {
    for (int i = 0; i < slices_; ++i) {
      const size_t si = static_cast<size_t>(i);
      const uint64_t a = k * w;
      if (i == lrank_ || a >= sl.len[si]) continue;
      load_range(ts, sl.p[si], a, std::min(w, sl.len[si] - a), input(lrank_) + static_cast<uint64_t>(i) * w, false);
    }
  }

  // Whether the slice's elements [a, a + n) of the tensors' inputs are all finite (float32 read
  // where it is, other types converted piece by piece).
  bool check_finite(const engine::Tensor* ts, const std::vector<Piece>& ps, uint64_t a, uint64_t n) {
    bool ok = true;
    each_part(ps, a, n, [&](const Piece& p, uint64_t first, uint64_t m, uint64_t) {
      const engine::Tensor& t = ts[p.t];
      if (!t.send) return;
      if (t.dtype == engine::DType::kF32) {
        bool bad = false;
        codec::kern::max_abs(static_cast<const float*>(t.send) + first, m, &bad);
        ok &= !bad;
        return;
      }
      scratch_.resize(kPiece);
      for (uint64_t o = 0; o < m; o += kPiece)
        ok &= load_checked(t.send, t.dtype, first + o, std::min(kPiece, m - o), scratch_.data());
    });
    return ok;
  }

  // out[i] = sum over the host's ranks j, in order, of their element a + i of this rank's slice
  // (its own from the tensors, float32 read where it is; the others' from their segments at `at`)
  void reduce_slice(const engine::Tensor* ts, const std::vector<Piece>& ps, uint64_t a, uint64_t n, uint64_t at,
                    float* out) {
    scratch_.resize(kPiece);
    auto add = [](int j, float* o, const float* x, uint64_t m) {
      if (j == 0) {
        std::memcpy(o, x, m * sizeof(float));
      } else {
        codec::kern::add_pair(o, x, m, o);
      }
    };
    for (uint64_t off = 0; off < n; off += kPiece) {
      const uint64_t m = std::min(kPiece, n - off);
      float* o = out + off;
      for (int j = 0; j < lsize_; ++j) {
        if (j != lrank_) {
          add(j, o, input(j) + at + off, m);
          continue;
        }
        each_part(ps, a + off, m, [&](const Piece& p, uint64_t first, uint64_t mm, uint64_t o2) {
          const engine::Tensor& t = ts[p.t];
          const float* x = scratch_.data() + o2;
          if (t.dtype == engine::DType::kF32) {
            x = static_cast<const float*>(t.send) + first;
          } else {
            engine::load_as_float(t.send, t.dtype, first, mm, nullptr, scratch_.data() + o2);
          }
          add(j, o + o2, x, mm);
        });
      }
    }
  }

  // What the compressed stage compresses of this rank's slice, elements [a, a + n) into out:
  // the host's sum (reduce_slice), or for an allgather each piece from the rank whose shard it is
  // where that rank is on this host (the others' pieces are not encoded here and stay as they are).
  void combine_slice(Op op, const engine::Tensor* ts, const std::vector<Piece>& ps, uint64_t a, uint64_t n,
                     uint64_t at, float* out) {
    if (op != Op::kAllgather) return reduce_slice(ts, ps, a, n, at, out);
    each_part(ps, a, n, [&](const Piece& p, uint64_t first, uint64_t m, uint64_t o) {
      const int q = static_cast<int>(p.t);
      if (lay_.host_of[static_cast<size_t>(q)] != lay_.host_index) return;
      const int j = lay_.lrank_of[static_cast<size_t>(q)];
      if (j == lrank_) {
        engine::load_as_float(ts[p.t].send, ts[p.t].dtype, first, m, nullptr, out + o);
      } else {
        std::memcpy(out + o, input(j) + at + o, m * sizeof(float));
      }
    });
  }

  // Runs fn on the flat engine (created on first use) and counts what it counted.
  template <typename Fn>
  void on_flat(Fn&& fn) {
    if (!flat_) flat_ = std::make_unique<engine::Engine>(w_.on_net([&] { return net_->flat_reducer(cfg_.timeout_ms); }), cfg_);
    const engine::EngineStats before = flat_->stats();
    try {
      fn(*flat_);
    } catch (...) {
      add_stats(before, flat_->stats());
      throw;
    }
    add_stats(before, flat_->stats());
  }
  void add_stats(const engine::EngineStats& before, const engine::EngineStats& after) {
    stats_.calls += after.calls - before.calls;
    stats_.elements += after.elements - before.elements;
    stats_.float_bytes += after.float_bytes - before.float_bytes;
    stats_.wire_bytes_up += after.wire_bytes_up - before.wire_bytes_up;
    stats_.wire_bytes_down += after.wire_bytes_down - before.wire_bytes_down;
    stats_.groups += after.groups - before.groups;
    stats_.grouped_tensors += after.grouped_tensors - before.grouped_tensors;
    if (after.calls != before.calls) stats_.last_algo = after.last_algo;
  }

  void account(uint64_t count, uint64_t up, uint64_t down, engine::Algo algo) {
    stats_.calls++;
    stats_.elements += count;
    stats_.float_bytes += count * 4;
    stats_.wire_bytes_up += up;
    stats_.wire_bytes_down += down;
    stats_.last_algo = algo;
  }

  thc_config_t cfg_;
  std::unique_ptr<HierNet> net_;
  int rank_, size_;
  HostLayout lay_;
  int lrank_, lsize_, hosts_, slices_;
  Waits w_;
  uint32_t round_ = 0;
  std::map<int, std::unique_ptr<codec::Codec>> codecs_;
  std::unique_ptr<engine::Engine> inner_;  // local ranks < slices_: slice lrank_ across hosts
  std::unique_ptr<engine::Engine> flat_;   // calls with device buffers, created on the first
  std::unique_ptr<Arena> arena_;
  size_t cap_bytes_ = 0;
  size_t failed_bytes_ = std::numeric_limits<size_t>::max();  // the smallest arena growth that failed
  uint64_t streamed_ = 0;
  std::string why_flat_;
  static constexpr uint64_t kPiece = 8192;
  std::vector<float> scratch_;
  std::vector<float> priv_;  // this rank's slice when a call streams in rounds
  engine::EngineStats stats_;
};

const char* hier_name(int v) { return v < 0 ? "auto" : (v == 0 ? "0" : "1"); }

}  // namespace

std::unique_ptr<Composite> make_hier(std::unique_ptr<HierNet> net, const thc_config_t& cfg, const HierWorld& world,
                                     bool* fusing) {
  if (cfg.hier < -1 || cfg.hier > 1)
    fail(Status::kInvalidArgument, "THC_HIER=" + std::to_string(cfg.hier) + ": expected -1 (auto), 0 or 1");
  Waits w;
  w.timeout_ms = cfg.timeout_ms;
  w.net = net.get();
  const int rank = net->rank(), size = net->size();
  const std::string emulated(cfg.hier_hosts, strnlen(cfg.hier_hosts, sizeof cfg.hier_hosts));
  std::unique_ptr<Error> own;
  int host_label = -1;
  capture(&own, [&] {
    if (emulated.empty()) return;
    const std::vector<int> sizes = parse_hosts(emulated, world.size, world.name);
    int acc = 0;
    for (size_t h = 0; h < sizes.size() && host_label < 0; ++h) {
      acc += sizes[h];
      if (world.rank < acc) host_label = static_cast<int>(h);
    }
  });
  uint64_t hh = 0;
  for (char ch : emulated) hh = engine::digest_mix(hh, static_cast<unsigned char>(ch));
  const std::vector<Field> fields = {{"THC_HIER", static_cast<uint64_t>(cfg.hier + 1)},
                                     {"THC_HIER_HOSTS", hh},
                                     {"THC_HIER_ARENA_BYTES", static_cast<uint64_t>(cfg.hier_arena_bytes)}};
  std::vector<uint32_t> agree = words(fields, rank, own.get());
  agree.push_back(cfg.fusion_bytes > 0 ? 1u : 0u);  // whether some rank fuses nonblocking calls
  w.max_u32(agree.data(), agree.size(), "creating the communicator");
  judge(agree.data(), fields, rank, size, own.get(), false, false, "while creating the communicator", w.naming());
  if (fusing) *fusing = agree.back() != 0;

  auto say = [&](const std::string& what) {
    if (cfg.debug && rank == 0)
      std::fprintf(stderr, "thc: communicator of %d ranks: THC_HIER=%s: %s\n", size, hier_name(cfg.hier), what.c_str());
  };
  if (cfg.hier == 0) {
    say("flat");
    return nullptr;
  }
  // Every rank's host: an allgather of host keys (emulated: the block's number).
  const uint64_t key = host_label >= 0 ? static_cast<uint64_t>(host_label) + 1 : machine_key();
  const std::vector<uint64_t> keys = w.on_net([&] { return net->allgather_u64(key, "the host layout"); });
  // Hosts in the order of their first ranks; local ranks in rank order.
  std::vector<uint64_t> host_keys;
  std::vector<std::vector<int>> members;
  int my_host = -1;
  for (int r = 0; r < size; ++r) {
    const uint64_t k = keys[static_cast<size_t>(r)];
    const size_t h = static_cast<size_t>(std::find(host_keys.begin(), host_keys.end(), k) - host_keys.begin());
    if (h == host_keys.size()) {
      host_keys.push_back(k);
      members.emplace_back();
    }
    members[h].push_back(r);
    if (r == rank) my_host = static_cast<int>(h);
  }
  HostLayout lay;
  lay.hosts = static_cast<int>(members.size());
  lay.host_index = my_host;
  lay.local = members[static_cast<size_t>(my_host)];
  lay.lsize = static_cast<int>(lay.local.size());
  lay.lrank = static_cast<int>(std::find(lay.local.begin(), lay.local.end(), rank) - lay.local.begin());
  for (const auto& m : members) lay.sizes.push_back(static_cast<int>(m.size()));
  lay.host_of.assign(static_cast<size_t>(size), 0);
  lay.lrank_of.assign(static_cast<size_t>(size), 0);
  for (size_t h = 0; h < members.size(); ++h)
    for (size_t l = 0; l < members[h].size(); ++l) {
      lay.host_of[static_cast<size_t>(members[h][l])] = static_cast<int>(h);
      lay.lrank_of[static_cast<size_t>(members[h][l])] = static_cast<int>(l);
    }
  lay.slices = *std::min_element(lay.sizes.begin(), lay.sizes.end());
  lay.lmax = *std::max_element(lay.sizes.begin(), lay.sizes.end());
  if (lay.lrank < lay.slices)
    for (const auto& m : members) lay.slice.push_back(m[static_cast<size_t>(lay.lrank)]);
  std::string layout;
  for (size_t h = 0; h < lay.sizes.size(); ++h) layout += (h ? "," : "") + std::to_string(lay.sizes[h]);
  layout = std::to_string(lay.hosts) + (lay.hosts == 1 ? " host" : " hosts") + " (ranks per host " + layout +
           (emulated.empty() ? ", ranks sharing a kernel and a PID namespace" : ", emulated by THC_HIER_HOSTS") + ")";
  if (lay.hosts < 2 || (cfg.hier < 0 && lay.lmax < 2)) {
    say("flat: " + layout + (lay.hosts < 2 ? "" : ", one rank per host"));
    return nullptr;
  }
  // What the slice groups' reducers need (no pair of ranks is in two of them: a slice group has
  // one rank per host).
  w.on_net([&] { net->prepare_groups(); });
  const int lmin = lay.slices, lmax = lay.lmax, hosts = lay.hosts;
  auto h = std::make_unique<HierComm>(cfg, std::move(net), rank, size, std::move(lay), std::move(w));
  if (!h->create()) {
    // Never fail a call the flat engine can do: this communicator runs flat.
    say("flat: " + layout + ": " + h->why_flat());
    return nullptr;
  }
  say("hierarchical: " + layout + ", " + std::to_string(lmin) + (lmin == 1 ? " slice" : " slices") +
      ": float reduce-scatter over each host's shared memory, local rank i < " + std::to_string(lmin) +
      " of every host runs the compressed allreduce of slice i across the " + std::to_string(hosts) +
      " hosts, allgather over shared memory" + (lmin < lmax ? "; ranks beyond the slices only contribute" : ""));
  return h;
}

}  // namespace thc::capi
