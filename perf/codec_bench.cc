// Codec throughput: memcpy, RHT, THC and Cnat encode/decode over 64 MB of float32 (16 Mi Gaussian
// elements), each as bytes of float32 input per second and as a ratio to memcpy of the same run.
//
//   codec_bench                       all benchmarks, then the summary table
//   codec_bench --benchmark_filter=X  the usual Google Benchmark flags
//   codec_bench --cpu-time            one-core rows timed by the thread's CPU time instead of the
//                                     wall clock (the *Threads and threads:2 rows stay on the wall
//                                     clock): on a machine shared with other work, time slices
//                                     taken by others then do not count; memory contention still does
//   codec_bench --table-lookup=gather|registers
//                                     THC's rounding on AVX2 looks the cell table up by gathers or
//                                     from registers (default: registers on AMD, gathers elsewhere)
//   codec_bench --nmse                NMSE vs block size (THC b=4 g=30 p=1/32, 4 workers) instead
//
// Encode timings include the prelude (the per-block statistic), as the engine runs it; the MAX
// across workers is left out (one worker). Decode timings include the inverse RHT.
//
// How the blocks reach the codec (the `calls` argument of the encode rows):
//   calls:0  one Codec::encode for all blocks (one core)
//   calls:1  one call per block with a reused codec::Workspace: what the engine does (one core)
//   calls:2  one call per block, each allocating its own scratch (a caller without a workspace)
// BM_LookupAdd, BM_AddInts, BM_FloatSum: the transports' reductions (the scale model's inputs,
// perf/model/calibrate.sh), per element of the input; BM_LookupAddCnat: 5-bit codes into 16-bit
// sums.
// BM_ThcEncodePhase / BM_CnatEncodePhase (phase 0: the prelude alone, 1: the encodes alone, 2: the
// encodes alone on one cached block) and BM_ThcDecodeHot (one cached block) split the time.
// The *Threads rows run the engine's host codec (engine::HostCodec, THC_THREADS): prelude and
// encode (or decode) spread over `threads` threads block by block; memcpy stays on one core.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "collectives/codec/codec.h"
#include "collectives/codec/codec_simd.h"
#include "collectives/codec/rht.h"
#include "collectives/engine/host_codec.h"
#include "transport/reducer.h"

namespace {

using thc::codec::CallRng;
using thc::codec::Codec;
using thc::codec::Layout;
using thc::codec::Params;
using thc::codec::Scheme;

constexpr uint64_t kCount = uint64_t{16} << 20;  // 64 MB of float32
constexpr int kWorkers = 4;

std::vector<float> gaussian(uint64_t n, uint32_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

// |x| = exp(sigma * N(0,1)), random sign.
std::vector<float> lognormal(uint64_t n, uint32_t seed, double sigma) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<float> v(n);
  for (auto& x : v) {
    const double m = std::exp(sigma * d(gen));
    x = static_cast<float>((gen() & 1) ? -m : m);
  }
  return v;
}

const std::vector<float>& input() {
  static const std::vector<float> x = gaussian(kCount, 1);
  return x;
}

Params thc_params(int block_log2) {
  Params p;
  p.scheme = Scheme::kThc;
  p.bits = 4;
  p.granularity = 30;
  p.p = 1.0 / 32;
  p.block_log2 = block_log2;
  return p;
}

Params cnat_params(int block_log2) {
  Params p;
  p.scheme = Scheme::kCnat;
  p.block_log2 = block_log2;
  return p;
}

void set_bytes(benchmark::State& state) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(kCount * sizeof(float)));
}

void BM_Memcpy(benchmark::State& state) {
  const auto& x = input();
  std::vector<float> y(kCount, 1.0f);
  for (auto _ : state) {
    std::memcpy(y.data(), x.data(), kCount * sizeof(float));
    benchmark::ClobberMemory();
  }
  set_bytes(state);
}

// What encode does before quantising: copy a block into the work buffer, signs, FWHT.
void BM_Rht(benchmark::State& state) {
  const auto& x = input();
  const uint64_t B = uint64_t{1} << state.range(0);
  std::vector<float> work(B);
  const thc::rng::Stream shared{7, thc::rng::kSharedStream, 0};
  for (auto _ : state) {
    for (uint64_t b = 0; b < kCount / B; ++b) {
      std::memcpy(work.data(), x.data() + b * B, B * sizeof(float));
      thc::codec::apply_signs(work.data(), B, shared, b);
      thc::codec::fwht(work.data(), B);
    }
    benchmark::DoNotOptimize(work.data());
  }
  set_bytes(state);
}

// range(0): log2 block; range(1): 0 = index form (packed), 1 = value form; range(2) (optional):
// calls (see the top of the file).
void encode_bench(benchmark::State& state, const Params& params) {
  const auto& x = input();
  const Codec c(params, kWorkers);
  const Layout l = c.layout(kCount);
  std::vector<float> stats(l.nblocks);
  std::vector<uint8_t> packed(c.packed_bytes(l.wire_count));
  std::vector<uint8_t> values(l.wire_count * thc::codec::int_size(c.sum_type()));
  Codec::EncodeOut out;
  if (state.range(1) == 0) {
    out.packed = packed.data();
  } else {
    out.values = values.data();
  }
  const int calls = static_cast<int>(state.range(2));
  const size_t wsz = thc::codec::int_size(c.sum_type());
  thc::codec::Workspace ws;
  uint32_t round = 0;
  for (auto _ : state) {
    c.prelude(x.data(), kCount, stats.data());
    const CallRng rng{7, 0, round++};
    if (calls == 0) {
      c.encode(l, 0, l.nblocks, x.data(), stats.data(), rng, out);
    } else {
      for (uint64_t b = 0; b < l.nblocks; ++b) {
        Codec::EncodeOut o;
        if (out.packed) o.packed = out.packed + b * l.block * c.index_bits() / 8;
        if (out.values) o.values = static_cast<uint8_t*>(out.values) + b * l.block * wsz;
        c.encode(l, b, 1, x.data() + b * l.block, stats.data() + b, rng, o, calls == 1 ? &ws : nullptr);
      }
    }
    benchmark::ClobberMemory();
  }
  set_bytes(state);
}

// Where an encode's time goes (range(0): log2 block; index form, one call per block with a
// reused Workspace, as calls:1): range(1) = 0 the prelude alone (its read of the 64 MB input),
// 1 the encodes alone (statistics computed beforehand, so the input comes from memory again),
// 2 the encodes alone on one block of the input kept in cache (the first block, encoded
// kCount / B times: the rate of the arithmetic without memory traffic).
void encode_phase_bench(benchmark::State& state, const Params& params) {
  const auto& x = input();
  const Codec c(params, kWorkers);
  const int phase = static_cast<int>(state.range(1));
  const Layout l = c.layout(kCount);
  std::vector<float> stats(l.nblocks);
  c.prelude(x.data(), kCount, stats.data());
  std::vector<uint8_t> packed(c.packed_bytes(l.wire_count));
  thc::codec::Workspace ws;
  uint32_t round = 0;
  for (auto _ : state) {
    if (phase == 0) {
      c.prelude(x.data(), kCount, stats.data());
    } else {
      const CallRng rng{7, 0, round++};
      for (uint64_t b = 0; b < l.nblocks; ++b) {
        const uint64_t src = phase == 1 ? b : 0;
        Codec::EncodeOut o;
        o.packed = packed.data() + b * l.block * c.index_bits() / 8;
        c.encode(l, src, 1, x.data() + src * l.block, stats.data() + src, rng, o, &ws);
      }
    }
    benchmark::ClobberMemory();
  }
  set_bytes(state);
}

// The engine's host codec with range(2) threads (range(0): log2 block, range(1): form).
void encode_threads_bench(benchmark::State& state, const Params& params) {
  const auto& x = input();
  const Codec c(params, kWorkers);
  const Layout l = c.layout(kCount);
  thc::engine::HostCodec hc(static_cast<int>(state.range(2)));
  std::vector<float> stats(l.nblocks);
  std::vector<uint8_t> packed(c.packed_bytes(l.wire_count));
  std::vector<uint8_t> values(l.wire_count * thc::codec::int_size(c.sum_type()));
  Codec::EncodeOut out;
  if (state.range(1) == 0) {
    out.packed = packed.data();
  } else {
    out.values = values.data();
  }
  uint32_t round = 0;
  for (auto _ : state) {
    hc.prelude(c, x.data(), kCount, stats.data());
    hc.encode(c, l, 0, l.nblocks, x.data(), stats.data(), CallRng{7, 0, round++}, out);
    benchmark::ClobberMemory();
  }
  set_bytes(state);
}

// What a decode reads: the sums of kWorkers workers' value-form codes of x (layout l, the
// statistics of x), each worker with its own rounding stream.
std::vector<uint8_t> worker_sums(const Codec& c, const Layout& l, const float* x, const float* stats) {
  const size_t w = thc::codec::int_size(c.sum_type());
  std::vector<uint8_t> vals(l.wire_count * w), sums(l.wire_count * w);
  std::vector<int64_t> total(l.wire_count, 0);
  for (int r = 0; r < kWorkers; ++r) {
    Codec::EncodeOut out;
    out.values = vals.data();
    c.encode(l, 0, l.nblocks, x, stats, CallRng{7, static_cast<uint32_t>(r), 0}, out);
    for (uint64_t i = 0; i < l.wire_count; ++i) total[i] += thc::codec::load_int(c.sum_type(), vals.data(), i);
  }
  for (uint64_t i = 0; i < l.wire_count; ++i) thc::codec::store_int(c.sum_type(), sums.data(), i, total[i]);
  return sums;
}

void decode_bench(benchmark::State& state, const Params& params) {
  const auto& x = input();
  const Codec c(params, kWorkers);
  const Layout l = c.layout(kCount);
  std::vector<float> stats(l.nblocks);
  c.prelude(x.data(), kCount, stats.data());
  const std::vector<uint8_t> sums = worker_sums(c, l, x.data(), stats.data());
  std::vector<float> y(kCount);
  // range(1) (optional): threads of the engine's host codec (0: Codec::decode directly).
  const int threads = static_cast<int>(state.range(1));
  thc::engine::HostCodec hc(std::max(1, threads));
  for (auto _ : state) {
    if (threads == 0) {
      c.decode(l, 0, l.nblocks, sums.data(), stats.data(), CallRng{7, 0, 0}, kWorkers, true, y.data());
    } else {
      hc.decode(c, l, 0, l.nblocks, sums.data(), stats.data(), CallRng{7, 0, 0}, kWorkers, true, y.data());
    }
    benchmark::ClobberMemory();
  }
  set_bytes(state);
}

// The decode of one block kept in cache (the first block's sums, decoded kCount / B times into
// the same output block, which stays in cache too): the rate of the arithmetic without memory
// traffic, to set against BM_ThcDecode's 64 MB.
void decode_hot_bench(benchmark::State& state, const Params& params) {
  const auto& x = input();
  const Codec c(params, kWorkers);
  const uint64_t B = c.block();
  const Layout l = c.layout(B);
  float stat = 0;
  c.prelude(x.data(), B, &stat);
  const std::vector<uint8_t> sums = worker_sums(c, l, x.data(), &stat);
  std::vector<float> y(B);
  thc::codec::Workspace ws;
  for (auto _ : state) {
    for (uint64_t b = 0; b < kCount / B; ++b)
      c.decode(l, 0, 1, sums.data(), &stat, CallRng{7, 0, 0}, kWorkers, true, y.data(), &ws);
    benchmark::ClobberMemory();
  }
  set_bytes(state);
}

// The reductions the transports run between encode and decode, per element of the input (so their
// rates read like the codec's, bytes of float32 per second): the colocated PS owner's table lookup
// and add of b=4 packed indices into u8 sums (transport lookup_add, once per contributor), the
// integer ring's add of received sums (add_ints; range(0): sum bytes 1 or 2), and the float32 sum
// of an uncompressed ring (what MPI_SUM does to a received segment).
void BM_LookupAdd(benchmark::State& state) {
  thc::transport::LookupTable t;
  t.bits = 4;
  for (int z = 0; z < 16; ++z) t.values.push_back(2 * z);
  std::vector<uint8_t> packed(kCount / 2);
  std::mt19937 gen(3);
  for (auto& v : packed) v = static_cast<uint8_t>(gen());
  std::vector<uint8_t> acc(kCount, 0);
  for (auto _ : state) {
    thc::transport::lookup_add(t, packed.data(), 0, kCount, thc::transport::IntType::kU8, acc.data());
    benchmark::ClobberMemory();
  }
  set_bytes(state);
}

// Cnat's default reduction: 5-bit codes into 16-bit sums (table of +-2^k).
void BM_LookupAddCnat(benchmark::State& state) {
  thc::transport::LookupTable t;
  t.bits = 5;
  for (int z = 0; z < 32; ++z) t.values.push_back(z == 0 || z == 16 ? 0 : (z < 16 ? 1 : -1) * (1 << (z % 16 - 1)));
  std::vector<uint8_t> packed(kCount * 5 / 8);
  std::mt19937 gen(3);
  for (auto& v : packed) v = static_cast<uint8_t>(gen());
  std::vector<uint16_t> acc(kCount, 0);
  for (auto _ : state) {
    thc::transport::lookup_add(t, packed.data(), 0, kCount, thc::transport::IntType::kU16, acc.data());
    benchmark::ClobberMemory();
  }
  set_bytes(state);
}

void BM_AddInts(benchmark::State& state) {
  const auto type = state.range(0) == 1 ? thc::transport::IntType::kU8 : thc::transport::IntType::kU16;
  const size_t w = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> src(kCount * w, 1), dst(kCount * w, 0);
  for (auto _ : state) {
    thc::transport::add_ints(type, dst.data(), src.data(), kCount);
    benchmark::ClobberMemory();
  }
  set_bytes(state);
}

void BM_FloatSum(benchmark::State& state) {
  const auto& x = input();
  std::vector<float> y(kCount, 1.0f);
  for (auto _ : state) {
    float* __restrict d = y.data();
    const float* __restrict s = x.data();
    for (uint64_t i = 0; i < kCount; ++i) d[i] += s[i];
    benchmark::ClobberMemory();
  }
  set_bytes(state);
}

void BM_ThcEncode(benchmark::State& state) { encode_bench(state, thc_params(static_cast<int>(state.range(0)))); }
void BM_ThcEncodeThreads(benchmark::State& state) {
  encode_threads_bench(state, thc_params(static_cast<int>(state.range(0))));
}
void BM_CnatEncodeThreads(benchmark::State& state) {
  encode_threads_bench(state, cnat_params(static_cast<int>(state.range(0))));
}
void BM_ThcEncodePhase(benchmark::State& state) {
  encode_phase_bench(state, thc_params(static_cast<int>(state.range(0))));
}
void BM_CnatEncodePhase(benchmark::State& state) {
  encode_phase_bench(state, cnat_params(static_cast<int>(state.range(0))));
}
void BM_ThcDecodeHot(benchmark::State& state) { decode_hot_bench(state, thc_params(static_cast<int>(state.range(0)))); }
void BM_ThcDecode(benchmark::State& state) { decode_bench(state, thc_params(static_cast<int>(state.range(0)))); }
void BM_CnatEncode(benchmark::State& state) { encode_bench(state, cnat_params(static_cast<int>(state.range(0)))); }
void BM_CnatDecode(benchmark::State& state) { decode_bench(state, cnat_params(static_cast<int>(state.range(0)))); }

bool g_cpu_time = false;  // --cpu-time

// One core: wall clock, or the thread's CPU time with --cpu-time.
void common(benchmark::internal::Benchmark* b) {
  b->Unit(benchmark::kMillisecond)->MinTime(1.0);
  if (!g_cpu_time) b->UseRealTime();
}
// Rows that run more threads than the timing one: always the wall clock.
void common_threads(benchmark::internal::Benchmark* b) {
  b->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
}

// Registered after the flags are read (--cpu-time changes the rows' clock).
void register_benchmarks() {
  benchmark::RegisterBenchmark("BM_Memcpy", BM_Memcpy)->Apply(common);
  benchmark::RegisterBenchmark("BM_Rht", BM_Rht)->ArgName("log2B")->Arg(16)->Apply(common);
  // Block 2^14 is the default THC_BLOCK.
  benchmark::RegisterBenchmark("BM_ThcEncode", BM_ThcEncode)
      ->ArgNames({"log2B", "value", "calls"})
      ->Args({16, 0, 0})
      ->Args({16, 1, 0})
      ->Args({10, 0, 0})
      ->Args({12, 0, 0})
      ->Args({14, 0, 0})
      ->Args({18, 0, 0})
      ->Args({20, 0, 0})
      ->Args({14, 0, 1})
      ->Args({14, 0, 2})
      ->Args({14, 1, 1})
      ->Apply(common);
  benchmark::RegisterBenchmark("BM_ThcDecode", BM_ThcDecode)
      ->ArgNames({"log2B", "threads"})
      ->Args({16, 0})
      ->Args({14, 0})
      ->Apply(common);
  benchmark::RegisterBenchmark("BM_CnatEncode", BM_CnatEncode)
      ->ArgNames({"log2B", "value", "calls"})
      ->Args({16, 1, 0})
      ->Args({16, 0, 0})
      ->Args({14, 0, 0})
      ->Args({14, 0, 1})
      ->Args({14, 0, 2})
      ->Args({14, 1, 1})
      ->Apply(common);
  benchmark::RegisterBenchmark("BM_CnatDecode", BM_CnatDecode)
      ->ArgNames({"log2B", "threads"})
      ->Args({16, 0})
      ->Args({14, 0})
      ->Apply(common);
  for (auto [name, fn] : {std::pair{"BM_ThcEncodePhase", BM_ThcEncodePhase}, {"BM_CnatEncodePhase", BM_CnatEncodePhase}})
    benchmark::RegisterBenchmark(name, fn)->ArgNames({"log2B", "phase"})->Args({14, 0})->Args({14, 1})->Args({14, 2})->Apply(common);
  benchmark::RegisterBenchmark("BM_ThcDecodeHot", BM_ThcDecodeHot)->ArgName("log2B")->Arg(14)->Apply(common);
  benchmark::RegisterBenchmark("BM_LookupAdd", BM_LookupAdd)->Apply(common);
  benchmark::RegisterBenchmark("BM_LookupAddCnat", BM_LookupAddCnat)->Apply(common);
  benchmark::RegisterBenchmark("BM_AddInts", BM_AddInts)->ArgName("bytes")->Arg(1)->Arg(2)->Apply(common);
  benchmark::RegisterBenchmark("BM_FloatSum", BM_FloatSum)->Apply(common);
  benchmark::RegisterBenchmark("BM_ThcEncodeThreads", BM_ThcEncodeThreads)
      ->ArgNames({"log2B", "value", "threads"})
      ->Args({14, 0, 2})
      ->Apply(common_threads);
  benchmark::RegisterBenchmark("BM_CnatEncodeThreads", BM_CnatEncodeThreads)
      ->ArgNames({"log2B", "value", "threads"})
      ->Args({14, 0, 2})
      ->Apply(common_threads);
  benchmark::RegisterBenchmark("BM_ThcDecode", BM_ThcDecode)
      ->ArgNames({"log2B", "threads"})
      ->Args({14, 2})
      ->Apply(common_threads);
  benchmark::RegisterBenchmark("BM_CnatDecode", BM_CnatDecode)
      ->ArgNames({"log2B", "threads"})
      ->Args({14, 2})
      ->Apply(common_threads);
}

// Console output as usual, plus the bytes/s of every run for the summary table.
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      const auto it = r.counters.find("bytes_per_second");
      if (it == r.counters.end()) continue;
      const std::string name = r.benchmark_name();
      if (r.run_type == Run::RT_Aggregate && r.aggregate_name != "median") continue;
      if (r.run_type == Run::RT_Aggregate) {
        // "X_median" replaces the per-repetition entries of X
        const std::string base = name.substr(0, name.size() - std::string("_median").size());
        rate_[base] = it->second.value;
      } else if (!rate_.count(name)) {
        order_.push_back(name);
        rate_[name] = it->second.value;
      } else {
        rate_[name] = it->second.value;
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
  void Summary() const {
    double mem = 0;
    for (const auto& n : order_)
      if (n.rfind("BM_Memcpy", 0) == 0) mem = rate_.at(n);
    std::printf("\n%-42s %8s %16s\n", "op", "GB/s", "ratio_to_memcpy");
    for (const auto& n : order_) {
      const double r = rate_.at(n);
      std::printf("%-42s %8.3f %16.3f\n", n.c_str(), r / 1e9, mem > 0 ? r / mem : 0.0);
    }
  }

 private:
  std::vector<std::string> order_;
  std::map<std::string, double> rate_;
};

// ---------------------------------------------------------------------------------------------
// NMSE of the decoded mean against the true mean of 4 workers: ||est - mean||^2 / ||mean||^2,
// averaged over rounds, for each block size.
double nmse_once(const Codec& c, const std::vector<std::vector<float>>& xs, uint32_t round) {
  const uint64_t n = xs[0].size();
  const Layout l = c.layout(n);
  std::vector<float> stats(l.nblocks, 0.0f), s(l.nblocks);
  for (const auto& x : xs) {
    c.prelude(x.data(), n, s.data());
    for (uint64_t b = 0; b < l.nblocks; ++b) stats[b] = std::max(stats[b], s[b]);
  }
  const size_t w = thc::codec::int_size(c.sum_type());
  std::vector<uint8_t> vals(l.wire_count * w), sums(l.wire_count * w);
  std::vector<int64_t> total(l.wire_count, 0);
  for (size_t r = 0; r < xs.size(); ++r) {
    Codec::EncodeOut out;
    out.values = vals.data();
    c.encode(l, 0, l.nblocks, xs[r].data(), stats.data(), CallRng{11, static_cast<uint32_t>(r), round}, out);
    for (uint64_t i = 0; i < l.wire_count; ++i) total[i] += thc::codec::load_int(c.sum_type(), vals.data(), i);
  }
  for (uint64_t i = 0; i < l.wire_count; ++i) thc::codec::store_int(c.sum_type(), sums.data(), i, total[i]);
  std::vector<float> est(n);
  c.decode(l, 0, l.nblocks, sums.data(), stats.data(), CallRng{11, 0, round}, static_cast<int>(xs.size()), true,
           est.data());
  double err = 0, ref = 0;
  for (uint64_t i = 0; i < n; ++i) {
    double m = 0;
    for (const auto& x : xs) m += x[i];
    m /= static_cast<double>(xs.size());
    err += (est[i] - m) * (est[i] - m);
    ref += m * m;
  }
  return err / ref;
}

int run_nmse() {
  const uint64_t n = uint64_t{1} << 22;  // 4 Mi per worker: at least 4 blocks of 2^20
  const int rounds = 3;
  struct Dist {
    const char* name;
    double sigma;  // 0 = Gaussian
  };
  const Dist dists[] = {{"gaussian", 0}, {"lognormal_s1", 1.0}, {"lognormal_s2", 2.0}};
  std::printf("THC b=4 g=30 p=1/32, %d workers, %llu elements each, %d rounds\n", kWorkers,
              static_cast<unsigned long long>(n), rounds);
  {
    const Codec c(thc_params(16), kWorkers);
    std::printf("codec: %s\n", c.describe().c_str());
  }
  std::printf("%-8s", "log2B");
  for (const auto& d : dists) std::printf(" %14s", d.name);
  std::printf("\n");
  std::vector<std::vector<std::vector<std::vector<float>>>> data;  // dist, round, worker
  for (const auto& d : dists) {
    data.emplace_back();
    for (int r = 0; r < rounds; ++r) {
      std::vector<std::vector<float>> xs;
      for (int w = 0; w < kWorkers; ++w) {
        const uint32_t seed = 1000u * static_cast<uint32_t>(r) + static_cast<uint32_t>(w) + 1;
        xs.push_back(d.sigma == 0 ? gaussian(n, seed) : lognormal(n, seed, d.sigma));
      }
      data.back().push_back(std::move(xs));
    }
  }
  for (int lb = 10; lb <= 20; ++lb) {
    const Codec c(thc_params(lb), kWorkers);
    std::printf("%-8d", lb);
    for (size_t di = 0; di < data.size(); ++di) {
      double s = 0;
      for (int r = 0; r < rounds; ++r) s += nmse_once(c, data[di][r], static_cast<uint32_t>(r));
      std::printf(" %14.6f", s / rounds);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--nmse") == 0) return run_nmse();
    if (std::strcmp(argv[i], "--cpu-time") == 0) {
      g_cpu_time = true;
      continue;
    }
    // THC rounding on AVX2 (g <= 31): force one of the two table lookups (default: by CPU vendor)
    using thc::codec::kern::TableLookup;
    if (std::strcmp(argv[i], "--table-lookup=gather") == 0) {
      thc::codec::kern::set_avx2_table_lookup(TableLookup::kGather);
      continue;
    }
    if (std::strcmp(argv[i], "--table-lookup=registers") == 0) {
      thc::codec::kern::set_avx2_table_lookup(TableLookup::kRegisters);
      continue;
    }
    argv[kept++] = argv[i];
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_benchmarks();
  std::printf("SIMD target: %s; one-core rows timed by %s; THC table lookup on AVX2: %s\n",
              thc::codec::simd_target(), g_cpu_time ? "the thread's CPU time" : "the wall clock",
              thc::codec::kern::avx2_table_in_registers() ? "registers" : "gathers");
  SummaryReporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  rep.Summary();
  benchmark::Shutdown();
  return 0;
}
