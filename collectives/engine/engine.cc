#include "collectives/engine/engine.h"
#include "collectives/engine/agreement.h"
#include "collectives/engine/plan_rules.h"
#include "collectives/engine/knobs.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <functional>
#include <new>
#include <random>
#include <string>

namespace thc::engine {
namespace {

// Cnat re-compression of shard sums for the colocated PS downstream (bidirectional
// compression): each integer sum S becomes an unbiased power of two ±2^k (or 0), one byte:
// bit 7 sign, bits 0..6 = k + 1 (0 means zero). Drawn from the owner's stream so every rank
// decodes the same bytes.
class NatRecompress final : public transport::DownstreamCodec {
 public:
  NatRecompress(codec::IntType t, const codec::CallRng& rng) : type_(t), rng_(rng) {}
  size_t encoded_bytes(uint64_t count) const override { return count; }
  void encode(const void* sums, uint64_t first, uint64_t count, uint8_t* out) const override {
    // Shared stream: whichever rank owns a shard, every rank would draw the same bits.
    const rng::Stream s{rng_.seed, rng::kSharedStream, rng_.round};
    const auto key = rng::make_key(s);
    for (uint64_t i = 0; i < count; ++i) {
      const uint64_t gi = first + i;
      const auto r = rng::draw4(key, s, rng::kPurposeRecompress, gi >> 32, static_cast<uint32_t>(gi));
      const int64_t v = codec::load_int(type_, sums, i);
      const uint64_t a = static_cast<uint64_t>(v < 0 ? -v : v);
      if (a == 0) {
        out[i] = 0;
        continue;
      }
      int k = 63 - __builtin_clzll(a);  // 2^k <= a < 2^(k+1)
      const uint64_t lo = uint64_t{1} << k;
      // P(up) = (a - lo) / lo, drawn with 32 bits.
      const uint64_t thresh = ((a - lo) << 32) >> k;
      if (static_cast<uint64_t>(r.v[0]) < thresh) ++k;
      out[i] = static_cast<uint8_t>((v < 0 ? 0x80 : 0) | (k + 1));
    }
  }
  void decode(const uint8_t* in, uint64_t first, uint64_t count, void* sums) const override {
    for (uint64_t i = 0; i < count; ++i) {
      const uint8_t c = in[i];
      const int64_t mag = (c & 0x7F) ? (int64_t{1} << ((c & 0x7F) - 1)) : 0;
      codec::store_int(type_, sums, i, (c & 0x80) ? -mag : mag);
    }
  }

 private:
  codec::IntType type_;
  codec::CallRng rng_;
};

// Re-compression rounds a shard sum |S| <= n * 2^(L-1) up to at most the next power of two,
// which the sum type must hold. THC_NAT_LEVELS=0 reserves that headroom (codec_for); explicit
// levels that leave none are refused rather than wrapped.
void require_recompress_headroom(const codec::Codec& c, int n) {
  const int64_t cap = codec::int_max(c.sum_type());
  auto rounded_top = [n](int levels) {  // the largest shard sum, rounded up to a power of two
    int64_t up = 1;
    while (up < (int64_t{n} << (levels - 1))) up <<= 1;
    return up;
  };
  if (rounded_top(c.levels()) <= cap) return;
  int ok = c.levels();
  while (ok > 1 && rounded_top(ok) > cap) --ok;
  const int64_t top = int64_t{n} << (c.levels() - 1), up = rounded_top(c.levels());
  fail(Status::kOverflow, "THC_BIDIR: " + std::to_string(n) + " workers with " + std::to_string(c.levels()) +
                              " levels make shard sums up to " + std::to_string(top) +
                              ", which re-compression rounds up to " + std::to_string(up) + ", beyond the " +
                              std::to_string(codec::int_size(c.sum_type()) * 8) +
                              "-bit sums; use at most " + std::to_string(ok) +
                              " levels (THC_NAT_LEVELS=0 picks them), a wider THC_NAT_WIDTH, or THC_BIDIR=0");
}

}  // namespace

std::vector<BlockPart> block_parts(const transport::Request& req, uint64_t b0, uint64_t nblk, uint64_t B, int n) {
  std::vector<BlockPart> out;
  const std::vector<transport::Request::Part> parts = req.parts();
  if (parts.empty()) {
    const int c = req.contributors();
    out.push_back(BlockPart{b0, nblk, c < 0 ? n : c, req.self_counted()});
    return out;
  }
  for (const transport::Request::Part& p : parts) {
    if (p.count == 0) continue;
    if (p.first % B != 0)
      fail(Status::kInternal, "a backend split an operation off a block boundary (element " + std::to_string(p.first) + ")");
    const uint64_t pb = p.first / B;
    const uint64_t pn = std::min<uint64_t>((p.count + B - 1) / B, nblk - pb);
    out.push_back(BlockPart{b0 + pb, pn, p.contributors < 0 ? n : p.contributors, p.self_counted});
  }
  return out;
}

Engine::Engine(std::unique_ptr<transport::Reducer> reducer, const thc_config_t& cfg)
    : reducer_(std::move(reducer)), cfg_(cfg) {
  if (log2_exact(cfg_.block) < 10 || log2_exact(cfg_.block) > 20)
    fail(Status::kInvalidArgument, "THC_BLOCK=" + std::to_string(cfg_.block) +
                                       " must be a power of two in 1024..1048576");
  if (cfg_.chunk_bytes < 4) fail(Status::kInvalidArgument, "THC_CHUNK_BYTES must be positive");
  if (cfg_.threads < 1 || cfg_.threads > 256)
    fail(Status::kInvalidArgument, "THC_THREADS=" + std::to_string(cfg_.threads) + " must be in 1..256");
  host_ = std::make_unique<HostCodec>(cfg_.threads);
  // Seed agreement: rank 0's seed wins a MAX in which the others contribute zeros.
  uint64_t mine = cfg_.seed;
  if (mine == 0) {
    std::random_device rd;
    mine = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ 1;
  }
  uint32_t w[2] = {0, 0};
  if (reducer_->rank() == 0) {
    w[0] = static_cast<uint32_t>(mine);
    w[1] = static_cast<uint32_t>(mine >> 32);
  }
  reducer_->max_u32(w, 2);
  seed_ = (static_cast<uint64_t>(w[1]) << 32) | w[0];
}

codec::Params Engine::params_for(codec::Scheme scheme) const { return codec_params(cfg_, scheme); }

const codec::Codec& Engine::codec_for(codec::Scheme scheme) {
  auto it = codecs_.find(static_cast<int>(scheme));
  if (it != codecs_.end()) return *it->second;
  codec::Params p = params_for(scheme);
  const int n = size();
  const bool nat = scheme == codec::Scheme::kCnat || scheme == codec::Scheme::kDnat;
  if (nat && cfg_.bidir && reducer_->applies_downstream() && p.nat_levels == 0) {
    // Re-compression may round a shard sum up to the next power of two: keep one level of
    // headroom so 2 * n * 2^(L-1) still fits the sum type.
    codec::Codec probe(p, n);
    p.nat_levels = std::max(1, probe.levels() - 1);
  }
  auto c = std::make_unique<codec::Codec>(p, n);
  const codec::Codec& ref = *c;
  codecs_[static_cast<int>(scheme)] = std::move(c);
  return ref;
}

Algo Engine::choose_algo(const codec::Codec& c) const {
  if (cfg_.algo == THC_ALGO_INT) return Algo::kInt;
  if (cfg_.algo == THC_ALGO_PS) return Algo::kPs;
  const bool say = cfg_.debug != 0 && rank() == 0 && !said_algo_[static_cast<int>(c.params().scheme) & 7];
  if (say) said_algo_[static_cast<int>(c.params().scheme) & 7] = true;
  if (reducer_->prefers_index_form()) {
    if (say) std::fprintf(stderr, "thc: THC_ALGO=auto: ps (the transport sums indices itself: aggregator)\n");
    return Algo::kPs;
  }
  // Per element and rank, a ring allreduce of values moves 2(n-1)/n * w bits; the colocated
  // PS moves (n-1)/n * (b + w') bits, w' = w or 8 with re-compression. Both schedules pipeline
  // pieces pairwise or around the ring (transport/schedules), so on a bandwidth-bound link the
  // bytes decide; on the 1 Gbit/s cluster PS was also the faster one per byte (README).
  const int w = static_cast<int>(codec::int_size(c.sum_type())) * 8;
  const bool nat = !c.rotates();
  const int down = (nat && cfg_.bidir && reducer_->applies_downstream()) ? 8 : w;
  const Algo a = ps_moves_fewer_bits(c.index_bits(), down, w) ? Algo::kPs : Algo::kInt;
  if (say)
    std::fprintf(stderr,
                 "thc: THC_ALGO=auto: %s (per element and rank: ps moves (n-1)/n*(%d index + %d sum) bits, the "
                 "int ring 2(n-1)/n*%d bits; both run 2(n-1) pipelined steps, so the link's latency and "
                 "bandwidth scale both alike)\n",
                 a == Algo::kPs ? "ps" : "int", c.index_bits(), down, w);
  return a;
}

CallPlan Engine::plan(codec::Scheme scheme, uint64_t count, DType dtype, bool mean) {
  // The counter advances before anything can fail, so every rank counts every call alike.
  const uint32_t round = round_++;
  CallPlan p;
  p.scheme = scheme;
  p.cod = &codec_for(scheme);
  p.lay = p.cod->layout(count);
  p.count = count;
  p.dtype = dtype;
  p.mean = mean;
  p.algo = choose_algo(*p.cod);
  p.rng = codec::CallRng{seed_, static_cast<uint32_t>(rank()), round};
  p.round_by_max = reducer_->partial_results();
  p.table.bits = p.cod->index_bits();
  p.table.values = p.cod->table();
  if (p.algo == Algo::kPs && !p.cod->rotates() && cfg_.bidir && reducer_->applies_downstream()) {
    require_recompress_headroom(*p.cod, size());
    p.down = std::make_unique<NatRecompress>(p.cod->sum_type(), p.rng);
  }
  p.chunk_blocks = chunk_blocks_for(cfg_.chunk_bytes, p.lay.block);
  if (p.algo == Algo::kPs) {
    const uint64_t bits = static_cast<uint64_t>(p.table.bits), width = codec::int_size(p.cod->sum_type());
    const transport::DownstreamCodec* down = p.down.get();
    p.chunk_blocks = ps_chunk_blocks(p.chunk_blocks, p.lay.block, size(), reducer_->eager_bytes(), [&](uint64_t e) {
      return std::max<uint64_t>((e * bits + 7) / 8, down ? down->encoded_bytes(e) : e * width);
    });
  }
  uint64_t h = 0;
  for (const PreludeField& f : prelude_fields(p)) h = digest_mix(h, f.value);
  p.digest = h;
  return p;
}

namespace {

// The first exchange of every call has this fixed size whatever the count, so ranks that
// disagree on the count (hence on how many block statistics follow) still meet in the same
// collective and all learn of it. 256 u32 words: one DATA_MAX packet of the aggregator protocol.
constexpr size_t kHeaderWords = 256;
constexpr size_t kWordStatus = 0;     // MAX of the status of ranks that failed before exchanging
constexpr size_t kWordFailed = 1;     // 2 words: the lowest and highest of those ranks (put_rank)
constexpr size_t kWordNonFinite = 3;  // 2 words: the lowest and highest rank with NaN/Inf input
constexpr size_t kWordRound = 5;      // MAX of the call rounds (aggregator jobs, see below)
constexpr size_t kWordFields = 6;     // then each field as (v, ~v), 2 + 2 words: under MAX the
                                      // pair stays complementary only if every rank has the same v
constexpr size_t kFieldWords = 4;
constexpr size_t kInlineStats = kHeaderWords - kWordFields - Engine::kPreludeFields * kFieldWords;
static_assert(kInlineStats >= 64, "the header keeps room for the statistics of small calls");

}  // namespace

std::array<Engine::PreludeField, Engine::kPreludeFields> Engine::prelude_fields(const CallPlan& p) {
  return {{
      {"the codec (scheme, THC_BITS/GRANULARITY/P/UNIFORM, THC_BLOCK, THC_NAT_*, THC_DNAT_NORM)", p.cod->digest()},
      {"the count", p.count},
      {"the op (SUM or AVG)", p.mean ? 1u : 0u},
      {"the chunking (THC_CHUNK_BYTES, in blocks per chunk)", p.chunk_blocks},
      {"the algorithm (THC_ALGO)", p.algo == Algo::kPs ? 1u : 0u},
      {"downstream re-compression (THC_BIDIR)", p.down ? 1u : 0u},
      // On an aggregator job with partial aggregation a rank that rejoined after being left behind
      // has made fewer calls: there the ranks take the newest round instead (kWordRound).
      {"the call sequence (a rank skipped or added a call)", p.round_by_max ? 0u : p.rng.round},
      // Calls on several tensors (groups, reduce-scatter, allgather; stream.cc): which collective
      // and every tensor's count in order, so calls started in different orders are told apart.
      {"the tensors of a call on several (their counts in order, or the collective)", p.tensors_digest},
  }};
}

std::function<void(uint32_t*, size_t)> Engine::naming_exchange() {
  // A backend where every rank takes part in every exchange can carry one more, of a word per
  // rank, to name each rank a failure concerns; under partial aggregation a straggler may not be
  // there for it (then the lowest and highest are named).
  if (reducer_->partial_results()) return nullptr;
  return [this](uint32_t* w, size_t n) { reducer_->max_u32(w, n); };
}

uint32_t Engine::exchange_prelude(const CallPlan& plan, uint32_t* pre, bool finite) {
  ++preludes_entered_;
  const uint64_t nb = plan.lay.nblocks;
  const auto fields = prelude_fields(plan);
  std::array<uint32_t, kHeaderWords> hdr{};
  if (!finite) put_rank(&hdr[kWordNonFinite], rank());
  hdr[kWordRound] = plan.rng.round;
  for (size_t i = 0; i < fields.size(); ++i) put_field(&hdr[kWordFields + i * kFieldWords], fields[i].value);
  const uint64_t inl = std::min<uint64_t>(nb, kInlineStats);
  uint32_t* const hstats = hdr.data() + (kHeaderWords - kInlineStats);
  std::memcpy(hstats, pre, inl * 4);
  reducer_->max_u32(hdr.data(), kHeaderWords);
  if (hdr[kWordStatus] != 0)
    fail(static_cast<Status>(hdr[kWordStatus]),
         name_ranks(&hdr[kWordFailed], size(), rank(), 0, hdr[kWordStatus], naming_exchange(), status_word) +
             " failed this call before exchanging (their own error messages say why); nothing was reduced");
  std::string bad;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (field_agrees(&hdr[kWordFields + i * kFieldWords])) continue;
    bad += std::string(bad.empty() ? "" : ", ") + fields[i].what;
    if (i != 0) bad += " (this rank: " + std::to_string(fields[i].value) + ")";
  }
  if (!bad.empty())
    fail(Status::kConfigMismatch, "ranks disagree on " + bad + "; this rank: " + plan.cod->describe() +
                                      " count=" + std::to_string(plan.count) + "; nothing was reduced");
  if (any_rank(&hdr[kWordNonFinite]))
    fail(Status::kNonFinite, "input contains NaN or Inf on " +
                                 name_ranks(&hdr[kWordNonFinite], size(), rank(), finite ? 0u : 1u, 1u,
                                            naming_exchange(), [](uint32_t) { return std::string(); }) +
                                 "; nothing was reduced");
  // The round seeds the shared RHT signs, which every rank of a call must share: a rank that
  // rejoined an aggregator job takes the job's (the newest).
  const uint32_t round = plan.round_by_max ? hdr[kWordRound] : plan.rng.round;
  round_ = round + 1;
  // Every rank has the same count now: the remaining statistics, sized by it, are safe to combine.
  std::memcpy(pre, hstats, inl * 4);
  if (nb > inl) reducer_->max_u32(pre + inl, nb - inl);
  return round;
}

void Engine::abort_prelude(Status why) {
  ++preludes_entered_;
  std::array<uint32_t, kHeaderWords> hdr{};
  const uint32_t mine = static_cast<uint32_t>(why == Status::kSuccess ? Status::kInternal : why);
  hdr[kWordStatus] = mine;
  put_rank(&hdr[kWordFailed], rank());
  try {
    reducer_->max_u32(hdr.data(), kHeaderWords);
    // The others name the failing ranks next (exchange_prelude): this rank takes part alike.
    (void)name_ranks(&hdr[kWordFailed], size(), rank(), mine, hdr[kWordStatus], naming_exchange(), status_word);
  } catch (const Error&) {
    // The caller reports its own, first error; a broken backend cannot tell the peers anyway.
  }
}

void Engine::fail_call(Status why, uint32_t calls) {
  // As a call whose plan failed (allreduce): it counts, and the peers fail it with `why`.
  round_ += calls;
  abort_prelude(why);
}

void Engine::account(const CallPlan& plan, uint64_t wire_total) {
  const size_t wsz = codec::int_size(plan.cod->sum_type());
  stats_.calls++;
  stats_.elements += plan.count;
  stats_.float_bytes += plan.count * 4;
  stats_.last_algo = plan.algo;
  transport::Reducer::WireCounters wc;
  if (reducer_->wire_counters(&wc)) {
    // An aggregator client counts the datagrams themselves (headers, retransmissions, the
    // prelude): what the link carried, not a model of it.
    stats_.wire_bytes_up += wc.bytes_sent - wire_seen_.bytes_sent;
    stats_.wire_bytes_down += wc.bytes_received - wire_seen_.bytes_received;
    stats_.packets += wc.packets - wire_seen_.packets;
    stats_.retransmissions += wc.retransmissions - wire_seen_.retransmissions;
    stats_.measured_wire = true;
    wire_seen_ = wc;
    return;
  }
  if (plan.algo == Algo::kPs) {
    stats_.wire_bytes_up += plan.cod->packed_bytes(wire_total);
    stats_.wire_bytes_down += plan.down ? wire_total : wire_total * wsz;
  } else {
    stats_.wire_bytes_up += wire_total * wsz;
    stats_.wire_bytes_down += wire_total * wsz;
  }
}

Status status_of_current_exception() {
  try {
    throw;
  } catch (const Error& e) {
    return e.status();
  } catch (const std::bad_alloc&) {
    return Status::kOutOfMemory;
  } catch (...) {
  }
  return Status::kInternal;
}

void Engine::allreduce(codec::Scheme scheme, const void* send, void* recv, uint64_t count,
                       DType dtype, bool mean, ErrorFeedback* ef) {
  if (count == 0) return;
  // What can fail before the first exchange fails on this rank alone; the peers would wait in
  // that exchange. A rank that fails here still takes part in it (abort_prelude) so every rank
  // fails the call, and the call still counts (the counter is part of what must agree).
  const uint32_t round0 = round_;
  CallPlan p;
  bool on_device = false;
  DeviceBackend* dev = nullptr;
  try {
    if (!recv) fail(Status::kInvalidArgument, "allreduce: recvbuf is NULL");
    if (!send || send == THC_IN_PLACE) send = recv;
    // Device buffers: the registered backend (libthc_cuda, or an emulator in tests) decides; a
    // process without one is asked through its CUDA driver, and libthc_cuda is loaded on demand.
    dev = backend_for(recv);
    on_device = dev != nullptr;
    if ((backend_for(send) != nullptr) != on_device)
      fail(Status::kInvalidArgument, "sendbuf and recvbuf must both be host memory or both device memory");
    if (ef && ef->count != 0) {
      if (ef->count != count)
        fail(Status::kInvalidArgument, "error-feedback state was bound to count " + std::to_string(ef->count) +
                                           ", used with count " + std::to_string(count));
      if ((ef->device != nullptr) != on_device)
        fail(Status::kInvalidArgument, std::string("error-feedback state was bound to ") +
                                           (ef->device ? "device" : "host") + " buffers, used with " +
                                           (on_device ? "device" : "host") + " buffers");
    }
    if (on_device && dtype == DType::kF64)
      fail(Status::kUnsupported, "float64 device buffers: the GPU codec takes float32, float16 and bfloat16");
    if (on_device && ef && ef->out_of_place)
      fail(Status::kUnsupported, "out-of-place error feedback takes host buffers only");
    p = plan(scheme, count, dtype, mean);
    if (on_device && !device_) device_ = dev->open();
  } catch (...) {
    round_ = round0 + 1;
    abort_prelude(status_of_current_exception());
    throw;
  }
  // The paths can fail before their first exchange too (the device's workspace, a CUDA error in
  // the prelude's kernels, host memory): the same rule.
  const uint64_t entered = preludes_entered_;
  try {
    if (on_device) {
      device_->allreduce(*this, p, send, recv, ef);
    } else {
      allreduce_host(p, send, recv, ef);
    }
  } catch (...) {
    if (preludes_entered_ == entered) {
      round_ = round0 + 1;
      abort_prelude(status_of_current_exception());
    }
    throw;
  }
}

void Engine::allreduce_host(const CallPlan& plan, const void* send, void* recv, ErrorFeedback* ef) {
  const codec::Codec& cod = *plan.cod;
  const codec::Layout& lay = plan.lay;
  const uint64_t count = plan.count;
  const DType dtype = plan.dtype;
  const bool mean = plan.mean;
  const uint64_t B = lay.block;
  const int n = size();

  if (ef && ef->count == 0) {
    ef->count = count;
    ef->residual.assign(count, 0.0f);
  }
  if (ef && ef->residual.size() < count) ef->residual.resize(count, 0.0f);  // (see engine.h)
  const float* efr = ef ? ef->residual.data() : nullptr;
  float* const efw = ef ? ef->target(count) : nullptr;  // the updated residual (efr itself in place)

  const uint64_t chunk_blocks = plan.chunk_blocks;
  // The pipeline's chunks (larger in the middle of a long call where the backend asks for it).
  const std::vector<uint64_t> runs = chunk_runs(lay.nblocks, chunk_blocks, reducer_->chunk_growth());
  const uint64_t max_run = runs.empty() ? chunk_blocks : *std::max_element(runs.begin(), runs.end());
  const uint64_t buf_elems = std::min<uint64_t>(max_run * B, lay.nblocks * B);
  // float32 without error feedback: the codec reads the caller's buffer and decodes straight into
  // the result (the codec touches only a block's real elements), three passes over the data fewer
  // than staging every chunk (the ranks of a host share its cores and its memory bandwidth). The
  // copy x = grad + e is needed only with error feedback (kept for a rank left out).
  const bool stage_x = dtype != DType::kF32 || efr;
  float* recvf = dtype == DType::kF32 ? static_cast<float*>(recv) : nullptr;
  std::vector<float> xbuf(dtype == DType::kF32 ? 0 : buf_elems);  // the prelude's staging of other types

  // ---- prelude: per-block statistics, a non-finite flag and a configuration digest, one MAX.
  const uint64_t nb = lay.nblocks;
  std::vector<uint32_t> pre(nb + kPreludeCheck, 0);
  bool finite = true;
  // By the pipeline's chunks: xbuf holds the largest, which may be smaller than chunk_blocks.
  {
    uint64_t b0 = 0;
    std::vector<float> st;
    for (const uint64_t run : runs) {
      const uint64_t first = b0 * B;
      const uint64_t m = std::min<uint64_t>(count - first, run * B);
      st.resize(run);
      if (dtype == DType::kF32) {  // read where it is (x = grad + e is not staged; the encode stages it)
        finite &= host_->prelude(cod, static_cast<const float*>(send) + first, m, st.data(), efr ? efr + first : nullptr);
      } else {
        load_as_float(send, dtype, first, m, efr ? efr + first : nullptr, xbuf.data());
        finite &= host_->prelude(cod, xbuf.data(), m, st.data());
      }
      for (size_t i = 0; i < st.size(); ++i) std::memcpy(&pre[b0 + i], &st[i], 4);
      b0 += run;
    }
  }
  codec::CallRng rng = plan.rng;
  rng.round = exchange_prelude(plan, pre.data(), finite);
  std::vector<float> stats(nb);
  for (uint64_t b = 0; b < nb; ++b) std::memcpy(&stats[b], &pre[b], 4);

  const Algo algo = plan.algo;
  const size_t wsz = codec::int_size(cod.sum_type());
  reducer_->set_part_granule(B);

  // The colocated PS's sums are decoded where the transport gathered them, if it lends them.
  const bool lend = algo == Algo::kPs && reducer_->lends_sums();
  // And its indices encoded into a buffer the transport takes over, if it adopts them (no copy).
  const bool adopt = algo == Algo::kPs && reducer_->adopts_input();
  struct Slot {
    std::vector<float> x;  // this chunk's input (grad + e), kept for a worker left out
    std::vector<uint8_t> own;  // adopt: the transport's buffer the indices go into, until started
    uint8_t* packed = nullptr;
    uint8_t* sums = nullptr;
    std::unique_ptr<transport::Request> req;
    uint64_t b0 = 0, nblk = 0;
  };
  Slot slots[2];
  const uint64_t max_wire = max_run * B;
  const size_t packed_cap = cod.packed_bytes(max_wire) + 8;  // a chunk's packed codes, with room to spare
  // Staging kept by the communicator (stage_), grown to the chunk: allocated and zero-filled per
  // call it cost page faults every call.
  auto stage = [this](size_t i, size_t bytes) {
    if (stage_[i].size() < bytes) stage_[i].resize(bytes);
    return stage_[i].data();
  };
  for (size_t i = 0; i < 2; ++i) {
    Slot& s = slots[i];
    if (stage_x) s.x.resize(buf_elems);
    if (!lend) s.sums = stage(2 * i, max_wire * wsz);
    if (algo == Algo::kPs && !adopt) s.packed = stage(2 * i + 1, packed_cap);
  }

  std::vector<float> obuf(recvf ? 0 : buf_elems);
  // Decodes a finished chunk part by part; `drive` keeps the next chunk's transfer going between
  // blocks (nothing else drives the aggregator client's window while this rank decodes).
  auto finish = [&](Slot& s, Slot* drive) {
    s.req->wait();
    const std::vector<BlockPart> parts = block_parts(*s.req, s.b0, s.nblk, B, n);
    // A lent result lives as long as its request: dropped after the decode.
    const uint8_t* const sums0 = lend ? static_cast<const uint8_t*>(s.req->lent_sums()) : s.sums;
    if (!sums0) fail(Status::kInternal, "the transport lent no sums");
    for (const BlockPart& p : parts) {
      // A few blocks at a time (a few milliseconds of work), so the next chunk's transfer keeps
      // going while this one is decoded.
      constexpr uint64_t kGroup = 8;
      for (uint64_t b = p.b0; b < p.b0 + p.nblk; b += kGroup) {
        const uint64_t g = std::min<uint64_t>(kGroup, p.b0 + p.nblk - b);
        const uint64_t first = b * B;
        const uint64_t m = std::min<uint64_t>(count - first, g * B);
        const uint64_t wire_off = (b - s.b0) * B;
        const uint8_t* sums = sums0 + wire_off * wsz;
        // Partial aggregation: SUM is scaled from the counted workers' mean to all n.
        const bool as_mean = mean || p.contributors != n;
        float* dst = recvf ? recvf + first : obuf.data();
        host_->decode(cod, lay, b, g, sums, stats.data() + b, rng, p.contributors, as_mean, dst);
        if (!mean && p.contributors != n)
          for (uint64_t i = 0; i < m; ++i) dst[i] *= static_cast<float>(n);
        if (ef && !p.self_counted) {
          // Left out of the aggregate: the whole contribution x = grad + e stays in the residual.
          std::memcpy(efw + first, s.x.data() + (first - s.b0 * B), m * sizeof(float));
        }
        if (!recvf) store_from_float(obuf.data(), m, dtype, recv, first);
        if (drive && drive->req) drive->req->test();
      }
    }
    s.req.reset();
  };
  // Left behind (the job went on without this rank): nothing of the call from `from_b0` on was
  // counted, so the whole contribution x = grad + e stays in the residual, for the chunks in
  // flight (x is at hand) and for those never encoded (grad is added to e).
  auto keep_contribution = [&](uint64_t from_b0, Slot* a, Slot* b) {
    if (!ef) return;
    uint64_t done_to = from_b0 * B;
    for (Slot* s : {a, b}) {
      if (!s || s->nblk == 0 || s->b0 < from_b0) continue;
      const uint64_t first = s->b0 * B;
      const uint64_t m = std::min<uint64_t>(count - first, s->nblk * B);
      std::memcpy(efw + first, s->x.data(), m * sizeof(float));
      done_to = std::max(done_to, first + m);
    }
    if (done_to < count) {
      std::vector<float> tmp(std::min<uint64_t>(count - done_to, 1u << 20));
      for (uint64_t f = done_to; f < count; f += tmp.size()) {
        const uint64_t m = std::min<uint64_t>(count - f, tmp.size());
        load_as_float(send, dtype, f, m, efr + f, tmp.data());
        std::memcpy(efw + f, tmp.data(), m * sizeof(float));
      }
    }
  };
  uint64_t wire_total = 0;
  int cur = 0;
  Slot* pending = nullptr;
  try {
    uint64_t b0 = 0;
    for (const uint64_t run : runs) {
      Slot& s = slots[cur];
      s.b0 = b0;
      s.nblk = run;
      const uint64_t first = b0 * B;
      const uint64_t m = std::min<uint64_t>(count - first, s.nblk * B);
      // float32 is read where it is (with error feedback the codec sums grad + e as it reads them
      // and stages the sum into s.x itself); other types are staged here.
      const bool f32 = dtype == DType::kF32;
      const bool add_in_codec = f32 && efr;
      const float* xin = f32 ? static_cast<const float*>(send) + first : s.x.data();
      if (!f32) load_as_float(send, dtype, first, m, efr ? efr + first : nullptr, s.x.data());
      // Block by block (over THC_THREADS threads); the chunk in flight keeps progressing.
      codec::Codec::EncodeOut out;
      if (adopt) {
        s.own = reducer_->input_buffer(packed_cap);
        s.packed = s.own.data();
      }
      if (algo == Algo::kPs) {
        out.packed = s.packed;
      } else {
        out.values = s.sums;
      }
      if (ef) out.residual = efw + first;
      if (add_in_codec) out.staged = s.x.data();
      host_->encode(
          cod, lay, b0, s.nblk, xin, stats.data() + b0, rng, out,
          [&] {
            if (pending) pending->req->test();
          },
          add_in_codec ? efr + first : nullptr);
      uint64_t wire = 0;
      for (uint64_t k = 0; k < s.nblk; ++k) wire += lay.wire(b0 + k);
      wire_total += wire;
      if (adopt) {
        s.req = reducer_->start_lookup_sum_adopt(std::move(s.own), wire, plan.table, s.sums, cod.sum_type(),
                                                 plan.down.get());
        s.packed = nullptr;
      } else if (algo == Algo::kPs) {
        s.req = reducer_->start_lookup_sum(s.packed, wire, plan.table, s.sums, cod.sum_type(),
                                           plan.down.get());
      } else {
        s.req = reducer_->start_sum(s.sums, wire, cod.sum_type());
      }
      if (pending) finish(*pending, &s);
      pending = &s;
      cur ^= 1;
      b0 += run;
    }
    if (pending) finish(*pending, nullptr);
  } catch (const Error& e) {
    if (e.status() == Status::kLeftBehind && pending) {
      Slot* other = pending == &slots[0] ? &slots[1] : &slots[0];
      keep_contribution(std::min(pending->b0, other->req ? other->b0 : pending->b0), pending, other->req ? other : nullptr);
    }
    throw;
  }
  account(plan, wire_total);
}

}  // namespace thc::engine
