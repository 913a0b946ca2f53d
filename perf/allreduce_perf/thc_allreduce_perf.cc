// thc_allreduce_perf: allreduce bandwidth and accuracy, nccl-tests conventions.
//
//   mpirun -np 4 thc_allreduce_perf -b 1M -e 256M -f 2 --scheme thc --algo ps
//
// One row per size: size count type redop time algbw busbw, computed as nccl-tests does
// (size = the input's uncompressed bytes, time = average over -n iterations of the slowest rank,
// algbw = size / time, busbw = algbw * 2(n-1)/n), then
//   wire_B/elem  bytes each rank sends per element (= receives): for thc schemes from
//                thc_comm_stats, (up + down) * (n-1)/n -- a ring allreduce of values moves
//                (n-1)/n of them in each phase, the colocated PS (n-1)/n of the indices up and
//                of the sums down; on a hierarchical communicator (THC_HIER) the compressed stage's
//                (H-1)/H share across H hosts; for --scheme none a ring allreduce's
//                2(n-1)/n * element size (bf16: 2 bytes);
//                with --aggregator the datagrams this rank's link carried, counted (headers,
//                retransmissions and the prelude included, no model), in its busier direction
//                (the JSON has both: wire_up_per_elem, wire_down_per_elem)
//   nmse         ||est - exact||^2 / ||exact||^2 over the -c check iterations (worst), where exact
//                is MPI_Allreduce on MPI_DOUBLE of the same (typed) inputs
//   algo         int | ps (what thc ran) or mpi (--scheme none, bf16)
// instead of #wrong. Exits 1 when a check exceeds --nmse-bound. The --json rows also hold
// host_link_per_elem: what the busiest host's link carries per element, in its busier direction,
// summed over the ranks of that host (MPI_COMM_TYPE_SHARED, or THC_HIER_HOSTS where set), so that
// layouts with several ranks per host compare against their wire limit.
//
// --scheme bf16 is the baseline Horovod / PyTorch DDP users turn on first: float32 -> bfloat16
// (round to nearest even), MPI_Allreduce with a user op that adds bfloat16 pairs in float and
// rounds back to nearest even, -> float32 (2x compression; the conversions are timed).
//
// --device puts the buffers in CUDA device memory (rank r on device r mod #devices), as
// nccl-tests do: thc then runs its codec on the GPU and stages only compressed integers through
// host memory; --scheme none stages the floats (cudaMemcpy, MPI_Allreduce, cudaMemcpy), which is
// what an MPI without CUDA support needs. Times include those copies.
//
// --nccl (CUDA builds with NCCL) runs ncclAllReduce on device buffers instead, one NCCL rank per MPI
// process (ncclUniqueId broadcast over MPI, as nccl-tests do): the way to drive NCCL, and the thc
// net plugin under it, with this tool. Timing as nccl-tests: -n launches back to back on one
// stream, then one synchronize. Compression, if any, is the plugin's (NCCL_NET_PLUGIN=thc
// NCCL_COLLNET_ENABLE=1 THC_COLLNET_AGGREGATOR=...): --scheme stays none, the NMSE column shows
// what it cost (pass --nmse-bound, e.g. 0.1, when CollNet compresses). wire_B/elem is the nominal
// 2(n-1)/n * element size of an uncompressed ring; algo says "nccl".
//
// --op reduce_scatter times the ZeRO / FSDP gradient step instead: size is the whole input of a rank
// (nccl-tests' reduce_scatter_perf convention), each rank receives size/n bytes (equal shards of
// count/n elements), busbw = algbw * (n-1)/n. thc schemes run thc_reduce_scatter (the colocated
// PS without its allgather, or a ring reduce-scatter of values), --scheme none
// MPI_Reduce_scatter_block, bf16 the same on bfloat16. wire_B/elem is what a rank sends per input
// element: (n-1)/n of its codes (thc), of its element bytes (none, bf16). The NMSE compares each
// rank's shard with its exact shard. -o/--op takes the reduction (sum, avg) and the collective
// (allreduce, reduce_scatter) alike, e.g. --op reduce_scatter -o avg. With --device, thc schemes
// reduce-scatter device buffers (the device codec on the engine's stream path) and --scheme none
// stages the floats through host memory around MPI_Reduce_scatter_block.
//
// --op allgather times the parameter gather of ZeRO / FSDP (a LOSSY one: thc_allgather): size is
// the whole output of a rank (nccl-tests' all_gather_perf convention), each rank contributes
// size/n bytes, busbw = algbw * (n-1)/n. thc schemes run thc_allgather (each shard encoded once,
// its codes gathered, decoded everywhere), --scheme none MPI_Allgather, bf16 the same on bfloat16.
// wire_B/elem is what a rank receives per output element: the other ranks' codes (thc, counted),
// (n-1)/n of the element bytes (none, bf16). The NMSE compares the whole output with the exact
// gather.
#include <mpi.h>
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "collectives/codec/rht.h"
#include "collectives/engine/dtype.h"
#include "thc/thc_mpi.h"
#if defined(THC_PERF_CUDA)
#include <cuda_runtime.h>

#include "collectives/engine/device.h"
#include "cuda/thc_cuda.h"
#if defined(THC_CUDA_HAVE_NCCL)
#include <nccl.h>
#define THC_PERF_NCCL 1
#endif
#endif


namespace {

using thc::engine::bf16_to_float;
using thc::engine::float_to_bf16;
using thc::engine::float_to_half;
using thc::engine::half_to_float;

int g_rank = 0, g_size = 1;
// This rank's host (MPI_COMM_TYPE_SHARED, or the hosts THC_HIER_HOSTS emulates) and the layout.
MPI_Comm g_host_comm = MPI_COMM_NULL;
int g_hosts = 1, g_host_rank = 0, g_host_size = 1, g_host_size_max = 1;
bool g_hosts_emulated = false;

// A usage or configuration error every rank detects alike: rank 0 says it, all leave cleanly.
[[noreturn]] void die_all(const std::string& msg) {
  if (g_rank == 0) std::fprintf(stderr, "thc_allreduce_perf: %s\n", msg.c_str());
  std::fflush(stderr);
  MPI_Finalize();
  std::exit(2);
}

const char* status_name(thc_status_t st) {
  switch (st) {
    case THC_SUCCESS: return "THC_SUCCESS";
    case THC_ERR_INVALID_ARG: return "THC_ERR_INVALID_ARG";
    case THC_ERR_NONFINITE: return "THC_ERR_NONFINITE";
    case THC_ERR_CONFIG_MISMATCH: return "THC_ERR_CONFIG_MISMATCH";
    case THC_ERR_OVERFLOW: return "THC_ERR_OVERFLOW";
    case THC_ERR_TRANSPORT: return "THC_ERR_TRANSPORT";
    case THC_ERR_TIMEOUT: return "THC_ERR_TIMEOUT";
    case THC_ERR_UNSUPPORTED: return "THC_ERR_UNSUPPORTED";
    case THC_ERR_NO_MEMORY: return "THC_ERR_NO_MEMORY";
    case THC_ERR_INTERNAL: return "THC_ERR_INTERNAL";
    default: break;
  }
  return "unknown status";
}

// A runtime failure (possibly on one rank only): abort the job.
[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "thc_allreduce_perf[%d]: %s\n", g_rank, msg.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::exit(2);
}

// ---- sizes: "64", "4K", "1M", "1G" (powers of 1024, as nccl-tests)
bool parse_size(const std::string& s, uint64_t* out) {
  if (s.empty()) return false;
  size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  if (i == 0) return false;
  uint64_t v = std::stoull(s.substr(0, i));
  const std::string suf = s.substr(i);
  uint64_t mul = 1;
  if (suf.empty() || suf == "B" || suf == "b") mul = 1;
  else if (suf == "K" || suf == "k" || suf == "KB" || suf == "KiB") mul = uint64_t{1} << 10;
  else if (suf == "M" || suf == "m" || suf == "MB" || suf == "MiB") mul = uint64_t{1} << 20;
  else if (suf == "G" || suf == "g" || suf == "GB" || suf == "GiB") mul = uint64_t{1} << 30;
  else return false;
  *out = v * mul;
  return true;
}

// ---- element types
struct TypeInfo {
  const char* name;
  size_t size;
  thc_dtype_t thc;
};
TypeInfo type_info(const std::string& d) {
  if (d == "float" || d == "float32") return {"float", 4, THC_FLOAT32};
  if (d == "half" || d == "float16") return {"half", 2, THC_FLOAT16};
  if (d == "bfloat16" || d == "bf16") return {"bfloat16", 2, THC_BFLOAT16};
  if (d == "double" || d == "float64") return {"double", 8, THC_FLOAT64};
  die_all("unknown -d type '" + d + "' (float, half, bfloat16, double)");
}

double load(const void* buf, thc_dtype_t t, size_t i) {
  switch (t) {
    case THC_FLOAT32: return static_cast<const float*>(buf)[i];
    case THC_FLOAT64: return static_cast<const double*>(buf)[i];
    case THC_FLOAT16: return half_to_float(static_cast<const uint16_t*>(buf)[i]);
    case THC_BFLOAT16: return bf16_to_float(static_cast<const uint16_t*>(buf)[i]);
    default: break;
  }
  return 0;
}
void store(void* buf, thc_dtype_t t, size_t i, double v) {
  switch (t) {
    case THC_FLOAT32: static_cast<float*>(buf)[i] = static_cast<float>(v); break;
    case THC_FLOAT64: static_cast<double*>(buf)[i] = v; break;
    case THC_FLOAT16: static_cast<uint16_t*>(buf)[i] = float_to_half(static_cast<float>(v)); break;
    case THC_BFLOAT16: static_cast<uint16_t*>(buf)[i] = float_to_bf16(static_cast<float>(v)); break;
    default: break;
  }
}

// 16-bit float SUM for --scheme none on half/bfloat16 inputs and for --scheme bf16 (MPI has no
// half/bfloat16 arithmetic of its own): the sum of two values is computed in float and rounded
// back to nearest even, as a 16-bit MPI_Allreduce (or a bf16 compression hook's op) would.
MPI_Datatype g_f16 = MPI_DATATYPE_NULL, g_bf16 = MPI_DATATYPE_NULL;
void sum16(void* in, void* inout, int* len, MPI_Datatype* dt) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  if (*dt == g_f16) {
    for (int i = 0; i < *len; ++i) b[i] = float_to_half(half_to_float(a[i]) + half_to_float(b[i]));
  } else {
    for (int i = 0; i < *len; ++i) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
  }
}
MPI_Op g_sum16 = MPI_OP_NULL;

MPI_Datatype mpi_type(thc_dtype_t t) {
  switch (t) {
    case THC_FLOAT32: return MPI_FLOAT;
    case THC_FLOAT64: return MPI_DOUBLE;
    case THC_FLOAT16: return g_f16;
    case THC_BFLOAT16: return g_bf16;
    default: break;
  }
  return MPI_DATATYPE_NULL;
}

// MPI counts are int: reduce in pieces of at most 2^30 elements.
void mpi_allreduce_big(const void* send, void* recv, size_t count, MPI_Datatype dt, size_t esize, MPI_Op op) {
  const size_t piece = size_t{1} << 30;
  for (size_t off = 0; off < count || (count == 0 && off == 0); off += piece) {
    const size_t m = std::min(piece, count - off);
    const char* s = send == MPI_IN_PLACE ? static_cast<const char*>(MPI_IN_PLACE)
                                         : static_cast<const char*>(send) + off * esize;
    const int rc = MPI_Allreduce(s, static_cast<char*>(recv) + off * esize, static_cast<int>(m), dt, op, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) die("MPI_Allreduce failed");
    if (count == 0) break;
  }
}

struct Options {
  std::string min_s = "32M", max_s = "32M", step_s = "1M";
  uint64_t min_bytes = 0, max_bytes = 0, step_bytes = 0;
  double factor = 1;
  int iters = 20, warmup = 5, checks = 1;
  std::string dtype = "float", op = "sum", scheme = "none", algo = "auto";
  std::vector<std::string> ops;  // -o/--op values: sum|avg and allreduce|reduce_scatter
  bool rs = false;  // --op reduce_scatter
  bool ag = false;  // --op allgather
  int bits = -1, granularity = -1, nat_width = -1, nat_levels = -1, bidir = -1;
  std::string p, dnat_norm;
  long block = -1;
  bool ef = false;
  bool device = false;
  bool nccl = false;
  uint64_t seed = 0;
  std::string json, aggregator, ucx;
  double nmse_bound = -1;
};

struct Row {
  uint64_t size, count;
  std::string type, redop, algo;
  double time_us, algbw, busbw, wire, nmse;
  uint64_t packets = 0, retrans = 0;  // aggregator communicators: over all ranks
  double wire_up = 0, wire_down = 0;  // per element and rank, each direction (wire = up + down)
  double host_link = 0;               // per element on the busiest host link, its busier direction
  int hier_hosts = 0;                 // the compressed stage's hosts (hierarchical), 0: flat
};

// The host layout: what the library's THC_HIER split sees (THC_HIER_HOSTS: consecutive blocks
// of MPI_COMM_WORLD ranks of the given sizes, a test aid).
void find_hosts() {
  int colour = -1;
  if (const char* e = std::getenv("THC_HIER_HOSTS"); e && *e) {
    const std::string v = e;
    size_t pos = 0;
    int acc = 0, h = 0;
    while (pos <= v.size()) {
      const size_t comma = std::min(v.find(',', pos), v.size());
      const std::string item = v.substr(pos, comma - pos);
      if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos)
        die_all("THC_HIER_HOSTS='" + v + "': expected host sizes like 2,2");
      acc += std::stoi(item);
      if (colour < 0 && g_rank < acc) colour = h;
      ++h;
      pos = comma + 1;
    }
    if (acc != g_size) die_all("THC_HIER_HOSTS='" + v + "' does not place all " + std::to_string(g_size) + " ranks");
    g_hosts_emulated = true;
  }
  if (colour >= 0) {
    MPI_Comm_split(MPI_COMM_WORLD, colour, g_rank, &g_host_comm);
  } else {
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &g_host_comm);
  }
  MPI_Comm_rank(g_host_comm, &g_host_rank);
  MPI_Comm_size(g_host_comm, &g_host_size);
  const int first = g_host_rank == 0 ? 1 : 0;
  MPI_Allreduce(&first, &g_hosts, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&g_host_size, &g_host_size_max, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
}

double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

double parse_fraction(const std::string& s) {
  const auto slash = s.find('/');
  try {
    if (slash != std::string::npos) return std::stod(s.substr(0, slash)) / std::stod(s.substr(slash + 1));
    size_t used = 0;
    const double v = std::stod(s, &used);
    if (used != s.size()) throw std::invalid_argument(s);
    return v;
  } catch (const std::exception&) {
    die_all("--p '" + s + "' is not a number");
  }
}

std::string json_num(double v) {
  if (!std::isfinite(v)) return "null";
  char b[40];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

}  // namespace

// --ucx auto: this host's first UP non-loopback IPv4 address and a TCP port free a moment ago.
static std::string auto_rendezvous() {
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return "";
  std::string ip;
  for (ifaddrs* i = ifs; i && ip.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK))
      continue;
    char b[INET_ADDRSTRLEN];
    if (inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, b, sizeof b)) ip = b;
  }
  freeifaddrs(ifs);
  if (ip.empty()) return "";
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  socklen_t len = sizeof a;
  const bool ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  if (fd >= 0) close(fd);
  return ok ? ip + ":" + std::to_string(ntohs(a.sin_port)) : "";
}

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"thc_allreduce_perf: allreduce time, algbw, busbw (nccl-tests conventions), bytes on the wire and "
               "NMSE of THC, uniform THC, Cnat and natural dithering against float MPI_Allreduce. Run under mpirun."};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // last wins, as getopt
  app.add_option("-b,--minbytes", o.min_s, "minimum size in bytes (K/M/G suffixes)");
  app.add_option("-e,--maxbytes", o.max_s, "maximum size in bytes");
  app.add_option("-i,--stepbytes", o.step_s, "increment between sizes (when -f is 1)");
  app.add_option("-f,--stepfactor", o.factor, "multiplication factor between sizes");
  app.add_option("-n,--iters", o.iters, "timed iterations")->check(CLI::Range(1, 1 << 30));
  app.add_option("-w,--warmup_iters", o.warmup, "warm-up iterations")->check(CLI::Range(0, 1 << 30));
  app.add_option("-c,--check", o.checks, "check iterations (NMSE against an exact float64 allreduce; 0 = none)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("-d,--datatype", o.dtype, "float | half | bfloat16 | double");
  app.add_option("-o,--op", o.ops,
                 "sum | avg (the reduction), allreduce | reduce_scatter | allgather (the collective; reduce_scatter: "
                 "each rank gets its 1/n shard of the sum; allgather: of the 1/n shards; busbw factor (n-1)/n); may "
                 "be given twice")
      ->check(CLI::IsMember({"sum", "avg", "allreduce", "reduce_scatter", "allgather"}))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--scheme", o.scheme,
                 "none (float MPI_Allreduce) | bf16 (float32 -> bfloat16 MPI_Allreduce -> float32, the DDP/Horovod "
                 "compression hook) | thc | uhc | cnat | dnat")
      ->check(CLI::IsMember({"none", "bf16", "thc", "uhc", "cnat", "dnat"}));
  app.add_option("--algo", o.algo, "auto | int (integer allreduce of values) | ps (colocated parameter server)");
  app.add_option("--bits", o.bits, "THC index bits b (default THC_BITS or 4)");
  app.add_option("--granularity,-g", o.granularity, "THC granularity g (default THC_GRANULARITY or 30)");
  app.add_option("--p", o.p, "THC truncation fraction p (accepts 1/32)");
  app.add_option("--block", o.block, "RHT / prelude block in elements (power of two 1024..1048576)");
  app.add_option("--nat-width", o.nat_width, "Cnat/Dnat sum width (8, 16, 32)");
  app.add_option("--nat-levels", o.nat_levels, "Cnat/Dnat levels (0 = widest that fits)");
  app.add_option("--dnat-norm", o.dnat_norm, "natural dithering norm: 2 | inf")->check(CLI::IsMember({"2", "inf"}));
  app.add_option("--bidir", o.bidir, "1: the colocated PS re-compresses Cnat/Dnat sums downstream");
  app.add_flag("--ef", o.ef, "error feedback (one residual per size)");
  app.add_flag("--device", o.device,
               "buffers in CUDA device memory (codec on the GPU; --scheme none stages through host memory)");
  app.add_flag("--nccl", o.nccl,
               "ncclAllReduce on device buffers (CUDA build with NCCL; drives NCCL and its net plugin, e.g. "
               "NCCL_NET_PLUGIN=thc NCCL_COLLNET_ENABLE=1 THC_COLLNET_AGGREGATOR=udp://HOST:PORT)");
  app.add_option("--seed", o.seed, "seed of the inputs and of thc's randomness (0: inputs 1, thc draws one)");
  app.add_option("--json", o.json, "write every row (and the configuration) to this JSON file");
  app.add_option("--nmse-bound", o.nmse_bound,
                 "fail (exit 1) when a check's NMSE exceeds this (default 0.1 compressed; none: 1e-10 float, "
                 "1e-24 double, 1e-5 half, 1e-3 bfloat16)");
  app.add_option("--ucx", o.ucx,
                 "HOST:PORT, or auto (rank 0's first non-loopback IPv4 address and a free port): thc's "
                 "integer reductions over UCX between the ranks (thc_comm_create_ucx, rendezvous at rank 0), "
                 "not over MPI; MPI still launches the ranks and runs the float baselines");
  app.add_option("--aggregator", o.aggregator,
                 "udp://HOST:PORT (or dpdk://IPv4:PORT with the THC_DPDK_* knobs), or a comma-separated list: reduce "
                 "thc codes at aggregators instead of MPI (key: THC_AGGREGATOR_KEY or THC_AGGREGATOR_KEY_FILE)");

  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = 0;
    if (g_rank == 0) rc = app.exit(e);
    else rc = e.get_exit_code();
    MPI_Finalize();
    return rc;
  }

  for (const std::string& v : o.ops) {
    if (v == "sum" || v == "avg") o.op = v;
    if (v == "allreduce" || v == "reduce_scatter" || v == "allgather") {
      o.rs = v == "reduce_scatter";
      o.ag = v == "allgather";
    }
  }
  if (!parse_size(o.min_s, &o.min_bytes)) die_all("bad -b size '" + o.min_s + "'");
  if (!parse_size(o.max_s, &o.max_bytes)) die_all("bad -e size '" + o.max_s + "'");
  if (!parse_size(o.step_s, &o.step_bytes)) die_all("bad -i size '" + o.step_s + "'");
  if (o.max_bytes < o.min_bytes) die_all("-e must be at least -b");
  if (o.factor <= 1 && o.step_bytes == 0 && o.max_bytes > o.min_bytes) die_all("-i 0 with -f 1 would never reach -e");
  if (o.factor < 1) die_all("-f must be at least 1");
  const TypeInfo ti = type_info(o.dtype);
  find_hosts();
  const bool none = o.scheme == "none";
  const bool bf16 = o.scheme == "bf16";
  const bool thc_run = !none && !bf16;  // a thc communicator runs the calls
  if (bf16) {
    if (ti.thc != THC_FLOAT32) die_all("--scheme bf16 compresses float32 gradients: use -d float");
    if (o.device || o.nccl || !o.aggregator.empty() || !o.ucx.empty() || o.ef)
      die_all("--scheme bf16 runs on host buffers over MPI (no --device, --nccl, --aggregator, --ucx, --ef)");
  }
  if (!o.ucx.empty() && !o.aggregator.empty()) die_all("--ucx and --aggregator: one transport for thc's codes");
  if (o.nccl) {
    if (!none) die_all("--nccl: NCCL reduces; compression is its net plugin's (THC_COLLNET_SCHEME), keep --scheme none");
    if (!o.aggregator.empty()) die_all("--nccl: the aggregator is the plugin's (THC_COLLNET_AGGREGATOR), not --aggregator");
    if (!o.ucx.empty()) die_all("--nccl and --ucx: NCCL brings its own transport");
    if (o.ef) die_all("--nccl: no error feedback through NCCL");
    o.device = true;
  }
#if !defined(THC_PERF_NCCL)
  if (o.nccl) die_all("--nccl: this build has no NCCL (configure with THC_WITH_CUDA and THC_WITH_NCCL)");
#endif
#if defined(THC_PERF_CUDA)
  if (o.device) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0)
      die_all(std::string(o.nccl ? "--nccl" : "--device") + ": no CUDA device");
    if (cudaSetDevice(g_rank % ndev) != cudaSuccess) die("--device: cudaSetDevice failed");
    if (ti.thc == THC_FLOAT64 && thc_run) die_all("--device: the GPU codec takes float, half and bfloat16");
    // libthc_cuda registers its device path when loaded; naming it also serves static builds.
    thc::engine::set_device_backend(thc::cuda::engine_backend());
  }
#else
  if (o.device) die_all("--device: this build has no CUDA (configure with THC_WITH_CUDA)");
#endif
  if (o.rs && o.nccl) die_all("--op reduce_scatter runs over MPI or thc (no --nccl)");
  if (o.ag && (o.nccl || o.device)) die_all("--op allgather runs on host buffers over MPI or thc (no --nccl, --device)");
  if (o.ag && o.op == "avg") die_all("--op allgather gathers: no avg");
  const bool avg = o.op == "avg";
  thc_scheme_t scheme = THC_SCHEME_THC;
  if (o.scheme == "uhc") scheme = THC_SCHEME_UHC;
  else if (o.scheme == "cnat") scheme = THC_SCHEME_CNAT;
  else if (o.scheme == "dnat") scheme = THC_SCHEME_DNAT;
  int algo = THC_ALGO_AUTO;
  if (o.algo == "auto") algo = THC_ALGO_AUTO;
  else if (o.algo == "int") algo = THC_ALGO_INT;
  else if (o.algo == "ps") algo = THC_ALGO_PS;
  else die_all("--algo '" + o.algo + "' is not available in this build (auto, int, ps)");
  double bound = o.nmse_bound;
  if (bound < 0) {
    if (bf16) bound = 1e-3;
    else if (!none) bound = 0.1;
    else if (ti.thc == THC_FLOAT32) bound = 1e-10;
    else if (ti.thc == THC_FLOAT64) bound = 1e-24;
    else if (ti.thc == THC_FLOAT16) bound = 1e-5;
    else bound = 1e-3;
  }

  MPI_Type_contiguous(2, MPI_BYTE, &g_f16);
  MPI_Type_commit(&g_f16);
  MPI_Type_contiguous(2, MPI_BYTE, &g_bf16);
  MPI_Type_commit(&g_bf16);
  MPI_Op_create(sum16, 1, &g_sum16);

  // ---- thc communicator
  thc_config_t cfg;
  if (thc_config_init(&cfg) != THC_SUCCESS) die_all(std::string("THC_* environment: ") + thc_last_error());
  if (o.bits >= 0) cfg.bits = o.bits;
  if (o.granularity >= 0) cfg.granularity = o.granularity;
  if (!o.p.empty()) cfg.p = parse_fraction(o.p);
  if (o.block >= 0) cfg.block = o.block;
  if (o.nat_width >= 0) cfg.nat_width = o.nat_width;
  if (o.nat_levels >= 0) cfg.nat_levels = o.nat_levels;
  if (!o.dnat_norm.empty()) cfg.dnat_norm = o.dnat_norm == "inf" ? 0 : 2;
  if (o.bidir >= 0) cfg.bidir = o.bidir;
  if (o.seed) cfg.seed = o.seed;
  cfg.algo = algo;
  thc_comm_t tc = nullptr;
  if (thc_run) {
    thc_status_t st;
    if (!o.aggregator.empty()) {
      uint64_t ids[2] = {0, 0};
      if (g_rank == 0) {
        std::random_device rd;
        ids[0] = (static_cast<uint64_t>(rd()) << 32) | rd();
        ids[1] = (static_cast<uint64_t>(rd()) << 32) | rd();
      }
      MPI_Bcast(ids, 2, MPI_UINT64_T, 0, MPI_COMM_WORLD);
      // The job label is random per run; the key comes from THC_AGGREGATOR_KEY[_FILE].
      st = thc_comm_create_aggregator(o.aggregator.c_str(), g_rank, g_size, static_cast<uint32_t>(ids[0] ^ ids[1]),
                                      nullptr, &cfg, &tc);
    } else if (!o.ucx.empty()) {
      char rv[128] = {0};
      if (g_rank == 0) {
        const std::string a = o.ucx == "auto" ? auto_rendezvous() : o.ucx;
        std::snprintf(rv, sizeof rv, "%s", a.c_str());
      }
      MPI_Bcast(rv, sizeof rv, MPI_CHAR, 0, MPI_COMM_WORLD);
      if (!rv[0]) die_all("--ucx auto: rank 0 has no non-loopback IPv4 address or no free port");
      o.ucx = rv;
      st = thc_comm_create_ucx(rv, g_rank, g_size, &cfg, &tc);
    } else {
      st = thc_comm_create_mpi(MPI_COMM_WORLD, &cfg, &tc);
    }
    if (st != THC_SUCCESS)
      die(std::string("creating the thc communicator") +
          (o.aggregator.empty() ? std::string() : " (aggregator " + o.aggregator + ")") +
          (o.ucx.empty() ? std::string() : " (ucx, rendezvous " + o.ucx + ")") + ": " + thc_last_error());
  }

#if defined(THC_PERF_NCCL)
  // ---- NCCL communicator (--nccl): one rank per process, the id from rank 0 over MPI
  ncclComm_t nc = nullptr;
  cudaStream_t stream = nullptr;
  int nccl_version = 0;
  if (o.nccl) {
    ncclUniqueId id;
    if (g_rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) die("ncclGetUniqueId failed");
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    const ncclResult_t r = ncclCommInitRank(&nc, g_size, id, g_rank);
    if (r != ncclSuccess) die(std::string("ncclCommInitRank: ") + ncclGetErrorString(r));
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) die("cudaStreamCreate failed");
    ncclGetVersion(&nccl_version);
  }
  auto nccl_type = [&]() {
    switch (ti.thc) {
      case THC_FLOAT16: return ncclFloat16;
      case THC_BFLOAT16: return ncclBfloat16;
      case THC_FLOAT64: return ncclFloat64;
      default: return ncclFloat32;
    }
  };
#endif

  // ---- header (nccl-tests style)
  if (g_rank == 0) {
    std::printf("# thc_allreduce_perf (thc %s): %snRanks %d minBytes %llu maxBytes %llu step: %llu(%s) warmup iters: %d "
                "iters: %d check iters: %d\n",
                thc_version(),
                o.rs ? "collective: reduce_scatter (busbw factor (n-1)/n) "
                     : (o.ag ? "collective: allgather (busbw factor (n-1)/n) " : ""),
                g_size,
                static_cast<unsigned long long>(o.min_bytes),
                static_cast<unsigned long long>(o.max_bytes),
                static_cast<unsigned long long>(o.factor > 1 ? static_cast<uint64_t>(o.factor) : o.step_bytes),
                o.factor > 1 ? "factor" : "bytes", o.warmup, o.iters, o.checks);
    if (o.nccl) {
#if defined(THC_PERF_NCCL)
      std::printf("# scheme: none (ncclAllReduce on %s, NCCL %d, NCCL_NET_PLUGIN=%s, NCCL_COLLNET_ENABLE=%s)", ti.name,
                  nccl_version, std::getenv("NCCL_NET_PLUGIN") ? std::getenv("NCCL_NET_PLUGIN") : "(unset)",
                  std::getenv("NCCL_COLLNET_ENABLE") ? std::getenv("NCCL_COLLNET_ENABLE") : "(unset)");
#endif
    } else if (none) {
      std::printf("# scheme: none (%s on %s)", o.rs ? "MPI_Reduce_scatter_block" : (o.ag ? "MPI_Allgather" : "MPI_Allreduce"),
                  ti.name);
    } else if (bf16) {
      std::printf("# scheme: bf16 (float -> bfloat16, %s with a bfloat16 SUM op in float, round to nearest "
                  "even, -> float)", o.rs ? "MPI_Reduce_scatter_block" : (o.ag ? "MPI_Allgather" : "MPI_Allreduce"));
    } else {
      std::printf("# scheme: %s algo: %s", o.scheme.c_str(), o.algo.c_str());
      if (scheme == THC_SCHEME_THC || scheme == THC_SCHEME_UHC)
        std::printf(" bits: %d granularity: %d p: %g", cfg.bits, cfg.granularity, cfg.p);
      else
        std::printf(" nat_width: %d nat_levels: %d%s bidir: %d", cfg.nat_width, cfg.nat_levels,
                    scheme == THC_SCHEME_DNAT ? (cfg.dnat_norm == 0 ? " norm: inf" : " norm: 2") : "", cfg.bidir);
      std::printf(" block: %ld ef: %d%s%s simd: %s", cfg.block, o.ef ? 1 : 0,
                  o.aggregator.empty() ? "" : " aggregator: ", o.aggregator.c_str(), thc::codec::simd_target());
    }
    std::printf(" buffers: %s", o.device ? "device" : "host");
    std::printf(" nmse bound: %g\n", bound);
    std::printf("# hosts: %d, up to %d ranks per host (%s)", g_hosts, g_host_size_max,
                g_hosts_emulated ? "THC_HIER_HOSTS" : "MPI_COMM_TYPE_SHARED");
    if (thc_run && !o.aggregator.empty()) {
      std::printf("; thc: aggregator");
    } else if (thc_run && !o.ucx.empty()) {
      std::printf("; thc: ucx (rendezvous %s)", o.ucx.c_str());
    } else if (thc_run) {
      thc_stats_t st{};
      thc_comm_stats(tc, &st);
      if (st.hier_hosts > 0)
        std::printf("; thc: hierarchical (THC_HIER), compressed stage across %d hosts", st.hier_hosts);
      else
        std::printf("; thc: flat");
    }
    std::printf("\n#\n# Using ranks\n");
  }
  {
    char host[64] = {0};
    gethostname(host, sizeof host - 1);
    char line[160];
    std::snprintf(line, sizeof line, "#  Rank %2d Pid %6d on %10s", g_rank, static_cast<int>(getpid()), host);
    std::vector<char> all(g_rank == 0 ? 160 * g_size : 1);
    MPI_Gather(line, 160, MPI_CHAR, all.data(), 160, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (g_rank == 0)
      for (int r = 0; r < g_size; ++r) std::printf("%s\n", all.data() + 160 * r);
  }
  if (g_rank == 0) {
    std::printf("#\n");
    std::printf("# %10s  %12s  %8s  %6s  %10s  %8s  %8s  %11s  %10s  %4s\n", "size", "count", "type", "redop", "time",
                "algbw", "busbw", "wire_B/elem", "nmse", "algo");
    std::printf("# %10s  %12s  %8s  %6s  %10s  %8s  %8s  %11s  %10s  %4s\n", "(B)", "(elements)", "", "", "(us)",
                "(GB/s)", "(GB/s)", "", "", "");
    std::fflush(stdout);
  }

  const MPI_Datatype mdt = mpi_type(ti.thc);
  const MPI_Op mop = (ti.thc == THC_FLOAT16 || ti.thc == THC_BFLOAT16) ? g_sum16 : MPI_SUM;
  const thc_op_t top = avg ? THC_OP_AVG : THC_OP_SUM;
  std::vector<Row> rows;
  bool failed = false;

  for (uint64_t size = o.min_bytes; size <= o.max_bytes;
       size = o.factor > 1 ? std::max<uint64_t>(size + 1, static_cast<uint64_t>(size * o.factor)) : size + o.step_bytes) {
    // reduce_scatter: count is the whole input, equal shards of count/n (what is left over is not sent)
    // allgather: count is the whole output, rank r's shard of count/n the first elements of its input
    const bool sharded = o.rs || o.ag;
    const size_t count = sharded ? size / ti.size / g_size * g_size : size / ti.size;
    const size_t shard = sharded ? count / g_size : count;
    const uint64_t bytes = count * ti.size;
    const std::vector<size_t> shards(static_cast<size_t>(g_size), shard);
    std::vector<char> send(bytes + 8), recv(bytes + 8);
    {
      std::mt19937_64 gen((o.seed ? o.seed : 1) * 1000003ull + static_cast<uint64_t>(g_rank) * 7919ull + count);
      std::normal_distribution<double> n01;
      for (size_t i = 0; i < count; ++i) store(send.data(), ti.thc, i, n01(gen));
    }
    thc_state_t state = nullptr;
    if (o.ef && thc_run && thc_state_create(&state) != THC_SUCCESS) die(thc_last_error());
    std::vector<uint16_t> b16(bf16 ? count + shard + 4 : 0);  // (allgather: the shard, then the whole)

    // --device: the same inputs in device memory; results come back to recv for the checks.
    char* dsend = nullptr;
    char* drecv = nullptr;
    std::vector<char> stage;
#if defined(THC_PERF_CUDA)
    if (o.device) {
      if (cudaMalloc(&dsend, bytes + 8) != cudaSuccess || cudaMalloc(&drecv, bytes + 8) != cudaSuccess)
        die("--device: cudaMalloc of " + std::to_string(bytes) + " bytes failed");
      if (cudaMemcpy(dsend, send.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess) die("cudaMemcpy failed");
      if (none && !o.nccl) stage.resize(bytes + 8);
    }
#endif
    auto copy = [&](void* dst, const void* src, size_t n, bool to_device) {
#if defined(THC_PERF_CUDA)
      if (cudaMemcpy(dst, src, n, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost) != cudaSuccess)
        die("cudaMemcpy failed");
#else
      (void)dst, (void)src, (void)n, (void)to_device;
#endif
    };

    // launch(): start one allreduce; finish(): wait for what was launched (NCCL is stream-ordered,
    // everything else is done when launch returns).
    auto launch = [&]() {
#if defined(THC_PERF_NCCL)
      if (o.nccl) {
        const ncclResult_t r = ncclAllReduce(dsend, drecv, count, nccl_type(), avg ? ncclAvg : ncclSum, nc, stream);
        if (r != ncclSuccess) die(std::string("ncclAllReduce: ") + ncclGetErrorString(r));
        return;
      }
#endif
      if (o.ag) {
        if (none || bf16) {
          if (shard > static_cast<size_t>(INT_MAX)) die("--op allgather: MPI counts are int");
          if (bf16) {
            const float* x = reinterpret_cast<const float*>(send.data());
            for (size_t i = 0; i < shard; ++i) b16[i] = float_to_bf16(x[i]);
            if (MPI_Allgather(b16.data(), static_cast<int>(shard), g_bf16, b16.data() + shard, static_cast<int>(shard),
                              g_bf16, MPI_COMM_WORLD) != MPI_SUCCESS)
              die("MPI_Allgather failed");
            float* y = reinterpret_cast<float*>(recv.data());
            for (size_t i = 0; i < count; ++i) y[i] = bf16_to_float(b16[shard + i]);
          } else if (MPI_Allgather(send.data(), static_cast<int>(shard), mdt, recv.data(), static_cast<int>(shard), mdt,
                                   MPI_COMM_WORLD) != MPI_SUCCESS) {
            die("MPI_Allgather failed");
          }
        } else if (const thc_status_t st =
                       thc_allgather(scheme, send.data(), recv.data(), shards.data(), ti.thc, tc, state);
                   st != THC_SUCCESS) {
          die(std::string("thc_allgather returned ") + status_name(st) + ": " + thc_last_error());
        }
      } else if (o.rs) {
        if (none || bf16) {
          const void* s = send.data();
          void* r = recv.data();
          if (o.device) {  // (bf16 takes host buffers only)
            copy(stage.data(), dsend, bytes, false);
            s = stage.data();
          }
          MPI_Datatype t = mdt;
          MPI_Op op = mop;
          if (bf16) {
            const float* x = reinterpret_cast<const float*>(send.data());
            for (size_t i = 0; i < count; ++i) b16[i] = float_to_bf16(x[i]);
            s = b16.data();
            r = b16.data() + count;
            t = g_bf16;
            op = g_sum16;
          }
          if (shard > static_cast<size_t>(INT_MAX)) die("--op reduce_scatter: MPI counts are int");
          if (MPI_Reduce_scatter_block(s, r, static_cast<int>(shard), t, op, MPI_COMM_WORLD) != MPI_SUCCESS)
            die("MPI_Reduce_scatter_block failed");
          if (bf16)
            for (size_t i = 0; i < shard; ++i)
              reinterpret_cast<float*>(recv.data())[i] = bf16_to_float(b16[count + i]);
          if (avg)
            for (size_t i = 0; i < shard; ++i) store(recv.data(), ti.thc, i, load(recv.data(), ti.thc, i) / g_size);
          if (o.device) copy(drecv, recv.data(), shard * ti.size, true);
        } else if (const thc_status_t st = thc_reduce_scatter(scheme, o.device ? dsend : send.data(),
                                                              o.device ? drecv : recv.data(), shards.data(), ti.thc,
                                                              top, tc, state);
                   st != THC_SUCCESS) {
          die(std::string("thc_reduce_scatter returned ") + status_name(st) + ": " + thc_last_error());
        }
      } else if (none) {
        // (on device buffers: staged through host memory, as an MPI without CUDA support needs)
        char* s = send.data();
        char* r = recv.data();
        if (o.device) {
          copy(stage.data(), dsend, bytes, false);
          s = stage.data();
        }
        mpi_allreduce_big(s, r, count, mdt, ti.size, mop);
        if (avg)
          for (size_t i = 0; i < count; ++i) store(r, ti.thc, i, load(r, ti.thc, i) / g_size);
        if (o.device) copy(drecv, r, bytes, true);
      } else if (bf16) {
        const float* x = reinterpret_cast<const float*>(send.data());
        float* y = reinterpret_cast<float*>(recv.data());
        for (size_t i = 0; i < count; ++i) b16[i] = float_to_bf16(x[i]);
        mpi_allreduce_big(MPI_IN_PLACE, b16.data(), count, g_bf16, 2, g_sum16);
        const float scale = avg ? 1.0f / static_cast<float>(g_size) : 1.0f;
        for (size_t i = 0; i < count; ++i) y[i] = bf16_to_float(b16[i]) * scale;
      } else if (const thc_status_t st = thc_allreduce_scheme(scheme, o.device ? dsend : send.data(),
                                                              o.device ? drecv : recv.data(), count, ti.thc, top, tc,
                                                              state);
                 st != THC_SUCCESS) {
        die(std::string("thc_allreduce_scheme returned ") + status_name(st) + ": " + thc_last_error());
      }
    };
    auto finish = [&]() {
#if defined(THC_PERF_NCCL)
      if (o.nccl) {
        if (cudaStreamSynchronize(stream) != cudaSuccess) die("cudaStreamSynchronize failed");
        ncclResult_t async = ncclSuccess;
        if (ncclCommGetAsyncError(nc, &async) != ncclSuccess || async != ncclSuccess)
          die(std::string("NCCL: ") + ncclGetErrorString(async));
      }
#endif
    };
    auto run_once = [&]() {
      launch();
      finish();
    };

    for (int i = 0; i < o.warmup; ++i) run_once();
    thc_stats_t s0{}, s1{};
    if (thc_run) thc_comm_stats(tc, &s0);
    MPI_Barrier(MPI_COMM_WORLD);
    const double c0 = cpu_seconds();
    const double t0 = MPI_Wtime();
    for (int i = 0; i < o.iters; ++i) launch();
    finish();
    double dt = (MPI_Wtime() - t0) / o.iters, dtmax = 0;
    // CPU time of this rank per call (user + system, all its threads): on a shared-core testbed
    // it tells a CPU-bound run from a wire-bound one.
    const double cpu_mine = (cpu_seconds() - c0) / o.iters;
    double cpu_sum = 0;
    MPI_Reduce(&cpu_mine, &cpu_sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Allreduce(&dt, &dtmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (thc_run) thc_comm_stats(tc, &s1);

    Row row;
    row.size = bytes;
    row.count = count;
    row.type = ti.name;
    row.redop = o.ag ? "none" : o.op;  // (nccl-tests print none for allgather)
    row.time_us = dtmax * 1e6;
    row.algbw = dtmax > 0 ? static_cast<double>(bytes) / 1e9 / dtmax : 0;
    row.busbw = row.algbw * (g_size > 1 ? (sharded ? 1.0 : 2.0) * (g_size - 1) / g_size : 0.0);
    // The compressed stage's ranks: all (flat) or one per host (hierarchical).
    const int peers = thc_run && s1.hier_hosts > 0 ? s1.hier_hosts : g_size;
    const double share = peers > 1 ? (peers - 1.0) / peers : 0.0;
    // What crosses this rank's host link per element, each way (see host_link_per_elem).
    double cross_up = 0, cross_down = 0;
    if (o.ag) {
      // What this rank receives per output element: the others' codes (thc) or values.
      const double elems = thc_run ? static_cast<double>(s1.elements - s0.elements) : 0;
      row.wire = thc_run ? (elems > 0 ? static_cast<double>(s1.wire_bytes_down - s0.wire_bytes_down) / elems : 0)
                         : share * static_cast<double>(bf16 ? 2 : ti.size);
      row.wire_up = row.wire_down = row.wire;
      row.algo = thc_run ? (s1.calls == 0 ? "-" : "ps") : "mpi";
      if (g_hosts > 1 && g_host_rank == 0) cross_up = cross_down = row.wire;
    } else if (o.rs) {
      // What this rank sends per input element: (n-1)/n of its values (none, bf16) or codes (thc).
      const double elems = thc_run ? static_cast<double>(s1.elements - s0.elements) : 0;
      row.wire = thc_run ? (elems > 0 ? share * static_cast<double>(s1.wire_bytes_up - s0.wire_bytes_up) / elems : 0)
                         : share * static_cast<double>(bf16 ? 2 : ti.size);
      row.wire_up = row.wire_down = row.wire;
      row.algo = thc_run ? (s1.calls == 0 ? "-" : (s1.last_algo == THC_ALGO_PS ? "ps" : "int")) : "mpi";
      if (g_hosts > 1 && g_host_rank == 0) cross_up = cross_down = row.wire;
    } else if (!thc_run) {
      row.wire = 2.0 * share * static_cast<double>(bf16 ? 2 : ti.size);
      row.wire_up = row.wire_down = row.wire;  // a ring sends and receives the same
      row.algo = o.nccl ? "nccl" : "mpi";
      // A ring over ranks placed host by host crosses each host's link once each way: the
      // host's first rank carries it.
      if (g_hosts > 1 && g_host_rank == 0) cross_up = cross_down = row.wire;
    } else {
      const double elems = static_cast<double>(s1.elements - s0.elements);
      const double wb = static_cast<double>((s1.wire_bytes_up - s0.wire_bytes_up) + (s1.wire_bytes_down - s0.wire_bytes_down));
      if (s1.measured_wire) {
        // An aggregator communicator counts its datagrams (headers, retransmissions, prelude
        // included): what this rank's link carried each way. The column shows the busier way.
        row.wire_up = elems > 0 ? static_cast<double>(s1.wire_bytes_up - s0.wire_bytes_up) / elems : 0;
        row.wire_down = elems > 0 ? static_cast<double>(s1.wire_bytes_down - s0.wire_bytes_down) / elems : 0;
        row.wire = std::max(row.wire_up, row.wire_down);
        cross_up = row.wire_up;
        cross_down = row.wire_down;
      } else {
        // MPI algorithms move the same bytes each way: a (n-1)/n share of up + down per rank
        // (the compressed stage's (H-1)/H across hosts when hierarchical).
        row.wire = elems > 0 ? share * wb / elems : 0;
        row.wire_up = row.wire_down = row.wire;
        // Flat: the part of it exchanged with ranks on other hosts, (n - L)/(n - 1);
        // hierarchical: all of it.
        const double off_host = s1.hier_hosts > 0 || g_size < 2 ? 1.0 : (g_size - g_host_size) / (g_size - 1.0);
        cross_up = cross_down = row.wire * off_host;
      }
      uint64_t mine[2] = {s1.packets - s0.packets, s1.retransmissions - s0.retransmissions}, all[2] = {0, 0};
      MPI_Allreduce(mine, all, 2, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
      row.packets = all[0];
      row.retrans = all[1];
      row.algo = s1.calls == 0 ? "-" : (s1.last_algo == THC_ALGO_PS ? "ps" : "int");
    }
    {
      double mine[2] = {cross_up, cross_down}, host[2] = {0, 0}, busiest = 0;
      MPI_Allreduce(mine, host, 2, MPI_DOUBLE, MPI_SUM, g_host_comm);
      const double link = std::max(host[0], host[1]);
      MPI_Allreduce(&link, &busiest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      row.host_link = busiest;
      row.hier_hosts = thc_run ? s1.hier_hosts : 0;
    }

    // ---- checks: worst NMSE against MPI_Allreduce in float64 of the same (typed) inputs
    row.nmse = 0;
    if (o.checks > 0) {
      std::vector<double> in(count), exact(count);
      for (size_t i = 0; i < count; ++i) in[i] = load(send.data(), ti.thc, i);
      if (o.ag) {
        MPI_Allgather(in.data(), static_cast<int>(shard), MPI_DOUBLE, exact.data(), static_cast<int>(shard), MPI_DOUBLE,
                      MPI_COMM_WORLD);
      } else {
        mpi_allreduce_big(in.data(), exact.data(), count, MPI_DOUBLE, 8, MPI_SUM);
      }
      if (avg)
        for (auto& v : exact) v /= g_size;
      thc_state_t cstate = nullptr;  // checks keep their own error-feedback residual
      if (o.ef && thc_run && thc_state_create(&cstate) != THC_SUCCESS) die(thc_last_error());
      std::swap(state, cstate);
      // reduce_scatter: this rank's shard of the exact sum
      const size_t first = o.rs ? shard * static_cast<size_t>(g_rank) : 0, checked = o.rs ? shard : count;
      for (int c = 0; c < o.checks; ++c) {
        run_once();
        if (o.device) copy(recv.data(), drecv, bytes, false);
        double err = 0, ref = 0;
        for (size_t i = 0; i < checked; ++i) {
          const double d = load(recv.data(), ti.thc, i) - exact[first + i];
          err += d * d;
          ref += exact[first + i] * exact[first + i];
        }
        // Every rank should hold the same result; take the worst rank (it catches one that
        // disagrees).
        const double mine = ref > 0 ? err / ref : (err > 0 ? INFINITY : 0.0);
        double worst = 0;
        MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        row.nmse = std::max(row.nmse, worst);
      }
      std::swap(state, cstate);
      if (cstate) thc_state_destroy(cstate);
    }
    if (state) thc_state_destroy(state);
#if defined(THC_PERF_CUDA)
    if (dsend) cudaFree(dsend);
    if (drecv) cudaFree(drecv);
#endif
    const bool bad = !(row.nmse <= bound);
    failed |= bad;
    rows.push_back(row);
    if (g_rank == 0) {
      std::printf("  %10llu  %12llu  %8s  %6s  %10.1f  %8.3f  %8.3f  %11.4f  %10.3e  %4s%s\n",
                  static_cast<unsigned long long>(row.size), static_cast<unsigned long long>(row.count),
                  row.type.c_str(), row.redop.c_str(), row.time_us, row.algbw, row.busbw, row.wire, row.nmse,
                  row.algo.c_str(), bad ? "  FAILED" : "");
      std::printf("#   cpu: %.1f ms per call per rank (user+sys, mean over ranks)\n", cpu_sum / g_size * 1e3);
      if (row.packets > 0)
        std::printf("#   aggregator wire: %llu data packets, %llu retransmissions (%.3f%%), all ranks, timed iterations\n",
                    static_cast<unsigned long long>(row.packets), static_cast<unsigned long long>(row.retrans),
                    100.0 * static_cast<double>(row.retrans) / static_cast<double>(row.packets));
      std::fflush(stdout);
    }
    if (o.factor <= 1 && o.step_bytes == 0) break;
  }

  double avg_bus = 0, worst = 0;
  for (const auto& r : rows) {
    avg_bus += r.busbw;
    worst = std::max(worst, r.nmse);
  }
  if (!rows.empty()) avg_bus /= static_cast<double>(rows.size());
  if (g_rank == 0) {
    std::printf("# Avg bus bandwidth    : %g\n", avg_bus);
    std::printf("# Worst NMSE           : %g (bound %g) %s\n#\n", worst, bound, failed ? "FAILED" : "OK");
    std::fflush(stdout);
    if (!o.json.empty()) {
      std::ofstream f(o.json);
      if (!f) die("cannot write --json file '" + o.json + "'");
      f << "{\n  \"tool\": \"thc_allreduce_perf\",\n  \"collective\": \""
        << (o.rs ? "reduce_scatter" : (o.ag ? "allgather" : "allreduce"))
        << "\",\n  \"ranks\": " << g_size << ",\n  \"scheme\": \"" << o.scheme
        << "\",\n  \"algo\": \"" << o.algo << "\",\n  \"type\": \"" << ti.name << "\",\n  \"redop\": \"" << o.op
        << "\",\n  \"nccl\": " << (o.nccl ? "true" : "false") << ",\n  \"buffers\": \"" << (o.device ? "device" : "host") << "\",\n  \"iters\": " << o.iters << ",\n  \"warmup\": " << o.warmup << ",\n  \"checks\": " << o.checks;
      f << ",\n  \"hosts\": " << g_hosts << ",\n  \"ranks_per_host\": " << g_host_size_max;
      if (thc_run)
        f << ",\n  \"config\": {\"bits\": " << cfg.bits << ", \"granularity\": " << cfg.granularity << ", \"p\": "
          << json_num(cfg.p) << ", \"block\": " << cfg.block << ", \"nat_width\": " << cfg.nat_width
          << ", \"nat_levels\": " << cfg.nat_levels << ", \"dnat_norm\": " << cfg.dnat_norm << ", \"bidir\": "
          << cfg.bidir << ", \"ef\": " << (o.ef ? 1 : 0) << "}";
      f << ",\n  \"nmse_bound\": " << json_num(bound) << ",\n  \"rows\": [";
      for (size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        f << (i ? ",\n" : "\n") << "    {\"size\": " << r.size << ", \"count\": " << r.count << ", \"type\": \""
          << r.type << "\", \"redop\": \"" << r.redop << "\", \"time_us\": " << json_num(r.time_us)
          << ", \"algbw\": " << json_num(r.algbw) << ", \"busbw\": " << json_num(r.busbw)
          << ", \"wire_bytes_per_elem\": " << json_num(r.wire) << ", \"nmse\": " << json_num(r.nmse)
          << ", \"wire_up_per_elem\": " << json_num(r.wire_up) << ", \"wire_down_per_elem\": " << json_num(r.wire_down)
          << ", \"host_link_per_elem\": " << json_num(r.host_link) << ", \"hier_hosts\": " << r.hier_hosts
          << ", \"packets\": " << r.packets << ", \"retransmissions\": " << r.retrans
          << ", \"algo\": \"" << r.algo << "\"}";
      }
      f << "\n  ],\n  \"avg_busbw\": " << json_num(avg_bus) << ",\n  \"worst_nmse\": " << json_num(worst)
        << ",\n  \"ok\": " << (failed ? "false" : "true") << "\n}\n";
      if (!f) die("writing --json file '" + o.json + "' failed");
    }
  }
  if (tc) thc_comm_destroy(tc);
#if defined(THC_PERF_NCCL)
  if (nc) ncclCommDestroy(nc);
  if (stream) cudaStreamDestroy(stream);
#endif
  MPI_Comm_free(&g_host_comm);
  MPI_Op_free(&g_sum16);
  MPI_Type_free(&g_f16);
  MPI_Type_free(&g_bf16);
  MPI_Finalize();
  return failed ? 1 : 0;
}
