#include "collectives/engine/engine.h"
#include "collectives/engine/knobs.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

namespace thc::engine {
namespace {

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  return h;
}

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

}  // namespace

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
  if (reducer_->prefers_index_form()) return Algo::kPs;
  // Per element and rank, a ring allreduce of values moves 2(n-1)/n * w bits; the colocated
  // PS moves (n-1)/n * (b + w') bits, w' = w or 8 with re-compression.
  const int w = static_cast<int>(codec::int_size(c.sum_type())) * 8;
  const bool nat = !c.rotates();
  const int down = (nat && cfg_.bidir && reducer_->applies_downstream()) ? 8 : w;
  return (c.index_bits() + down < 2 * w) ? Algo::kPs : Algo::kInt;
}

CallPlan Engine::plan(codec::Scheme scheme, uint64_t count, DType dtype, bool mean) {
  CallPlan p;
  p.scheme = scheme;
  p.cod = &codec_for(scheme);
  p.lay = p.cod->layout(count);
  p.count = count;
  p.dtype = dtype;
  p.mean = mean;
  p.algo = choose_algo(*p.cod);
  p.rng = codec::CallRng{seed_, static_cast<uint32_t>(rank()), round_++};
  p.table.bits = p.cod->index_bits();
  p.table.values = p.cod->table();
  if (p.algo == Algo::kPs && !p.cod->rotates() && cfg_.bidir && reducer_->applies_downstream())
    p.down = std::make_unique<NatRecompress>(p.cod->sum_type(), p.rng);
  uint64_t h = p.cod->digest();
  h = mix(h, count);
  h = mix(h, mean ? 1 : 0);
  p.digest = h;
  p.chunk_blocks = std::max<uint64_t>(1, static_cast<uint64_t>(cfg_.chunk_bytes) / 4 / p.lay.block);
  return p;
}

void Engine::exchange_prelude(const CallPlan& plan, uint32_t* pre, bool finite) {
  const uint64_t nb = plan.lay.nblocks;
  const uint64_t h = plan.digest;
  pre[nb] = finite ? 0u : (1u << (rank() % 32));
  pre[nb + 1] = static_cast<uint32_t>(h);
  pre[nb + 2] = static_cast<uint32_t>(h >> 32);
  pre[nb + 3] = ~static_cast<uint32_t>(h);
  pre[nb + 4] = ~static_cast<uint32_t>(h >> 32);
  reducer_->max_u32(pre, nb + kPreludeCheck);
  if (pre[nb + 1] != ~pre[nb + 3] || pre[nb + 2] != ~pre[nb + 4])
    fail(Status::kConfigMismatch, std::string("ranks disagree on the collective (scheme, table, block, width, count or op); "
                                              "this rank: ") + plan.cod->describe() + " count=" + std::to_string(plan.count));
  if (pre[nb] != 0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "0x%08x", pre[nb]);
    fail(Status::kNonFinite, std::string("input contains NaN or Inf (ranks mod 32 bitmap ") + buf +
                                 "); nothing was reduced");
  }
}

void Engine::account(const CallPlan& plan, uint64_t wire_total) {
  const size_t wsz = codec::int_size(plan.cod->sum_type());
  stats_.calls++;
  stats_.elements += plan.count;
  stats_.float_bytes += plan.count * 4;
  stats_.last_algo = plan.algo;
  if (plan.algo == Algo::kPs) {
    stats_.wire_bytes_up += plan.cod->packed_bytes(wire_total);
    stats_.wire_bytes_down += plan.down ? wire_total : wire_total * wsz;
  } else {
    stats_.wire_bytes_up += wire_total * wsz;
    stats_.wire_bytes_down += wire_total * wsz;
  }
}

void Engine::allreduce(codec::Scheme scheme, const void* send, void* recv, uint64_t count,
                       DType dtype, bool mean, ErrorFeedback* ef) {
  if (count == 0) return;
  if (!recv) fail(Status::kInvalidArgument, "allreduce: recvbuf is NULL");
  if (!send || send == THC_IN_PLACE) send = recv;

  // Device buffers: the registered backend (libthc_cuda, or an emulator in tests) decides; a
  // process without one is asked through its CUDA driver, and libthc_cuda is loaded on demand.
  DeviceBackend* dev = device_backend(false);
  bool on_device;
  if (dev) {
    on_device = dev->is_device(recv);
    if (dev->is_device(send) != on_device)
      fail(Status::kInvalidArgument, "sendbuf and recvbuf must both be host memory or both device memory");
  } else {
    on_device = driver_says_device(recv) || driver_says_device(send);
    if (on_device) {
      dev = device_backend(true);
      if (!dev)
        fail(Status::kUnsupported, "device buffers need libthc_cuda (the CUDA build of thc), which could not be loaded: " +
                                       device_backend_load_error());
      if (dev->is_device(send) != dev->is_device(recv))
        fail(Status::kInvalidArgument, "sendbuf and recvbuf must both be host memory or both device memory");
    }
  }
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

  const CallPlan p = plan(scheme, count, dtype, mean);
  if (on_device) {
    if (!device_) device_ = dev->open();
    device_->allreduce(*this, p, send, recv, ef);
  } else {
    allreduce_host(p, send, recv, ef);
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
  const float* efr = ef ? ef->residual.data() : nullptr;

  const uint64_t chunk_blocks = plan.chunk_blocks;
  const uint64_t chunk_elems = chunk_blocks * B;
  std::vector<float> xbuf(std::min<uint64_t>(chunk_elems, lay.nblocks * B));

  // ---- prelude: per-block statistics, a non-finite flag and a configuration digest, one MAX.
  const uint64_t nb = lay.nblocks;
  std::vector<uint32_t> pre(nb + kPreludeCheck, 0);
  bool finite = true;
  for (uint64_t b0 = 0; b0 < nb; b0 += chunk_blocks) {
    const uint64_t first = b0 * B;
    const uint64_t m = std::min<uint64_t>(count - first, chunk_blocks * B);
    load_as_float(send, dtype, first, m, efr ? efr + first : nullptr, xbuf.data());
    std::vector<float> st(std::min(chunk_blocks, nb - b0));
    finite &= host_->prelude(cod, xbuf.data(), m, st.data());
    for (size_t i = 0; i < st.size(); ++i) std::memcpy(&pre[b0 + i], &st[i], 4);
  }
  exchange_prelude(plan, pre.data(), finite);
  std::vector<float> stats(nb);
  for (uint64_t b = 0; b < nb; ++b) std::memcpy(&stats[b], &pre[b], 4);

  const codec::CallRng& rng = plan.rng;
  const Algo algo = plan.algo;
  const size_t wsz = codec::int_size(cod.sum_type());

  struct Slot {
    std::vector<float> x;  // this chunk's input (grad + e), kept for a worker left out
    std::vector<uint8_t> packed;
    std::vector<uint8_t> sums;
    std::unique_ptr<transport::Request> req;
    uint64_t b0 = 0, nblk = 0;
  };
  Slot slots[2];
  const uint64_t max_wire = chunk_blocks * B;
  for (Slot& s : slots) {
    s.x.resize(xbuf.size());
    s.sums.resize(max_wire * wsz);
    if (algo == Algo::kPs) s.packed.resize(cod.packed_bytes(max_wire) + 8);
  }

  std::vector<float> obuf(xbuf.size());
  auto finish = [&](Slot& s) {
    s.req->wait();
    int contrib = s.req->contributors();
    if (contrib < 0) contrib = n;
    const bool counted = s.req->self_counted();
    s.req.reset();
    const uint64_t first = s.b0 * B;
    const uint64_t m = std::min<uint64_t>(count - first, s.nblk * B);
    // Partial aggregation: SUM is scaled from the counted workers' mean to all n.
    const bool as_mean = mean || contrib != n;
    host_->decode(cod, lay, s.b0, s.nblk, s.sums.data(), stats.data() + s.b0, rng, contrib, as_mean, obuf.data());
    if (!mean && contrib != n)
      for (uint64_t i = 0; i < m; ++i) obuf[i] *= static_cast<float>(n);
    if (ef && !counted) {
      // Left out of the aggregate: the whole contribution x = grad + e stays in the residual.
      std::memcpy(ef->residual.data() + first, s.x.data(), m * sizeof(float));
    }
    store_from_float(obuf.data(), m, dtype, recv, first);
  };

  uint64_t wire_total = 0;
  int cur = 0;
  Slot* pending = nullptr;
  for (uint64_t b0 = 0; b0 < nb; b0 += chunk_blocks) {
    Slot& s = slots[cur];
    s.b0 = b0;
    s.nblk = std::min(chunk_blocks, nb - b0);
    const uint64_t first = b0 * B;
    const uint64_t m = std::min<uint64_t>(count - first, s.nblk * B);
    load_as_float(send, dtype, first, m, efr ? efr + first : nullptr, s.x.data());
    // Block by block (over THC_THREADS threads); the chunk in flight keeps progressing.
    codec::Codec::EncodeOut out;
    if (algo == Algo::kPs) {
      out.packed = s.packed.data();
    } else {
      out.values = s.sums.data();
    }
    if (ef) out.residual = ef->residual.data() + first;
    host_->encode(cod, lay, b0, s.nblk, s.x.data(), stats.data() + b0, rng, out, [&] {
      if (pending) pending->req->test();
    });
    uint64_t wire = 0;
    for (uint64_t k = 0; k < s.nblk; ++k) wire += lay.wire(b0 + k);
    wire_total += wire;
    if (algo == Algo::kPs) {
      s.req = reducer_->start_lookup_sum(s.packed.data(), wire, plan.table, s.sums.data(), cod.sum_type(),
                                         plan.down.get());
    } else {
      s.req = reducer_->start_sum(s.sums.data(), wire, cod.sum_type());
    }
    if (pending) finish(*pending);
    pending = &s;
    cur ^= 1;
  }
  if (pending) finish(*pending);
  account(plan, wire_total);
}

}  // namespace thc::engine
