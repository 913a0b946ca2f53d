// Calls on several tensors as one stream: groups (thc_allreduce_group, fused nonblocking
// allreduces), compressed reduce-scatter and lossy allgather.
//
// Each tensor (a group's member, a reduce-scatter's or allgather's shard) keeps a layout of its
// own: whole blocks that never span two tensors, its own block statistics, and the randomness of
// one call round (the i-th tensor with elements uses round r + i). So a tensor's codes are those
// a call on it alone would send as the i-th of as many calls, and its result is bit-identical to
// that call's: fusing changes only how many exchanges and pipelines there are. (With THC_BIDIR the
// re-compressed shard sums draw per operation, so there the bits differ.)
//
// One first exchange carries every tensor's statistics, then one pipeline of chunks (up to
// THC_CHUNK_BYTES of wire elements, whole blocks) over all tensors' blocks, encoding chunk k+1
// while chunk k is aggregated, as for one tensor. In a chunk each tensor's run of blocks starts
// at a multiple of 8 wire elements (whole bytes of packed codes); on a backend that may return
// partial aggregates every block takes B wire elements, so that the backend's parts (cut at
// multiples of B) never split a block.
//
// Reduce-scatter: shard q is tensor q and rank q its only decoder. Chunk k takes the k-th slice
// of every shard, so each chunk's operation is a balanced reduce-scatter (rank q receives its
// slice) rather than the whole chunk going to one owner. Allgather: rank q alone encodes shard q
// (the other ranks' statistics for it are 0 under the MAX), the chunks' packed codes are gathered
// and every rank looks up and decodes every shard with one contributor.
//
// Tensors in device memory (each tensor's send and recv on one side; a call may mix) go through
// the device codec (DeviceStream, libthc_cuda): statistics, encode and decode run on the GPU and
// only a run's codes and sums cross to and from the chunk's host buffers, so chunks, exchanges
// and results are those of the same call on host buffers.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>

#include "collectives/engine/engine.h"
#include "collectives/engine/plan_rules.h"

namespace thc::engine {

namespace {

enum class Kind { kAllreduce = 1, kReduceScatter = 2, kAllgather = 3 };

uint64_t align8(uint64_t v) { return (v + 7) / 8 * 8; }

}  // namespace

struct Engine::Stream {
  struct Seg {
    const void* send = nullptr;  // this rank's input of the tensor; nullptr: it contributes nothing
    void* recv = nullptr;        // where this rank's result goes; nullptr: it does not decode it
    uint64_t count = 0;
    DType dtype = DType::kF32;   // of send
    DType out_dtype = DType::kF32;  // of recv
    ErrorFeedback* ef = nullptr;    // the state to bind (count ef_count), and the residual below
    uint64_t ef_count = 0;
    float* res = nullptr;           // the tensor's residual (set once bound; device memory if dev)
    float* res_out = nullptr;       // where the updated residual goes (res itself unless out of place)
    uint64_t res_off = 0;           // its offset in the residual (and in the updated one)
    bool dev = false;               // send and recv are device memory (the device codec's)
    codec::Layout lay;
    codec::CallRng rng;
    uint64_t g0 = 0;  // first global block
    int owner = -1;   // reduce-scatter: its only decoder; allgather: its only encoder
  };
  Kind kind = Kind::kAllreduce;
  codec::Scheme scheme = codec::Scheme::kThc;
  bool mean = false;
  bool parts = false;  // reduce_scatter_parts / allgather_parts: in place, owners given
  std::vector<Seg> segs;
  std::string bad;  // an argument this rank refuses (checked where a failure is shared)
  Status bad_status = Status::kInvalidArgument;
};

void Engine::allreduce_group(codec::Scheme scheme, const Tensor* ts, size_t n, bool mean) {
  Stream st;
  st.kind = Kind::kAllreduce;
  st.scheme = scheme;
  st.mean = mean;
  for (size_t i = 0; i < n; ++i) {
    const Tensor& t = ts[i];
    if (t.count == 0) continue;  // nothing of it travels (as a call of count 0)
    Stream::Seg s;
    s.recv = t.recv;
    s.send = (t.send == nullptr || t.send == THC_IN_PLACE) ? t.recv : t.send;
    s.count = t.count;
    s.dtype = s.out_dtype = t.dtype;
    s.ef = t.ef;
    s.ef_count = t.count;
    if (!t.recv && st.bad.empty()) st.bad = "tensor " + std::to_string(i) + ": recvbuf is NULL";
    for (size_t j = 0; j < i && t.ef && st.bad.empty(); ++j)
      if (ts[j].ef == t.ef && ts[j].count != 0)
        st.bad = "tensors " + std::to_string(j) + " and " + std::to_string(i) + " share one error-feedback state";
    st.segs.push_back(s);
  }
  run_stream(st);
}

void Engine::reduce_scatter(codec::Scheme scheme, const void* send, void* recv, const uint64_t* counts, DType dtype,
                            bool mean, ErrorFeedback* ef) {
  Stream st;
  st.kind = Kind::kReduceScatter;
  st.scheme = scheme;
  st.mean = mean;
  const int n = size();
  uint64_t total = 0;
  for (int q = 0; q < n; ++q) total += counts[q];
  const bool in_place = send == nullptr || send == THC_IN_PLACE;
  const char* in = static_cast<const char*>(in_place ? recv : send);
  uint64_t off = 0;
  for (int q = 0; q < n; ++q) {
    Stream::Seg s;
    s.count = counts[q];
    s.dtype = s.out_dtype = dtype;
    s.send = in ? in + off * dtype_size(dtype) : nullptr;
    if (q == rank()) s.recv = recv;
    s.ef = ef;
    s.ef_count = total;
    s.res_off = off;
    s.owner = q;
    st.segs.push_back(s);
    off += counts[q];
  }
  if (!recv && (counts[rank()] > 0 || (in_place && total > 0))) st.bad = "recvbuf is NULL";
  run_stream(st);
}

void Engine::allgather(codec::Scheme scheme, const void* send, void* recv, const uint64_t* counts, DType dtype,
                       ErrorFeedback* ef) {
  Stream st;
  st.kind = Kind::kAllgather;
  st.scheme = scheme;
  const int n = size();
  uint64_t total = 0, off = 0;
  for (int q = 0; q < n; ++q) total += counts[q];
  for (int q = 0; q < n; ++q) {
    Stream::Seg s;
    s.count = counts[q];
    s.dtype = s.out_dtype = dtype;
    s.recv = recv ? static_cast<char*>(recv) + off * dtype_size(dtype) : nullptr;
    if (q == rank()) {
      s.send = (send == nullptr || send == THC_IN_PLACE) ? s.recv : send;
      s.ef = ef;
      s.ef_count = counts[q];
    }
    s.owner = q;
    st.segs.push_back(s);
    off += counts[q];
  }
  if (total != 0 && !recv) st.bad = "recvbuf is NULL";
  run_stream(st);
}

namespace {
// The i-th part's problem, if any ("" when it is well formed).
std::string part_problem(const Engine::Part& p, size_t i, uint64_t count, int n, const float* buf) {
  if (p.owner < 0 || p.owner >= n) return "part " + std::to_string(i) + ": owner " + std::to_string(p.owner) + " is no rank";
  if (p.off > count || p.count > count - p.off) return "part " + std::to_string(i) + " lies beyond the buffer";
  if (p.count && !buf) return "the buffer is NULL";
  return "";
}
}  // namespace

void Engine::reduce_scatter_parts(codec::Scheme scheme, float* buf, uint64_t count, const Part* parts, size_t n,
                                  bool mean, ErrorFeedback* ef) {
  run_parts(static_cast<int>(Kind::kReduceScatter), scheme, buf, count, parts, n, mean, ef);
}

void Engine::allgather_parts(codec::Scheme scheme, float* buf, uint64_t count, const Part* parts, size_t n,
                             ErrorFeedback* ef) {
  run_parts(static_cast<int>(Kind::kAllgather), scheme, buf, count, parts, n, false, ef);
}

// Every part reads and writes its place in buf. Reduce-scatter: every rank encodes every part, its
// owner decodes it; the state holds the residual of the whole buffer. Allgather: the owner encodes
// it, every rank decodes it; the state holds the residuals of the own parts one after another.
void Engine::run_parts(int kind, codec::Scheme scheme, float* buf, uint64_t count, const Part* parts, size_t n,
                       bool mean, ErrorFeedback* ef) {
  Stream st;
  st.kind = static_cast<Kind>(kind);
  st.scheme = scheme;
  st.mean = mean;
  st.parts = true;
  const bool rs = st.kind == Kind::kReduceScatter;
  uint64_t owned = 0;
  for (size_t i = 0; i < n; ++i)
    if (parts[i].owner == rank()) owned += parts[i].count;
  uint64_t owned_off = 0;
  for (size_t i = 0; i < n; ++i) {
    const Part& p = parts[i];
    if (st.bad.empty()) st.bad = part_problem(p, i, count, size(), buf);
    const bool own = p.owner == rank();
    float* at = buf ? buf + p.off : nullptr;
    Stream::Seg s;
    s.count = p.count;
    s.owner = p.owner;
    s.send = rs || own ? at : nullptr;
    s.recv = !rs || own ? at : nullptr;
    if (rs || own) {
      s.ef = ef;
      s.ef_count = rs ? count : owned;
      s.res_off = rs ? p.off : owned_off;
    }
    if (own) owned_off += p.count;
    st.segs.push_back(s);
  }
  run_stream(st);
}

void Engine::run_stream(Stream& st) {
  using Seg = Stream::Seg;
  const int n = size();
  const int me = rank();
  uint64_t total = 0;
  uint32_t calls = 0;
  for (const Seg& s : st.segs) {
    total += s.count;
    if (s.count) ++calls;
  }
  if (total == 0) return;  // as a call of count 0: no communication, so it must be 0 everywhere

  // What can fail before the first exchange fails on this rank alone; it still takes part in the
  // exchange (abort_prelude), so every rank fails the call, and the call counts everywhere.
  const uint32_t round0 = round_;
  CallPlan plan;
  const codec::Codec* codp = nullptr;
  bool pad_blocks = false;
  std::unique_ptr<DeviceStream> ds;
  try {
    if (!st.bad.empty()) fail(st.bad_status, st.bad);
    if (st.kind == Kind::kAllgather && reducer_->partial_results())
      fail(Status::kUnsupported, "allgather on a backend with partial aggregation (THC_QUORUM): a missing rank's shard "
                                 "would be lost");
    // Tensors in device memory are encoded and decoded by the device codec where they live
    // (DeviceStream); only their codes and sums pass through host memory.
    std::vector<const void*> dev_ptrs;
    DeviceBackend* backend = nullptr;
    for (size_t i = 0; i < st.segs.size(); ++i) {
      Seg& s = st.segs[i];
      if (s.count == 0) continue;
      DeviceBackend* bs = backend_for(s.send);
      DeviceBackend* br = backend_for(s.recv);
      if (s.send && s.recv && (bs != nullptr) != (br != nullptr))
        fail(Status::kInvalidArgument, "tensor " + std::to_string(i) +
                                           ": sendbuf and recvbuf must both be host memory or both device memory");
      s.dev = bs || br;
      if (s.dev) {
        backend = bs ? bs : br;
        for (const void* p : {s.send, static_cast<const void*>(s.recv)})
          if (p) dev_ptrs.push_back(p);
        if (s.dtype == DType::kF64)
          fail(Status::kUnsupported, "float64 device buffers: the GPU codec takes float32, float16 and bfloat16");
      }
      if (s.ef && s.ef->count != 0 && s.ef->count != s.ef_count)
        fail(Status::kInvalidArgument, "error-feedback state was bound to count " + std::to_string(s.ef->count) +
                                           ", used with count " + std::to_string(s.ef_count));
      if (s.ef && s.ef->out_of_place && s.dev)
        fail(Status::kUnsupported, "tensor " + std::to_string(i) + ": out-of-place error feedback takes host buffers only");
      if (s.ef && s.ef->count != 0 && (s.ef->device != nullptr) != s.dev)
        fail(Status::kInvalidArgument, std::string("error-feedback state was bound to ") +
                                           (s.ef->device ? "device" : "host") + " buffers, used with " +
                                           (s.dev ? "device" : "host") + " buffers");
    }
    if (backend) {
      if (!device_) device_ = backend->open();
      ds = device_->stream(dev_ptrs);
    }
    plan = this->plan(st.scheme, total, st.segs.empty() ? DType::kF32 : st.segs[0].dtype, st.mean);
    codp = plan.cod;
    uint64_t h = digest_mix(0, static_cast<uint64_t>(st.kind));
    for (const Seg& s : st.segs) h = digest_mix(digest_mix(h, static_cast<uint64_t>(s.owner + 1)), s.count);
    plan.tensors_digest = h | 1;
    h = 0;
    for (const PreludeField& f : prelude_fields(plan)) h = digest_mix(h, f.value);
    plan.digest = h;
    pad_blocks = reducer_->partial_results();
  } catch (...) {
    round_ = round0;  // plan() advanced it by one
    fail_call(status_of_current_exception(), calls);
    throw;
  }
  const codec::Codec& cod = *codp;
  const uint64_t B = cod.block();

  // Layouts and global block numbers.
  uint64_t nb = 0;
  for (Seg& s : st.segs) {
    s.lay = cod.layout(s.count);
    s.g0 = nb;
    nb += s.lay.nblocks;
  }
  plan.lay.nblocks = nb;

  // ---- chunks: runs of whole blocks of one tensor each.
  struct Run {
    size_t seg = 0;
    uint64_t b0 = 0, nblk = 0;  // the tensor's blocks
    uint64_t woff = 0;          // first wire element in the chunk (multiple of 8)
    uint64_t xoff = 0;          // first element in the chunk's float buffer
    uint64_t elems = 0;
    uint64_t wire = 0;          // wire elements
  };
  struct Chunk {
    std::vector<Run> runs;
    uint64_t wire = 0, elems = 0;
    std::vector<uint64_t> bounds;  // reduce-scatter / allgather: rank q's wire elements [q, q+1)
  };
  auto block_wire = [&](const Seg& s, uint64_t b) { return pad_blocks ? B : s.lay.wire(b); };
  auto add_block = [&](Chunk& c, size_t si, uint64_t b) {
    const Seg& s = st.segs[si];
    if (c.runs.empty() || c.runs.back().seg != si) {
      Run r;
      r.seg = si;
      r.b0 = b;
      r.woff = c.wire = align8(c.wire);
      r.xoff = c.elems;
      c.runs.push_back(r);
    }
    Run& r = c.runs.back();
    r.nblk++;
    r.elems += s.lay.elems(b);
    r.wire += block_wire(s, b);
    c.wire += block_wire(s, b);
    c.elems += s.lay.elems(b);
  };
  const uint64_t cap = plan.chunk_blocks * B;
  std::vector<Chunk> chunks;
  uint64_t max_wire = 0, max_elems = 0;
  // A rank the aggregate may leave out keeps the input x + e of its chunks in flight.
  const bool keep_x = reducer_->partial_results();

  // The chunks, residuals, device buffers, then the statistics: what fails here (host or device
  // memory, a CUDA error) fails before the first exchange too, under the same rule.
  std::vector<uint32_t> pre;
  bool finite = true;
  try {
    if (st.kind == Kind::kAllreduce) {
      Chunk c;
      for (size_t si = 0; si < st.segs.size(); ++si) {
        const Seg& s = st.segs[si];
        for (uint64_t b = 0; b < s.lay.nblocks; ++b) {
          if (!c.runs.empty() && align8(c.wire) + block_wire(s, b) > cap) {
            c.wire = align8(c.wire);
            chunks.push_back(std::move(c));
            c = Chunk{};
          }
          add_block(c, si, b);
        }
      }
      c.wire = align8(c.wire);
      if (!c.runs.empty()) chunks.push_back(std::move(c));
    } else {
      uint64_t total_wire = 0;
      for (const Seg& s : st.segs)
        for (uint64_t b = 0; b < s.lay.nblocks; ++b) total_wire += block_wire(s, b);
      const uint64_t nchunks = std::max<uint64_t>(1, (total_wire + cap - 1) / cap);
      // Rank q's tensors (its shard; or the parts it owns, in their order) are the chunk's
      // wire elements [bounds[q], bounds[q + 1]).
      std::vector<std::vector<size_t>> owned(static_cast<size_t>(n));
      for (size_t si = 0; si < st.segs.size(); ++si) owned[static_cast<size_t>(st.segs[si].owner)].push_back(si);
      for (uint64_t k = 0; k < nchunks; ++k) {
        Chunk c;
        c.bounds.assign(static_cast<size_t>(n) + 1, 0);
        for (int q = 0; q < n; ++q) {
          c.wire = align8(c.wire);
          c.bounds[q] = c.wire;
          for (size_t si : owned[static_cast<size_t>(q)]) {
            const Seg& s = st.segs[si];
            const uint64_t lo = s.lay.nblocks * k / nchunks, hi = s.lay.nblocks * (k + 1) / nchunks;
            for (uint64_t b = lo; b < hi; ++b) add_block(c, si, b);
          }
        }
        c.wire = align8(c.wire);
        c.bounds[n] = c.wire;
        if (!c.runs.empty()) chunks.push_back(std::move(c));
      }
    }

    for (const Chunk& c : chunks) {
      max_wire = std::max(max_wire, c.wire);
      max_elems = std::max(max_elems, c.elems);
    }
    bool dev_keep = false;
    for (Seg& s : st.segs) {
      if (!s.ef || !s.count) continue;
      if (s.dev) {
        s.res = ds->residual(*s.ef, s.ef_count) + s.res_off;
        s.res_out = s.res;
        dev_keep |= keep_x && s.send;
      } else {
        if (s.ef->count == 0) {
          s.ef->count = s.ef_count;
          s.ef->residual.assign(s.ef_count, 0.0f);
        }
        if (s.ef->residual.size() < s.ef_count) s.ef->residual.resize(s.ef_count, 0.0f);  // (see engine.h)
        s.res = s.ef->residual.data() + s.res_off;
        s.res_out = s.ef->target(s.ef_count) + s.res_off;
      }
    }
    if (ds) ds->reserve(nb, max_wire, max_elems, dev_keep);

    // ---- prelude: every block statistic of the tensors this rank contributes to, one exchange.
    pre.assign(nb + kPreludeCheck, 0);
    {
      std::vector<float> xs;
      std::vector<float> stv;
      for (const Seg& s : st.segs) {
        if (!s.send || s.count == 0) continue;
        if (s.dev) {
          stv.resize(s.lay.nblocks);
          finite &= ds->prelude(cod, s.lay, s.send, s.dtype, s.res, stv.data());
          for (size_t i = 0; i < stv.size(); ++i) std::memcpy(&pre[s.g0 + i], &stv[i], 4);
          continue;
        }
        for (uint64_t b0 = 0; b0 < s.lay.nblocks; b0 += plan.chunk_blocks) {
          const uint64_t first = b0 * B;
          const uint64_t m = std::min<uint64_t>(s.count - first, plan.chunk_blocks * B);
          stv.resize(std::min<uint64_t>(plan.chunk_blocks, s.lay.nblocks - b0));
          if (s.dtype == DType::kF32) {  // read where it is (x = grad + e is not staged)
            finite &= host_->prelude(cod, static_cast<const float*>(s.send) + first, m, stv.data(),
                                     s.res ? s.res + first : nullptr);
          } else {
            xs.resize(std::max<uint64_t>(xs.size(), m));
            load_as_float(s.send, s.dtype, first, m, s.res ? s.res + first : nullptr, xs.data());
            finite &= host_->prelude(cod, xs.data(), m, stv.data());
          }
          for (size_t i = 0; i < stv.size(); ++i) std::memcpy(&pre[s.g0 + b0 + i], &stv[i], 4);
        }
      }
    }
  } catch (...) {
    round_ = round0;
    fail_call(status_of_current_exception(), calls);
    throw;
  }
  uint32_t round = 0;
  try {
    round = exchange_prelude(plan, pre.data(), finite);
  } catch (...) {
    round_ = round0 + calls;
    throw;
  }
  round_ = round + calls;
  {
    uint32_t i = 0;
    for (Seg& s : st.segs) {
      s.rng = codec::CallRng{seed_, static_cast<uint32_t>(me), round + i};
      if (s.count) ++i;
    }
  }
  std::vector<float> stats(nb);
  for (uint64_t b = 0; b < nb; ++b) std::memcpy(&stats[b], &pre[b], 4);
  if (ds) ds->set_stats(stats.data(), nb);

  const Algo algo = plan.algo;
  const bool packed_form = st.kind == Kind::kAllgather || algo == Algo::kPs;
  const int bits = cod.index_bits();
  const size_t wsz = codec::int_size(cod.sum_type());
  reducer_->set_part_granule(B);
  // An allreduce through the colocated PS decodes its sums where the transport gathered them
  // (lent), and encodes its indices into a buffer the transport takes over (adopted), where the
  // transport offers that: neither is copied (as in allreduce_host).
  const bool ps_allreduce = st.kind == Kind::kAllreduce && algo == Algo::kPs;
  const bool lend = ps_allreduce && reducer_->lends_sums();
  const bool adopt = ps_allreduce && reducer_->adopts_input();
  const size_t packed_cap = cod.packed_bytes(max_wire) + 8;  // a chunk's packed codes, with room to spare
  struct Slot {
    std::vector<float> x;  // staged input (grad + e); kept for a rank left out of an aggregate
    std::vector<uint8_t> packed;  // adopt: taken from the transport per chunk, handed back at start
    std::vector<uint8_t> sums;
    std::unique_ptr<transport::Request> req;
    size_t ci = 0;
    bool live = false;
  };
  // Staging only where a tensor needs it (not float32, or error feedback; outputs not float32):
  // float32 tensors without error feedback are encoded from and decoded into the caller's memory,
  // and buffers never touched are not allocated (zero-filling them costs page faults per call).
  bool stage_in = false, stage_out = false;
  for (const Seg& sg : st.segs) {
    if (sg.dev) continue;  // (the device codec reads and writes its buffers itself)
    if (sg.send && sg.count && (sg.dtype != DType::kF32 || sg.res)) stage_in = true;
    if (sg.recv && sg.count && sg.out_dtype != DType::kF32) stage_out = true;
  }
  Slot slots[2];
  for (Slot& s : slots) {
    if (stage_in) s.x.resize(max_elems);
    if (packed_form && !adopt) s.packed.resize(packed_cap);
    if (st.kind != Kind::kAllgather && !lend) s.sums.resize(max_wire * wsz + 1);
  }
  constexpr uint64_t kGroup = 8;  // blocks decoded between two looks at the transfer in flight
  std::vector<uint8_t> vals(st.kind == Kind::kAllgather ? kGroup * B * wsz : 0);
  std::vector<float> obuf(stage_out ? kGroup * B : 0);
  // A reduce-scatter in place writes its shard at the front of recv, over input that later chunks
  // still encode for other shards: then the shard is decoded aside and stored at the end.
  std::vector<float> staged_out;
  void* staged_dev = nullptr;  // the same on the device, in the shard's own type
  void* staged_to = nullptr;
  DType staged_dtype = DType::kF32;
  // (Parts are in place and never overlap: nothing to stage.)
  if (st.kind == Kind::kReduceScatter && !st.parts && st.segs[static_cast<size_t>(me)].recv &&
      st.segs[static_cast<size_t>(me)].count) {
    Seg& s = st.segs[static_cast<size_t>(me)];
    const char* lo = static_cast<const char*>(s.recv);
    const char* hi = lo + s.count * dtype_size(s.out_dtype);
    bool overlap = false;
    for (const Seg& o : st.segs) {
      if (!o.send || o.count == 0 || &o == &s) continue;
      const char* a = static_cast<const char*>(o.send);
      const char* z = a + o.count * dtype_size(o.dtype);
      if (a < hi && lo < z) overlap = true;
    }
    if (overlap && s.dev) {
      staged_to = s.recv;
      staged_dtype = s.out_dtype;
      staged_dev = ds->scratch(s.count * dtype_size(s.out_dtype));
      s.recv = staged_dev;
    } else if (overlap) {
      staged_out.resize(s.count);
      staged_to = s.recv;
      staged_dtype = s.out_dtype;
      s.recv = staged_out.data();
      s.out_dtype = DType::kF32;
    }
  }

  // Contributors of the block at wire offset `w` of a finished operation.
  struct Contrib {
    int contributors;
    bool self_counted;
  };
  auto contrib_at = [&](const std::vector<transport::Request::Part>& parts, const Contrib& whole, uint64_t w) -> Contrib {
    if (st.kind == Kind::kAllgather) return {1, true};
    if (parts.empty()) return whole;
    for (const transport::Request::Part& p : parts)
      if (w >= p.first && w < p.first + p.count) return {p.contributors < 0 ? n : p.contributors, p.self_counted};
    return {n, true};
  };

  auto finish = [&](Slot& s, Slot* drive) {
    const int si = static_cast<int>(&s - slots);
    bool decoded_on_device = false;
    s.req->wait();
    const Chunk& c = chunks[s.ci];
    const std::vector<transport::Request::Part> parts = s.req->parts();
    const int c0 = s.req->contributors();
    const Contrib whole{c0 < 0 ? n : c0, s.req->self_counted()};
    // The operation's buffers go before the decode (freed in the same order every chunk, the
    // allocator reuses them instead of returning them to the system and faulting them in again
    // for the next chunk), but for lent sums: those live as long as the request, to the decode's end.
    const uint8_t* const sums0 = lend ? static_cast<const uint8_t*>(s.req->lent_sums()) : s.sums.data();
    if (lend && !sums0) fail(Status::kInternal, "the transport lent no sums");
    if (!lend) s.req.reset();
    s.live = false;
    // The device tensors' sums go to the device in one copy (the span of their runs).
    if (ds && st.kind != Kind::kAllgather) {
      uint64_t lo = UINT64_MAX, hi = 0;
      for (const Run& r : c.runs) {
        const Seg& sg = st.segs[r.seg];
        if (!sg.dev || !sg.recv) continue;
        lo = std::min(lo, r.woff);
        hi = std::max(hi, r.woff + r.wire);
      }
      if (hi > lo) ds->sums_to_device(cod, sums0 + lo * wsz, lo, hi - lo);
    }
    for (const Run& r : c.runs) {
      Seg& sg = st.segs[r.seg];
      if (!sg.recv) continue;
      for (uint64_t b = r.b0; b < r.b0 + r.nblk; b += kGroup) {
        const uint64_t g = std::min<uint64_t>(kGroup, r.b0 + r.nblk - b);
        const uint64_t first = b * B;
        const uint64_t m = std::min<uint64_t>(sg.count - first, g * B);
        const uint64_t woff = r.woff + (b - r.b0) * B;
        const Contrib ct = contrib_at(parts, whole, woff);
        const void* sums;
        if (st.kind == Kind::kAllgather) {
          uint64_t w = 0;
          for (uint64_t k = b; k < b + g; ++k) w += block_wire(sg, k);
          std::memset(vals.data(), 0, w * wsz);
          transport::LookupTable table;
          table.bits = bits;
          table.values = cod.table();
          transport::lookup_add(table, s.packed.data() + woff * bits / 8, 0, w, cod.sum_type(), vals.data());
          sums = vals.data();
        } else {
          sums = sums0 + woff * wsz;
        }
        if (sg.dev) {
          // As below, on the device: partial aggregation's SUM is the counted workers' mean times n.
          const bool ag = st.kind == Kind::kAllgather;
          const bool as_mean = !ag && (st.mean || ct.contributors != n);
          const float scale = !ag && !st.mean && ct.contributors != n ? static_cast<float>(n) : 1.0f;
          ds->decode(cod, sg.lay, sg.g0, b, g, woff, ag ? sums : nullptr, sg.rng, ag ? 1 : ct.contributors, as_mean,
                     scale, sg.recv, sg.out_dtype);
          if (!ag && sg.res && !ct.self_counted) ds->restore(si, r.xoff + (first - r.b0 * B), sg.res + first, m);
          decoded_on_device = true;
          if (drive && drive->req) drive->req->test();
          continue;
        }
        const bool direct = sg.out_dtype == DType::kF32;
        float* dst = direct ? static_cast<float*>(sg.recv) + first : obuf.data();
        if (st.kind == Kind::kAllgather) {
          host_->decode(cod, sg.lay, b, g, sums, stats.data() + sg.g0 + b, sg.rng, 1, false, dst);
        } else {
          // Partial aggregation: SUM is scaled from the counted workers' mean to all n.
          const bool as_mean = st.mean || ct.contributors != n;
          host_->decode(cod, sg.lay, b, g, sums, stats.data() + sg.g0 + b, sg.rng, ct.contributors, as_mean, dst);
          if (!st.mean && ct.contributors != n)
            for (uint64_t i = 0; i < m; ++i) dst[i] *= static_cast<float>(n);
          if (sg.res && !ct.self_counted)  // left out of the aggregate: x = grad + e stays in the residual
            std::memcpy(sg.res_out + first, s.x.data() + r.xoff + (first - r.b0 * B), m * sizeof(float));
        }
        if (!direct) store_from_float(obuf.data(), m, sg.out_dtype, sg.recv, first);
        if (drive && drive->req) drive->req->test();
      }
    }
    if (decoded_on_device) ds->sync();  // the sums' host memory is the slot's (or the transport's)
    s.req.reset();
  };

  // Left behind (the job went on without this rank): nothing of the call from chunk `from` on was
  // counted, so the whole contribution x = grad + e stays in the residual: from the staged x of
  // the chunks in flight, and grad added to e for the chunks never encoded.
  auto keep_contribution = [&](size_t from, size_t encoded_to) {
    std::vector<float> tmp;
    for (size_t ci = from; ci < chunks.size(); ++ci) {
      const Slot* held = nullptr;
      for (const Slot& s : slots)
        if (s.ci == ci && ci < encoded_to) held = &s;
      for (const Run& r : chunks[ci].runs) {
        Seg& sg = st.segs[r.seg];
        if (!sg.res || !sg.send) continue;
        const uint64_t first = r.b0 * B;
        if (sg.dev) {
          if (held) {
            ds->restore(static_cast<int>(held - slots), r.xoff, sg.res + first, r.elems);
          } else {
            ds->add_into(static_cast<const char*>(sg.send) + first * dtype_size(sg.dtype), sg.dtype, sg.res + first,
                         r.elems);
          }
          continue;
        }
        if (held) {
          std::memcpy(sg.res_out + first, held->x.data() + r.xoff, r.elems * sizeof(float));
        } else {
          tmp.resize(r.elems);
          load_as_float(sg.send, sg.dtype, first, r.elems, sg.res + first, tmp.data());
          std::memcpy(sg.res_out + first, tmp.data(), r.elems * sizeof(float));
        }
      }
    }
    if (ds) ds->sync();
  };

  uint64_t wire_total = 0, wire_own = 0;
  int cur = 0;
  Slot* pending = nullptr;
  size_t encoded_to = 0;
  try {
    for (size_t ci = 0; ci < chunks.size(); ++ci) {
      Slot& s = slots[cur];
      s.ci = ci;
      const Chunk& c = chunks[ci];
      if (adopt) s.packed = reducer_->input_buffer(packed_cap);
      // Gaps between runs (alignment) travel as zeros.
      if (packed_form) std::memset(s.packed.data(), 0, cod.packed_bytes(c.wire));
      if (!packed_form) std::memset(s.sums.data(), 0, c.wire * wsz);
      for (const Run& r : c.runs) {
        Seg& sg = st.segs[r.seg];
        if (!sg.send) continue;
        wire_own += r.wire;
        if (sg.dev) {  // enqueued; the chunk's device codes come over below
          ds->encode(cod, sg.lay, sg.g0, r.b0, r.nblk, sg.send, sg.dtype, sg.res, sg.rng, packed_form, r.woff,
                     keep_x && sg.res ? cur : -1, r.xoff);
          continue;
        }
        const uint64_t first = r.b0 * B;
        // float32 is read where it is (with error feedback the codec sums grad + e as it reads
        // them and stages the sum); other types are staged here.
        const bool f32 = sg.dtype == DType::kF32;
        const bool add_in_codec = f32 && sg.res;
        const float* xin = f32 ? static_cast<const float*>(sg.send) + first : s.x.data() + r.xoff;
        if (!f32) load_as_float(sg.send, sg.dtype, first, r.elems, sg.res ? sg.res + first : nullptr, s.x.data() + r.xoff);
        codec::Codec::EncodeOut out;
        if (packed_form) {
          out.packed = s.packed.data() + r.woff * bits / 8;
        } else {
          out.values = s.sums.data() + r.woff * wsz;
        }
        if (sg.res) out.residual = sg.res_out + first;
        if (add_in_codec) out.staged = s.x.data() + r.xoff;
        host_->encode(
            cod, sg.lay, r.b0, r.nblk, xin, stats.data() + sg.g0 + r.b0, sg.rng, out,
            [&] {
              if (pending) pending->req->test();
            },
            add_in_codec ? sg.res + first : nullptr);
      }
      if (ds) {
        ds->codes_to_host(packed_form ? static_cast<void*>(s.packed.data()) : s.sums.data());
        if (pending) pending->req->test();
      }
      wire_total += c.wire;
      encoded_to = ci + 1;
      if (st.kind == Kind::kAllreduce) {
        if (adopt) {
          s.req = reducer_->start_lookup_sum_adopt(std::move(s.packed), c.wire, plan.table, nullptr, cod.sum_type(),
                                                   plan.down.get());
        } else if (algo == Algo::kPs) {
          s.req = reducer_->start_lookup_sum(s.packed.data(), c.wire, plan.table, lend ? nullptr : s.sums.data(),
                                             cod.sum_type(), plan.down.get());
        } else {
          s.req = reducer_->start_sum(s.sums.data(), c.wire, cod.sum_type());
        }
      } else if (st.kind == Kind::kReduceScatter) {
        if (algo == Algo::kPs) {
          s.req = reducer_->start_lookup_reduce_scatter(s.packed.data(), c.wire, plan.table, s.sums.data(),
                                                        cod.sum_type(), c.bounds);
        } else {
          s.req = reducer_->start_reduce_scatter_sum(s.sums.data(), c.wire, cod.sum_type(), c.bounds);
        }
      } else {
        std::vector<uint64_t> byte_bounds(c.bounds.size());
        for (size_t q = 0; q < c.bounds.size(); ++q) byte_bounds[q] = c.bounds[q] * static_cast<uint64_t>(bits) / 8;
        s.req = reducer_->start_allgather(s.packed.data(), byte_bounds);
      }
      s.live = true;
      if (pending) finish(*pending, &s);
      pending = &s;
      cur ^= 1;
    }
    if (pending) finish(*pending, nullptr);
  } catch (const Error& e) {
    if (e.status() == Status::kLeftBehind) {
      size_t from = chunks.size();
      for (const Slot& s : slots)
        if (s.live) from = std::min(from, s.ci);
      keep_contribution(from, encoded_to);
    }
    throw;
  }
  if (staged_dev) {
    ds->copy(staged_to, staged_dev, st.segs[static_cast<size_t>(me)].count * dtype_size(staged_dtype));
  } else if (staged_to) {
    store_from_float(staged_out.data(), staged_out.size(), staged_dtype, staged_to, 0);
  }
  if (ds) ds->sync();

  // Statistics: as `calls` calls of `total` elements.
  transport::Reducer::WireCounters wc;
  if (reducer_->wire_counters(&wc)) {
    account(plan, wire_total);
  } else {
    const uint64_t up_codes = packed_form ? cod.packed_bytes(st.kind == Kind::kAllgather ? wire_own : wire_total)
                                          : wire_total * wsz;
    uint64_t down = 0;
    if (st.kind == Kind::kAllreduce) {
      down = plan.down ? wire_total : wire_total * wsz;
    } else if (st.kind == Kind::kReduceScatter) {
      for (const Chunk& c : chunks) down += (c.bounds[me + 1] - c.bounds[me]) * wsz;
    } else {
      down = cod.packed_bytes(wire_total - wire_own);
    }
    stats_.calls++;
    stats_.elements += total;
    stats_.float_bytes += total * 4;
    stats_.last_algo = st.kind == Kind::kAllgather ? Algo::kPs : algo;
    stats_.wire_bytes_up += up_codes;
    stats_.wire_bytes_down += down;
  }
  stats_.calls += calls - 1;
  if (st.kind == Kind::kAllreduce && calls > 1) {
    stats_.groups++;
    stats_.grouped_tensors += calls;
  }
}

}  // namespace thc::engine
