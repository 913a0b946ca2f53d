#include "mpi_wrappers/hier.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "collectives/engine/agreement.h"
#include "collectives/engine/device.h"
#include "collectives/engine/dtype.h"
#include "collectives/engine/knobs.h"
#include "collectives/engine/plan_rules.h"
#include "common/keep_forever.h"
#include "transport/mpi/mpi_reducer.h"
#include "transport/mpi/mpi_wait.h"

namespace thc::mpi {
namespace {

// Every wait bounded by THC_TIMEOUT_MS (<= 0: none), and the communicator broken after a
// failed or abandoned operation (the ranks are out of step then), as the MPI backend does.
struct Waits {
  long timeout_ms = 0;
  bool broken = false;
  std::string why;

  void check_usable() const {
    if (broken)
      fail(Status::kTransport, "hierarchical allreduce: an earlier operation on this communicator failed (" + why +
                                   "); MPI cannot cancel its collectives, so the ranks are out of step: create a new "
                                   "communicator or end the job");
  }
  [[noreturn]] void fail_broken(Status s, const std::string& msg) {
    if (!broken) {
      broken = true;
      why = msg;
    }
    fail(s, msg);
  }
  void check(int rc, const char* what) {
    if (rc == MPI_SUCCESS) return;
    fail_broken(Status::kTransport, std::string("hierarchical allreduce: ") + what + " failed: " +
                                        transport::mpi_error_text(rc));
  }
  void wait(MPI_Request* req, const char* what) {
    int rc = MPI_SUCCESS;
    switch (transport::mpi_wait_until(req, transport::mpi_deadline(timeout_ms), &rc)) {
      case transport::MpiWait::kDone: return;
      case transport::MpiWait::kError: check(rc, what); return;
      case transport::MpiWait::kTimeout: break;
    }
    fail_broken(Status::kTimeout, std::string("hierarchical allreduce: ") + what + ": a peer did not take part within " +
                                      std::to_string(timeout_ms) + " ms (THC_TIMEOUT_MS)");
  }
  // Element-wise MAX over comm, in place.
  void max_u32(MPI_Comm comm, uint32_t* data, size_t n, const char* what) {
    std::vector<uint32_t> buf(data, data + n);
    MPI_Request req = MPI_REQUEST_NULL;
    check(PMPI_Iallreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(n), MPI_UINT32_T, MPI_MAX, comm, &req), what);
    try {
      wait(&req, what);
    } catch (const Error&) {
      keep_forever(std::move(buf));
      throw;
    }
    std::memcpy(data, buf.data(), n * 4);
  }
  MPI_Comm idup(MPI_Comm comm) {
    try {
      return transport::mpi_idup_bounded(comm, timeout_ms, "hierarchical allreduce");
    } catch (const Error& e) {
      fail_broken(e.status(), e.what());
    }
  }
};

// Agreement words: a status (MAX of the failures of ranks that failed before exchanging), a
// bitmap of those ranks (mod 32), then each field as (v, ~v) in 2 + 2 words: under MAX the pair
// stays complementary only if every rank has the same v.
constexpr size_t kWordStatus = 0, kWordFailed = 1, kWordNonFinite = 2, kWordDevice = 3, kWordFields = 4;
using engine::field_agrees;
using engine::put_field;

struct Field {
  const char* what;
  uint64_t value;
};

// Throws what the exchanged words say: a rank's failure before the exchange (the own error
// for the rank that failed), then disagreeing fields, then non-finite input.
void judge(const uint32_t* w, const std::vector<Field>& fields, int rank, const Error* own, const char* stage) {
  if (w[kWordStatus] != 0) {
    if (own) throw *own;
    fail(static_cast<Status>(w[kWordStatus]),
         "hierarchical allreduce: rank(s) " + engine::rank_bitmap(w[kWordFailed]) + " (bitmap of ranks mod 32) failed " + stage +
             " (" + status_text(static_cast<Status>(w[kWordStatus])) +
             "; their own error message says why); nothing was reduced");
  }
  std::string bad;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (field_agrees(&w[kWordFields + 4 * i])) continue;
    bad += std::string(bad.empty() ? "" : ", ") + fields[i].what + " (this rank: " + std::to_string(fields[i].value) + ")";
  }
  if (!bad.empty()) fail(Status::kConfigMismatch, "hierarchical allreduce: ranks disagree on " + bad + "; nothing was reduced");
  if (w[kWordNonFinite] != 0)
    fail(Status::kNonFinite, "input contains NaN or Inf (ranks mod 32 bitmap " + engine::rank_bitmap(w[kWordNonFinite]) +
                                 "); nothing was reduced");
  (void)rank;
}

// Words for a status exchange of `fields` with this rank's failure (own, may be null).
std::vector<uint32_t> words(const std::vector<Field>& fields, int rank, const Error* own) {
  std::vector<uint32_t> w(kWordFields + 4 * fields.size(), 0);
  if (own) {
    w[kWordStatus] = static_cast<uint32_t>(own->status() == Status::kSuccess ? Status::kInternal : own->status());
    w[kWordFailed] = 1u << (rank % 32);
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

// A POSIX shared-memory mapping of one host's ranks. Local rank 0 creates the object, the
// others map it by name; it is unlinked as soon as every rank has it mapped, so it disappears
// with the last mapping, whatever happens to the processes.
class Arena {
 public:
  ~Arena() {
    if (base_ != nullptr) munmap(base_, bytes_);
  }
  float* base() const { return static_cast<float*>(base_); }

  // Collective over local (bounded waits). Returns 0 or an errno of this rank (the caller
  // agrees on the outcome across hosts, then calls unlink on local rank 0).
  int map(MPI_Comm local, int lrank, size_t bytes, Waits& w) {
    struct Msg {
      char name[48];
      int err;
    } msg{};
    if (lrank == 0) {
      std::random_device rd;
      std::snprintf(msg.name, sizeof msg.name, "/thc-hier-%08x%08x", rd(), rd());
      const int fd = shm_open(msg.name, O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd < 0) {
        msg.err = errno;
      } else {
        // Reserved now (tmpfs): a full /dev/shm is an error here, not a SIGBUS later.
        msg.err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
        if (msg.err == 0) msg.err = attach(fd, bytes);
        close(fd);
        if (msg.err != 0) shm_unlink(msg.name);
      }
      name_ = msg.name;
    }
    MPI_Request req = MPI_REQUEST_NULL;
    w.check(PMPI_Ibcast(&msg, sizeof msg, MPI_BYTE, 0, local, &req), "sharing the host's memory (MPI_Ibcast)");
    w.wait(&req, "sharing the host's memory (MPI_Ibcast)");
    if (lrank == 0 || msg.err != 0) return msg.err;
    const int fd = shm_open(msg.name, O_RDWR, 0600);
    if (fd < 0) return errno;
    const int err = attach(fd, bytes);
    close(fd);
    return err;
  }
  void unlink() {
    if (!name_.empty()) shm_unlink(name_.c_str());
    name_.clear();
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
  std::string name_;
};

// Sizes of emulated hosts, "2,2" -> {2, 2}; throws on anything else.
std::vector<int> parse_hosts(const std::string& s, int world) {
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
                                       " ranks, MPI_COMM_WORLD has " + std::to_string(world));
  return out;
}

// Elements [first, first + n) of src as float32 into dst; false if any is NaN or infinite.
// Piece by piece, so the check reads what was just written while it is in cache.
bool load_checked(const void* src, engine::DType t, uint64_t first, uint64_t n, float* dst) {
  constexpr uint64_t kPiece = 16384;
  uint32_t bad = 0;
  for (uint64_t off = 0; off < n; off += kPiece) {
    const uint64_t m = std::min(kPiece, n - off);
    float* d = dst + off;
    engine::load_as_float(src, t, first + off, m, nullptr, d);
    for (uint64_t i = 0; i < m; ++i) {
      uint32_t u;
      std::memcpy(&u, d + i, 4);
      bad |= static_cast<uint32_t>((u & 0x7F800000u) == 0x7F800000u);
    }
  }
  return bad == 0;
}

class HierComm final : public capi::Composite {
 public:
  HierComm(const thc_config_t& cfg, MPI_Comm ctl, MPI_Comm local, int rank, int size, int lrank, int lsize, int hosts,
           int slices, Waits w)
      : cfg_(cfg), ctl_(ctl), local_(local), rank_(rank), size_(size), lrank_(lrank), lsize_(lsize), hosts_(hosts),
        slices_(slices), w_(std::move(w)) {}

  ~HierComm() override {
    inner_.reset();
    flat_.reset();
    arena_.reset();
    int finalized = 0;
    PMPI_Finalized(&finalized);
    // A broken communicator keeps its duplicates (context ids of abandoned operations must not
    // be reused), as the MPI backend does.
    if (!finalized && !w_.broken) {
      if (local_ != MPI_COMM_NULL) PMPI_Comm_free(&local_);
      if (ctl_ != MPI_COMM_NULL) PMPI_Comm_free(&ctl_);
    }
  }

  // Creation, after the layout: the compressed stage's engine for slice lrank (every rank
  // agrees on the outcome).
  void create_inner() {
    std::unique_ptr<Error> own;
    MPI_Comm inner = MPI_COMM_NULL;
    w_.check(PMPI_Comm_split(ctl_, lrank_ < slices_ ? lrank_ : MPI_UNDEFINED, rank_, &inner),
             "the communicator of one slice across hosts (MPI_Comm_split)");
    if (inner != MPI_COMM_NULL) {
      capture(&own, [&] {
        thc_config_t c = cfg_;
        // Independent randomness per slice; slice 0 keeps THC_SEED itself (one rank per host
        // and THC_HIER=1 then gives the flat engine's bits).
        if (c.seed != 0 && lrank_ > 0) c.seed = engine::digest_mix(c.seed, static_cast<uint64_t>(lrank_)) | 1;
        inner_ = std::make_unique<engine::Engine>(transport::make_mpi_reducer(inner, c.timeout_ms), c);
      });
      PMPI_Comm_free(&inner);
    }
    std::vector<uint32_t> w = words({}, rank_, own.get());
    w_.max_u32(ctl_, w.data(), w.size(), "creating the hierarchical communicator (MPI_Iallreduce)");
    judge(w.data(), {}, rank_, own.get(), "while creating the communicator");
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const thc_config_t& config() const override { return cfg_; }
  int hosts() const override { return hosts_; }
  engine::EngineStats stats() const override { return stats_; }
  std::string wire_stats() const override {
    char b[200];
    std::snprintf(b, sizeof b, "hierarchical: host %d of %d, local rank %d of %d, %s; %llu calls", host_index_, hosts_,
                  lrank_, lsize_, lrank_ < slices_ ? "compresses a slice" : "contributes only",
                  static_cast<unsigned long long>(stats_.calls));
    return b;
  }
  void set_host_index(int h) { host_index_ = h; }

  void allreduce(codec::Scheme scheme, const void* send, void* recv, uint64_t count, engine::DType dtype, bool mean,
                 engine::ErrorFeedback* ef) override {
    if (count == 0) return;
    w_.check_usable();
    // The counter advances before anything can fail, so every rank counts every call alike.
    const uint32_t round = round_++;
    std::unique_ptr<Error> own;
    bool finite = true, device = false, wrote = false;
    const codec::Codec* cod = nullptr;
    uint64_t f = 0, e = 0;  // this rank's slice (empty beyond the slices)
    capture(&own, [&] {
      if (!recv) fail(Status::kInvalidArgument, "allreduce: recvbuf is NULL");
      if (!send || send == THC_IN_PLACE) send = recv;
      cod = &codec_for(scheme);  // a configuration that overflows fails here, before exchanging
      device = engine::is_device_buffer(send) || engine::is_device_buffer(recv);
      if (device) return;  // the flat engine checks the rest
      if (ef && ef->count != 0 && ef->count != count)
        fail(Status::kInvalidArgument, "error-feedback state was bound to count " + std::to_string(ef->count) +
                                           ", used with count " + std::to_string(count));
      if (ef && ef->device)
        fail(Status::kInvalidArgument, "error-feedback state was bound to device buffers, used with host buffers");
      // With room in the arena, the input the other slice owners read goes there now
      // (converted and checked in one pass; this rank's own slice stays in sendbuf); the
      // exchange below then also orders every rank's write before any read of it.
      slice_of(count, lrank_, &f, &e);
      if (count <= cap_) {
        finite = put_input(send, dtype, count, f, e);
        wrote = true;
      } else {
        finite = check_finite(send, dtype, 0, count);
      }
    });
    const int block_log2 = engine::log2_exact(cfg_.block);
    const uint64_t chunk_blocks =
        block_log2 < 0 ? 0 : std::max<uint64_t>(1, static_cast<uint64_t>(cfg_.chunk_bytes) / 4 / (uint64_t{1} << block_log2));
    const std::vector<Field> fields = {
        {"the codec (scheme, THC_BITS/GRANULARITY/P/UNIFORM, THC_BLOCK, THC_NAT_*, THC_DNAT_NORM)", cod ? cod->digest() : 0},
        {"the count", count},
        {"the op (SUM or AVG)", mean ? 1u : 0u},
        {"the chunking (THC_CHUNK_BYTES, in blocks per chunk)", chunk_blocks},
        {"the algorithm (THC_ALGO)", static_cast<uint64_t>(cfg_.algo)},
        {"downstream re-compression (THC_BIDIR)", static_cast<uint64_t>(cfg_.bidir)},
        {"the call sequence (a rank skipped or added a call)", round},
    };
    std::vector<uint32_t> hdr = words(fields, rank_, own.get());
    hdr[kWordNonFinite] = finite ? 0u : (1u << (rank_ % 32));
    hdr[kWordDevice] = device ? 1u : 0u;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    w_.max_u32(ctl_, hdr.data(), hdr.size(), "the first exchange of a call (MPI_Iallreduce)");
    std::atomic_thread_fence(std::memory_order_seq_cst);
    judge(hdr.data(), fields, rank_, own.get(), "this call before exchanging");

    if (hdr[kWordDevice] != 0) {
      // Device buffers (on some rank): the engine's GPU path, flat, on every rank.
      if (!flat_) flat_ = std::make_unique<engine::Engine>(transport::make_mpi_reducer(ctl_, cfg_.timeout_ms), cfg_);
      const engine::EngineStats before = flat_->stats();
      flat_->allreduce(scheme, send, recv, count, dtype, mean, ef);
      const engine::EngineStats& after = flat_->stats();
      account(count, after.wire_bytes_up - before.wire_bytes_up, after.wire_bytes_down - before.wire_bytes_down,
              after.last_algo);
      return;
    }
    if (count > cap_) grow(count);
    if (!wrote) {
      put_input(send, dtype, count, f, e);
      barrier_local();
    }

    // The compressed stage on this rank's slice, in place in the arena's output.
    own.reset();
    uint64_t up = 0, down = 0;
    engine::Algo algo = engine::Algo::kInt;
    if (lrank_ < slices_) {
      float* mine = output() + f;
      reduce_slice(send, dtype, f, e - f, mine);
      engine::ErrorFeedback sub;
      // The slice's residual sits at the front of the state's vector, which keeps `count`
      // elements (as the flat engine's would) so the state stays safe to hand to any call.
      if (ef) {
        sub.count = ef->count == 0 ? 0 : e - f;
        sub.residual = std::move(ef->residual);
      }
      capture(&own, [&] {
        const engine::EngineStats before = inner_->stats();
        inner_->allreduce(scheme, mine, mine, e - f, engine::DType::kF32, false, ef ? &sub : nullptr);
        const engine::EngineStats& after = inner_->stats();
        up = after.wire_bytes_up - before.wire_bytes_up;
        down = after.wire_bytes_down - before.wire_bytes_down;
        algo = after.last_algo;
        if (mean) {
          const float s = 1.0f / static_cast<float>(size_);
          for (uint64_t i = 0; i < e - f; ++i) mine[i] *= s;
        }
      });
      if (ef) {
        ef->residual = std::move(sub.residual);
        if (ef->count == 0 && sub.count != 0) ef->count = count;
        if (ef->count != 0 && ef->residual.size() < count) ef->residual.resize(count, 0.0f);
      }
    } else if (ef && ef->count == 0) {
      ef->count = count;
      ef->residual.assign(count, 0.0f);
    }
    // Every rank learns whether every slice made it before any output is written.
    std::vector<uint32_t> post = words({}, rank_, own.get());
    post.push_back(lrank_ < slices_ && !own ? (algo == engine::Algo::kPs ? 2u : 1u) : 0u);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    w_.max_u32(ctl_, post.data(), post.size(), "after the compressed stage (MPI_Iallreduce)");
    std::atomic_thread_fence(std::memory_order_seq_cst);
    judge(post.data(), {}, rank_, own.get(), "the compressed stage");
    engine::store_from_float(output(), count, dtype, recv, 0);
    account(count, up, down, post.back() == 2u ? engine::Algo::kPs : engine::Algo::kInt);
  }

  // A call the C API refused on this rank (requests.cc): its place in the first exchange, with the
  // fields of no call (the failure decides the outcome before they are compared).
  void fail_call(Status why, const std::string& msg) override {
    w_.check_usable();
    round_++;
    const Error own(why == Status::kSuccess ? Status::kInternal : why, msg);
    const std::vector<Field> fields = {{"the codec", 0}, {"the count", 0}, {"the op", 0}, {"the chunking", 0},
                                       {"the algorithm", 0}, {"downstream re-compression", 0},
                                       {"the call sequence", 0}};
    std::vector<uint32_t> hdr = words(fields, rank_, &own);
    w_.max_u32(ctl_, hdr.data(), hdr.size(), "the first exchange of a call (MPI_Iallreduce)");
    judge(hdr.data(), fields, rank_, &own, "this call before exchanging");
  }

 private:
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

  // Arena layout: lsize_ input segments of cap_ floats, then the output of cap_ floats.
  float* input(int j) const { return arena_->base() + static_cast<size_t>(j) * cap_; }
  float* output() const { return arena_->base() + static_cast<size_t>(lsize_) * cap_; }

  // A larger arena for `count` elements; every rank of every host agrees on the outcome.
  void grow(uint64_t count) {
    const uint64_t cap = (count + 4095) / 4096 * 4096;
    auto a = std::make_unique<Arena>();
    const size_t bytes = (static_cast<size_t>(lsize_) + 1) * cap * sizeof(float);
    const int err = a->map(local_, lrank_, bytes, w_);
    uint32_t st[2] = {err ? 1u : 0u, err ? (1u << (rank_ % 32)) : 0u};
    w_.max_u32(ctl_, st, 2, "sharing the host's memory (MPI_Iallreduce)");
    if (lrank_ == 0) a->unlink();  // every local rank has mapped it (or failed) by now
    if (st[0] != 0) {
      std::string msg = "hierarchical allreduce: no shared memory of " + std::to_string(bytes) +
                        " bytes for the host's ranks (POSIX shm in /dev/shm) on rank(s) " + engine::rank_bitmap(st[1]) +
                        " (bitmap of ranks mod 32)";
      if (err) msg += std::string(": ") + std::strerror(err);
      fail(Status::kOutOfMemory, msg + "; nothing was reduced");
    }
    arena_ = std::move(a);
    cap_ = cap;
  }

  void barrier_local() {
    MPI_Request req = MPI_REQUEST_NULL;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    w_.check(PMPI_Ibarrier(local_, &req), "the host's ranks (MPI_Ibarrier)");
    w_.wait(&req, "the host's ranks (MPI_Ibarrier)");
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }

  // Slice l of a call: whole codec blocks, [*f, *e); empty for local ranks beyond the slices.
  void slice_of(uint64_t count, int l, uint64_t* f, uint64_t* e) const {
    *f = *e = 0;
    const int lg = engine::log2_exact(cfg_.block);
    if (l >= slices_ || lg < 0) return;
    const uint64_t B = uint64_t{1} << lg, nb = (count + B - 1) / B;
    *f = std::min(count, nb * static_cast<uint64_t>(l) / slices_ * B);
    *e = std::min(count, nb * static_cast<uint64_t>(l + 1) / slices_ * B);
  }

  // This rank's input outside its own slice [f, e) into its arena segment, as float32; false if
  // any element (the own slice's included) is NaN or infinite.
  bool put_input(const void* send, engine::DType dtype, uint64_t count, uint64_t f, uint64_t e) {
    bool ok = load_checked(send, dtype, 0, f, input(lrank_));
    ok &= check_finite(send, dtype, f, e - f);
    ok &= load_checked(send, dtype, e, count - e, input(lrank_) + e);
    return ok;
  }

  bool check_finite(const void* send, engine::DType dtype, uint64_t first, uint64_t n) {
    scratch_.resize(kPiece);
    bool ok = true;
    for (uint64_t off = 0; off < n; off += kPiece)
      ok &= load_checked(send, dtype, first + off, std::min(kPiece, n - off), scratch_.data());
    return ok;
  }

  // out[i] = sum over the host's ranks j, in order, of their element first + i (this rank's
  // own from sendbuf, the others' from the arena)
  void reduce_slice(const void* send, engine::DType dtype, uint64_t first, uint64_t n, float* out) {
    scratch_.resize(kPiece);
    for (uint64_t off = 0; off < n; off += kPiece) {
      const uint64_t m = std::min(kPiece, n - off);
      float* o = out + off;
      for (int j = 0; j < lsize_; ++j) {
        const float* x = input(j) + first + off;
        if (j == lrank_) {
          engine::load_as_float(send, dtype, first + off, m, nullptr, scratch_.data());
          x = scratch_.data();
        }
        if (j == 0) {
          std::memcpy(o, x, m * sizeof(float));
        } else {
          for (uint64_t i = 0; i < m; ++i) o[i] += x[i];
        }
      }
    }
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
  MPI_Comm ctl_, local_;
  int rank_, size_, lrank_, lsize_, hosts_, slices_;
  int host_index_ = 0;
  Waits w_;
  uint32_t round_ = 0;
  std::map<int, std::unique_ptr<codec::Codec>> codecs_;
  std::unique_ptr<engine::Engine> inner_;  // local ranks < slices_: slice lrank_ across hosts
  std::unique_ptr<engine::Engine> flat_;   // calls with device buffers, created on the first
  std::unique_ptr<Arena> arena_;
  uint64_t cap_ = 0;
  static constexpr uint64_t kPiece = 8192;
  std::vector<float> scratch_;
  engine::EngineStats stats_;
};

const char* hier_name(int v) { return v < 0 ? "auto" : (v == 0 ? "0" : "1"); }

}  // namespace

std::unique_ptr<capi::Composite> make_hier(MPI_Comm comm, const thc_config_t& cfg) {
  int inter = 0;
  THC_CHECK_MPI(PMPI_Comm_test_inter(comm, &inter));
  if (inter) return nullptr;  // the flat backend says what is unsupported
  if (cfg.hier < -1 || cfg.hier > 1)
    fail(Status::kInvalidArgument, "THC_HIER=" + std::to_string(cfg.hier) + ": expected -1 (auto), 0 or 1");
  Waits w;
  w.timeout_ms = cfg.timeout_ms;
  // Bounded like every wait of thc: a rank that never creates its communicator makes the
  // others fail within THC_TIMEOUT_MS. The blocking splits below come after the agreement,
  // which every rank has reached.
  MPI_Comm ctl = w.idup(comm);
  THC_CHECK_MPI(PMPI_Comm_set_errhandler(ctl, MPI_ERRORS_RETURN));
  struct Free {
    MPI_Comm* c;
    ~Free() {
      if (c && *c != MPI_COMM_NULL) PMPI_Comm_free(c);
    }
  } free_ctl{&ctl};
  int rank = 0, size = 1, world = 1, wrank = 0;
  THC_CHECK_MPI(PMPI_Comm_rank(ctl, &rank));
  THC_CHECK_MPI(PMPI_Comm_size(ctl, &size));
  THC_CHECK_MPI(PMPI_Comm_size(MPI_COMM_WORLD, &world));
  THC_CHECK_MPI(PMPI_Comm_rank(MPI_COMM_WORLD, &wrank));
  const std::string emulated(cfg.hier_hosts, strnlen(cfg.hier_hosts, sizeof cfg.hier_hosts));
  std::unique_ptr<Error> own;
  int host_label = -1;
  capture(&own, [&] {
    if (emulated.empty()) return;
    const std::vector<int> sizes = parse_hosts(emulated, world);
    int acc = 0;
    for (size_t h = 0; h < sizes.size() && host_label < 0; ++h) {
      acc += sizes[h];
      if (wrank < acc) host_label = static_cast<int>(h);
    }
  });
  uint64_t hh = 0;
  for (char ch : emulated) hh = engine::digest_mix(hh, static_cast<unsigned char>(ch));
  const std::vector<Field> fields = {{"THC_HIER", static_cast<uint64_t>(cfg.hier + 1)},
                                     {"THC_HIER_HOSTS", hh}};
  std::vector<uint32_t> agree = words(fields, rank, own.get());
  w.max_u32(ctl, agree.data(), agree.size(), "creating the communicator (MPI_Iallreduce)");
  judge(agree.data(), fields, rank, own.get(), "while creating the communicator");

  auto say = [&](const std::string& what) {
    if (cfg.debug && rank == 0)
      std::fprintf(stderr, "thc: communicator of %d ranks: THC_HIER=%s: %s\n", size, hier_name(cfg.hier), what.c_str());
  };
  if (cfg.hier == 0) {
    say("flat");
    return nullptr;
  }
  MPI_Comm local = MPI_COMM_NULL;
  if (host_label >= 0) {
    THC_CHECK_MPI(PMPI_Comm_split(ctl, host_label, rank, &local));
  } else {
    THC_CHECK_MPI(PMPI_Comm_split_type(ctl, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local));
  }
  Free free_local{&local};
  int lrank = 0, lsize = 1;
  THC_CHECK_MPI(PMPI_Comm_rank(local, &lrank));
  THC_CHECK_MPI(PMPI_Comm_size(local, &lsize));
  // Every rank's place (local rank, host size, the host's first rank): hosts in the order of
  // their first ranks.
  int leader = 0;
  {
    MPI_Group lg, cg;
    THC_CHECK_MPI(PMPI_Comm_group(local, &lg));
    THC_CHECK_MPI(PMPI_Comm_group(ctl, &cg));
    const int zero = 0;
    THC_CHECK_MPI(PMPI_Group_translate_ranks(lg, 1, &zero, cg, &leader));
    PMPI_Group_free(&lg);
    PMPI_Group_free(&cg);
  }
  std::vector<int> places(3 * static_cast<size_t>(size));
  {
    const int mine[3] = {lrank, lsize, leader};
    MPI_Request req = MPI_REQUEST_NULL;
    w.check(PMPI_Iallgather(mine, 3, MPI_INT, places.data(), 3, MPI_INT, ctl, &req), "the host layout (MPI_Iallgather)");
    w.wait(&req, "the host layout (MPI_Iallgather)");
  }
  std::vector<int> host_sizes;
  int host_index = -1;
  for (int r = 0; r < size; ++r) {
    if (places[3 * r] != 0) continue;
    if (r == leader) host_index = static_cast<int>(host_sizes.size());
    host_sizes.push_back(places[3 * r + 1]);
  }
  const int hosts = static_cast<int>(host_sizes.size());
  const int lmin = *std::min_element(host_sizes.begin(), host_sizes.end());
  const int lmax = *std::max_element(host_sizes.begin(), host_sizes.end());
  std::string layout;
  for (size_t h = 0; h < host_sizes.size(); ++h) layout += (h ? "," : "") + std::to_string(host_sizes[h]);
  layout = std::to_string(hosts) + (hosts == 1 ? " host" : " hosts") + " (ranks per host " + layout +
           (emulated.empty() ? ", MPI_COMM_TYPE_SHARED" : ", emulated by THC_HIER_HOSTS") + ")";
  if (hosts < 2 || (cfg.hier < 0 && lmax < 2)) {
    say("flat: " + layout + (hosts < 2 ? "" : ", one rank per host"));
    return nullptr;
  }
  auto h = std::make_unique<HierComm>(cfg, ctl, local, rank, size, lrank, lsize, hosts, lmin, std::move(w));
  ctl = MPI_COMM_NULL;
  local = MPI_COMM_NULL;
  h->set_host_index(host_index);
  h->create_inner();
  say("hierarchical: " + layout + ", " + std::to_string(lmin) +
      " slices: float reduce-scatter over each host's shared memory, local rank i < " + std::to_string(lmin) +
      " of every host runs the compressed allreduce of slice i across the " + std::to_string(hosts) +
      " hosts, allgather over shared memory" + (lmin < lmax ? "; ranks beyond the slices only contribute" : ""));
  return h;
}

}  // namespace thc::mpi
