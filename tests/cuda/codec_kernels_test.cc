// The CUDA codec against the host codec (thc::codec::Codec) on the same inputs, statistics and
// seeds: prelude statistics, codes (index and value form), error-feedback residuals, decode,
// the 16-bit pair layout, the parameter server's lookup-and-sum, 16-bit float inputs and outputs.
//
// Expected: bit-identical codes, residuals and decodes (the kernels keep the host's FWHT stage
// order, derive scales with the shared block_scale.h and build with -fmad=false); the assertions
// allow a small bounded disagreement (kMaxMismatchFraction of the codes, a few ulps) so that
// a float-ordering tie on some other GPU fails loudly only when it is more than that.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "collectives/codec/codec.h"
#include "cuda/thc_cuda.h"
#include "tests/cuda/gpu_test_util.h"

namespace thc::cuda::test {
namespace {

using codec::Codec;
using codec::IntType;
using codec::Layout;
using codec::Scheme;

constexpr double kMaxMismatchFraction = 1e-3;
constexpr uint64_t kSeed = 0x1234ABCD5678EF01ull;
constexpr uint32_t kRound = 5;
constexpr int kRanks = 3;

struct Case {
  const char* name;
  Scheme scheme;
  int bits;
  int granularity;
  int nat_width;
  int dnat_norm;
  int codec_n;  // workers the codec is sized for (sets the sum type)
  int block_log2;
  int force_multipass_log2;  // 0: automatic; else LaunchOpts{max_smem_log2, multipass_tile_log2}
  int kernel_variant = 0;    // LaunchOpts::kernel_variant (the name says it: "_v<bits>")
};

std::string case_name(const ::testing::TestParamInfo<std::tuple<Case, int>>& i) {
  std::ostringstream o;
  o << std::get<0>(i.param).name << "_b" << std::get<0>(i.param).block_log2;
  if (std::get<0>(i.param).force_multipass_log2) o << "_mp" << std::get<0>(i.param).force_multipass_log2;
  o << "_c" << std::get<1>(i.param);
  return o.str();
}

Codec make_codec(const Case& k) {
  codec::Params p;
  p.scheme = k.scheme;
  p.bits = k.bits;
  p.granularity = k.granularity;
  p.nat_width = k.nat_width;
  p.dnat_norm = k.dnat_norm;
  p.block_log2 = k.block_log2;
  return Codec(p, k.codec_n);
}

uint64_t count_for(int which, uint64_t B) {
  switch (which) {
    case 0: return 1;
    case 1: return 100;
    case 2: return B - 1;
    case 3: return B + 1;
    case 4: return 2 * B + 70;
    default: return 3 * B;
  }
}

// Inputs of one rank: a varied-scale gaussian gradient (block 1, when it exists, zero on every
// rank) and a small residual.
struct RankInput {
  std::vector<float> grad, ef, x;  // x = grad + ef, what the host codec sees
};

RankInput make_input(uint64_t count, uint64_t B, int r) {
  RankInput in;
  in.grad = gaussian(count, 100 + r, 1.0f);
  in.ef = gaussian(count, 200 + r, 0.05f);
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t blk = i / B;
    if (blk == 1) {
      in.grad[i] = 0.0f;
      in.ef[i] = 0.0f;
    } else if (blk == 2) {
      in.grad[i] *= 1e-20f;  // tiny block: scales far from 1
      in.ef[i] *= 1e-20f;
    }
  }
  in.x.resize(count);
  for (uint64_t i = 0; i < count; ++i) in.x[i] = in.grad[i] + in.ef[i];
  return in;
}

std::vector<uint8_t> unpack(const std::vector<uint8_t>& packed, uint64_t n, int bits) {
  std::vector<uint8_t> c(n);
  codec::unpack_bits(packed.data(), n, bits, c.data());
  return c;
}

uint64_t mismatches(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  uint64_t m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m += a[i] != b[i];
  return m;
}

// Count of elements farther apart than max_ulp ulps.
uint64_t float_mismatches(const std::vector<float>& a, const std::vector<float>& b, uint32_t max_ulp,
                          uint32_t* worst = nullptr) {
  uint64_t m = 0;
  uint32_t w = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const uint32_t d = ulp_diff(a[i], b[i]);
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    w = std::max(w, d);
    m += d > max_ulp;
  }
  if (worst) *worst = w;
  return m;
}

LaunchOpts opts_for(const Case& k) {
  LaunchOpts o;
  if (k.force_multipass_log2) {
    o.max_smem_log2 = k.force_multipass_log2;
    o.multipass_tile_log2 = k.force_multipass_log2;
  }
  o.kernel_variant = k.kernel_variant;
  return o;
}

class CodecKernels : public ::testing::TestWithParam<std::tuple<Case, int>> {};

TEST_P(CodecKernels, MatchHostCodec) {
  THC_REQUIRE_DEVICE();
  const Case& k = std::get<0>(GetParam());
  const Codec c = make_codec(k);
  DeviceCodec dc;
  ASSERT_CUDA(dc.init(c));
  const uint64_t B = c.block();
  const uint64_t count = count_for(std::get<1>(GetParam()), B);
  const Layout lay = c.layout(count);
  const LaunchOpts opts = opts_for(k);
  const int bits = c.index_bits();
  const IntType st = c.sum_type();
  const size_t wsz = codec::int_size(st);
  SCOPED_TRACE(c.describe() + " count=" + std::to_string(count));

  std::vector<RankInput> in;
  for (int r = 0; r < kRanks; ++r) in.push_back(make_input(count, B, r));

  // ---- prelude: GPU statistics of grad + ef against the host's
  std::vector<float> gstats(lay.nblocks, 0.0f);
  for (int r = 0; r < kRanks; ++r) {
    std::vector<float> hs(lay.nblocks);
    ASSERT_TRUE(c.prelude(in[r].x.data(), count, hs.data()));
    DevBuf<float> dx(in[r].grad), def(in[r].ef), dstats(lay.nblocks);
    DevBuf<uint32_t> dcheck(kCheckWords);
    size_t tb = 0;
    ASSERT_CUDA(prelude(nullptr, &tb, dc, lay, dx.get(), InType::kF32, def.get(), dstats.get(), dcheck.get(), 42, 0));
    DevBuf<uint8_t> temp(tb);
    ASSERT_CUDA(prelude(temp.get(), &tb, dc, lay, dx.get(), InType::kF32, def.get(), dstats.get(), dcheck.get(), 42, 0));
    const std::vector<float> gs = dstats.download();
    const std::vector<uint32_t> chk = dcheck.download();
    EXPECT_EQ(chk[0], 0u);
    EXPECT_EQ(chk[1], 42u);
    EXPECT_EQ(chk[2], 0u);
    EXPECT_EQ(chk[3], ~42u);
    EXPECT_EQ(chk[4], ~0u);
    for (uint64_t b = 0; b < lay.nblocks; ++b) {
      // Double sums in another order: the float RMS may differ in its last bit.
      EXPECT_LE(ulp_diff(gs[b], hs[b]), 1u) << "block " << b << " gpu " << gs[b] << " host " << hs[b];
      gstats[b] = std::max(gstats[b], hs[b]);
    }
  }
  DevBuf<float> dgstats(gstats);

  // ---- encode every rank on both sides, with and without error feedback
  const uint64_t pbytes = c.packed_bytes(lay.wire_count);
  std::vector<int64_t> total(lay.wire_count, 0);
  std::vector<uint32_t> pair_total(value_bytes(st, ValueLayout::kPairs, lay.wire_count) / 4 + 1, 0);
  std::vector<std::vector<uint8_t>> gpu_packed(kRanks);
  size_t etb = 0;
  ASSERT_CUDA(encode(nullptr, &etb, dc, lay, 0, lay.nblocks, nullptr, InType::kF32, nullptr, nullptr, Rng(),
                     EncodeOut(), nullptr, 0, opts));
  DevBuf<uint8_t> etemp(etb);
  for (int r = 0; r < kRanks; ++r) {
    const codec::CallRng hr{kSeed, static_cast<uint32_t>(r), kRound};
    Rng dr;
    dr.seed = kSeed;
    dr.rank = static_cast<uint32_t>(r);
    dr.round = kRound;
    for (bool ef : {false, true}) {
      SCOPED_TRACE(std::string("rank ") + std::to_string(r) + (ef ? " with error feedback" : ""));
      std::vector<uint8_t> hpacked(pbytes + 8, 0), hvals(lay.wire_count * wsz + 8, 0);
      std::vector<float> hres(count, 0.0f);
      Codec::EncodeOut ho;
      ho.packed = hpacked.data();
      ho.values = hvals.data();
      if (ef) ho.residual = hres.data();
      c.encode(lay, 0, lay.nblocks, in[r].x.data(), gstats.data(), hr, ho);

      DevBuf<float> dx(in[r].grad), def(in[r].ef);
      DevBuf<uint8_t> dpacked(pbytes + 8), dvals(lay.wire_count * wsz + 8),
          dpairs(value_bytes(st, ValueLayout::kPairs, lay.wire_count) + 8);
      EncodeOut o;
      o.packed = dpacked.get();
      o.values = dvals.get();
      o.residual = ef ? def.get() : nullptr;  // in place: ef in, residual out
      ASSERT_CUDA(encode(etemp.get(), &etb, dc, lay, 0, lay.nblocks, dx.get(), InType::kF32, def.get(), dgstats.get(),
                         dr, o, nullptr, 0, opts));
      const std::vector<uint8_t> gp = dpacked.download(), gv = dvals.download();
      // index form
      const uint64_t cm = mismatches(unpack(hpacked, lay.wire_count, bits), unpack(gp, lay.wire_count, bits));
      EXPECT_LE(cm, static_cast<uint64_t>(kMaxMismatchFraction * lay.wire_count)) << "codes differ: " << cm;
      EXPECT_EQ(cm, 0u) << "codes are expected to be bit-identical";
      EXPECT_TRUE(std::equal(hpacked.begin(), hpacked.begin() + pbytes, gp.begin())) << "packed bytes";
      // value form
      uint64_t vm = 0;
      for (uint64_t i = 0; i < lay.wire_count; ++i)
        vm += codec::load_int(st, hvals.data(), i) != codec::load_int(st, gv.data(), i);
      EXPECT_EQ(vm, 0u) << "values differ";
      if (ef) {
        uint32_t worst = 0;
        const uint64_t rm = float_mismatches(hres, def.download(), 0, &worst);
        EXPECT_LE(rm, static_cast<uint64_t>(kMaxMismatchFraction * count) + 0) << "residuals differ, worst ulp " << worst;
        EXPECT_EQ(rm, 0u) << "residuals are expected to be bit-identical (worst ulp " << worst << ")";
        continue;
      }
      gpu_packed[r] = gp;
      for (uint64_t i = 0; i < lay.wire_count; ++i) total[i] += codec::load_int(st, hvals.data(), i);
      // the 16-bit pair layout, summed like NCCL sums uint32 words (modulo 2^32)
      EncodeOut op;
      op.values = dpairs.get();
      op.layout = ValueLayout::kPairs;
      ASSERT_CUDA(encode(etemp.get(), &etb, dc, lay, 0, lay.nblocks, dx.get(), InType::kF32, def.get(), dgstats.get(),
                         dr, op, nullptr, 0, opts));
      const std::vector<uint8_t> pw = dpairs.download();
      if (wsz == 2) {
        // what ncclAllReduce(ncclUint32, ncclSum) does to the pair words
        for (size_t w = 0; w + 1 < pair_total.size() && 4 * w + 4 <= pw.size(); ++w) {
          uint32_t v;
          std::memcpy(&v, pw.data() + 4 * w, 4);
          pair_total[w] += v;
        }
      } else {
        EXPECT_TRUE(std::equal(gv.begin(), gv.begin() + lay.wire_count * wsz, pw.begin()))
            << "kPairs is kNative for 8- and 32-bit sums";
      }
    }
  }

  // ---- decode the sums: host, GPU from native sums, GPU from pair words
  std::vector<uint8_t> sums(lay.wire_count * wsz + 8, 0);
  for (uint64_t i = 0; i < lay.wire_count; ++i) codec::store_int(st, sums.data(), i, total[i]);
  const codec::CallRng hr0{kSeed, 0, kRound};
  Rng dr0;
  dr0.seed = kSeed;
  dr0.round = kRound;
  size_t dtb = 0;
  ASSERT_CUDA(decode(nullptr, &dtb, dc, lay, 0, lay.nblocks, nullptr, ValueLayout::kNative, nullptr, Rng(), 1, false,
                     nullptr, InType::kF32, nullptr, nullptr, 0, opts));
  DevBuf<uint8_t> dtemp(dtb);
  DevBuf<uint8_t> dsums(sums);
  std::vector<uint8_t> pair_bytes(pair_total.size() * 4);
  std::memcpy(pair_bytes.data(), pair_total.data(), pair_bytes.size());
  if (wsz != 2) pair_bytes = sums;  // the same layout
  DevBuf<uint8_t> dpsums(pair_bytes);
  for (bool mean : {false, true}) {
    std::vector<float> hout(count);
    c.decode(lay, 0, lay.nblocks, sums.data(), gstats.data(), hr0, kRanks, mean, hout.data());
    for (ValueLayout l : {ValueLayout::kNative, ValueLayout::kPairs}) {
      DevBuf<float> dout(count);
      DevBuf<uint32_t> status(1);
      ASSERT_CUDA(decode(dtemp.get(), &dtb, dc, lay, 0, lay.nblocks, l == ValueLayout::kNative ? dsums.get() : dpsums.get(),
                         l, dgstats.get(), dr0, kRanks, mean, dout.get(), InType::kF32, nullptr, status.get(), 0, opts));
      uint32_t worst = 0;
      const uint64_t dm = float_mismatches(hout, dout.download(), 0, &worst);
      EXPECT_EQ(dm, 0u) << "decode differs (" << (l == ValueLayout::kNative ? "native" : "pairs")
                        << (mean ? ", mean" : ", sum") << "), worst ulp " << worst;
      EXPECT_EQ(status.download()[0], 0u);
    }
  }

  // ---- lookup-and-sum of the three ranks' index streams (one shard each, padded to 8)
  {
    const uint64_t shard = (lay.wire_count + 7) / 8 * 8;
    const size_t stride = shard * bits / 8;
    std::vector<uint8_t> all(kRanks * stride, 0);
    for (int r = 0; r < kRanks; ++r) std::copy(gpu_packed[r].begin(), gpu_packed[r].begin() + pbytes, all.begin() + r * stride);
    DevBuf<uint8_t> dall(all), dls(shard * wsz + 8);
    ASSERT_CUDA(lookup_sum(dc, dall.get(), kRanks, stride, shard, dls.get(), 0));
    const std::vector<uint8_t> ls = dls.download();
    uint64_t lm = 0;
    for (uint64_t i = 0; i < lay.wire_count; ++i) lm += codec::load_int(st, ls.data(), i) != total[i];
    EXPECT_EQ(lm, 0u) << "lookup sums differ";
  }
}

class CodecKernelsOnce : public ::testing::TestWithParam<Case> {};

// 16-bit float inputs and outputs: the GPU converts exactly like the host engine would.
TEST_P(CodecKernelsOnce, HalfAndBfloat16) {
  THC_REQUIRE_DEVICE();
  const Case& k = GetParam();
  const Codec c = make_codec(k);
  DeviceCodec dc;
  ASSERT_CUDA(dc.init(c));
  const uint64_t B = c.block();
  const uint64_t count = count_for(4, B);
  const Layout lay = c.layout(count);
  const LaunchOpts opts = opts_for(k);
  const IntType st = c.sum_type();
  const size_t wsz = codec::int_size(st);
  const RankInput in = make_input(count, B, 0);
  for (InType t : {InType::kF16, InType::kBF16}) {
    SCOPED_TRACE(t == InType::kF16 ? "half" : "bfloat16");
    std::vector<uint16_t> raw(count);
    std::vector<float> x(count);
    for (uint64_t i = 0; i < count; ++i) {
      float f;
      if (t == InType::kF16) {
        const __half h = __float2half_rn(in.grad[i]);
        std::memcpy(&raw[i], &h, 2);
        f = __half2float(h);
      } else {
        const __nv_bfloat16 h = __float2bfloat16_rn(in.grad[i]);
        std::memcpy(&raw[i], &h, 2);
        f = __bfloat162float(h);
      }
      x[i] = f + in.ef[i];
    }
    std::vector<float> hs(lay.nblocks);
    ASSERT_TRUE(c.prelude(x.data(), count, hs.data()));
    const codec::CallRng hr{kSeed, 1, kRound};
    Rng dr;
    dr.seed = kSeed;
    dr.rank = 1;
    dr.round = kRound;
    std::vector<uint8_t> hvals(lay.wire_count * wsz + 8, 0);
    std::vector<float> hres(count);
    Codec::EncodeOut ho;
    ho.values = hvals.data();
    ho.residual = hres.data();
    c.encode(lay, 0, lay.nblocks, x.data(), hs.data(), hr, ho);

    DevBuf<uint16_t> dx(raw);
    DevBuf<float> def(in.ef), dstats(hs);
    DevBuf<uint8_t> dvals(lay.wire_count * wsz + 8);
    DevBuf<float> dres(count);
    size_t tb = 0;
    ASSERT_CUDA(encode(nullptr, &tb, dc, lay, 0, lay.nblocks, nullptr, t, nullptr, nullptr, Rng(), EncodeOut(), nullptr,
                       0, opts));
    DevBuf<uint8_t> temp(std::max<size_t>(tb, 1 << 20));
    tb = temp.size();
    // GPU prelude on the 16-bit input equals the host's on its float conversion (to 1 ulp)
    {
      size_t pb = 0;
      ASSERT_CUDA(prelude(nullptr, &pb, dc, lay, dx.get(), t, def.get(), dstats.get(), nullptr, 0, 0));
      DevBuf<uint8_t> ptemp(pb);
      DevBuf<float> gs(lay.nblocks);
      ASSERT_CUDA(prelude(ptemp.get(), &pb, dc, lay, dx.get(), t, def.get(), gs.get(), nullptr, 0, 0));
      const std::vector<float> g = gs.download();
      for (uint64_t b = 0; b < lay.nblocks; ++b) EXPECT_LE(ulp_diff(g[b], hs[b]), 1u);
    }
    EncodeOut o;
    o.values = dvals.get();
    o.residual = dres.get();
    ASSERT_CUDA(encode(temp.get(), &tb, dc, lay, 0, lay.nblocks, dx.get(), t, def.get(), dstats.get(), dr, o, nullptr, 0,
                       opts));
    const std::vector<uint8_t> gv = dvals.download();
    uint64_t vm = 0;
    for (uint64_t i = 0; i < lay.wire_count; ++i) vm += codec::load_int(st, hvals.data(), i) != codec::load_int(st, gv.data(), i);
    EXPECT_EQ(vm, 0u);
    EXPECT_EQ(float_mismatches(hres, dres.download(), 0), 0u);

    // decode one rank's values into the 16-bit type
    std::vector<float> hout(count);
    c.decode(lay, 0, lay.nblocks, hvals.data(), hs.data(), hr, 1, false, hout.data());
    DevBuf<uint16_t> dout(count);
    ASSERT_CUDA(decode(temp.get(), &tb, dc, lay, 0, lay.nblocks, dvals.get(), ValueLayout::kNative, dstats.get(), dr, 1,
                       false, dout.get(), t, nullptr, nullptr, 0, opts));
    const std::vector<uint16_t> go = dout.download();
    uint64_t om = 0;
    for (uint64_t i = 0; i < count; ++i) {
      uint16_t want;
      if (t == InType::kF16) {
        const __half h = __float2half_rn(hout[i]);
        std::memcpy(&want, &h, 2);
      } else {
        const __nv_bfloat16 h = __float2bfloat16_rn(hout[i]);
        std::memcpy(&want, &h, 2);
      }
      om += want != go[i];
    }
    EXPECT_EQ(om, 0u);
  }
}

// A failed call check (non-finite input somewhere, or a digest mismatch) makes decode write NaN
// and report, and encode leave the residual alone.
TEST_P(CodecKernelsOnce, FailedCheck) {
  THC_REQUIRE_DEVICE();
  const Case& k = GetParam();
  const Codec c = make_codec(k);
  DeviceCodec dc;
  ASSERT_CUDA(dc.init(c));
  const uint64_t count = count_for(3, c.block());
  const Layout lay = c.layout(count);
  const LaunchOpts opts = opts_for(k);
  std::vector<float> x = gaussian(count, 9);
  x[count / 2] = std::nanf("");
  DevBuf<float> dx(x), dstats(lay.nblocks), dres(std::vector<float>(count, 7.0f));
  DevBuf<uint32_t> check(kCheckWords), status(1);
  size_t pb = 0;
  ASSERT_CUDA(prelude(nullptr, &pb, dc, lay, dx.get(), InType::kF32, nullptr, dstats.get(), check.get(), 5, 0));
  DevBuf<uint8_t> ptemp(pb);
  ASSERT_CUDA(prelude(ptemp.get(), &pb, dc, lay, dx.get(), InType::kF32, nullptr, dstats.get(), check.get(), 5, 0));
  EXPECT_EQ(check.download()[0], 1u);
  size_t tb = 0;
  ASSERT_CUDA(encode(nullptr, &tb, dc, lay, 0, lay.nblocks, nullptr, InType::kF32, nullptr, nullptr, Rng(), EncodeOut(),
                     nullptr, 0, opts));
  DevBuf<uint8_t> temp(tb);
  DevBuf<uint8_t> vals(lay.wire_count * 4 + 8);
  EncodeOut o;
  o.values = vals.get();
  o.residual = dres.get();
  ASSERT_CUDA(encode(temp.get(), &tb, dc, lay, 0, lay.nblocks, dx.get(), InType::kF32, nullptr, dstats.get(), Rng(), o,
                     check.get(), 0, opts));
  for (float r : dres.download()) ASSERT_EQ(r, 7.0f);
  DevBuf<float> out(count);
  ASSERT_CUDA(decode(temp.get(), &tb, dc, lay, 0, lay.nblocks, vals.get(), ValueLayout::kNative, dstats.get(), Rng(), 1,
                     false, out.get(), InType::kF32, check.get(), status.get(), 0, opts));
  for (float v : out.download()) ASSERT_TRUE(std::isnan(v));
  EXPECT_EQ(status.download()[0], kStatusNonFinite);
}

// Temporary storage that is too small or not 16-byte aligned is refused before any launch (the
// kernels' vector accesses would fault on a real device).
TEST_P(CodecKernelsOnce, TempStorageChecked) {
  THC_REQUIRE_DEVICE();
  const Case& k = GetParam();
  const Codec c = make_codec(k);
  DeviceCodec dc;
  ASSERT_CUDA(dc.init(c));
  const uint64_t count = count_for(2, c.block());
  const Layout lay = c.layout(count);
  const LaunchOpts opts = opts_for(k);
  DevBuf<float> dx(gaussian(count, 3)), dstats(lay.nblocks), out(count);
  DevBuf<uint8_t> vals(lay.wire_count * 4 + 8);
  size_t pb = 0, tb = 0, db = 0;
  ASSERT_CUDA(prelude(nullptr, &pb, dc, lay, dx.get(), InType::kF32, nullptr, dstats.get(), nullptr, 0, 0));
  ASSERT_CUDA(encode(nullptr, &tb, dc, lay, 0, lay.nblocks, nullptr, InType::kF32, nullptr, nullptr, Rng(), EncodeOut(),
                     nullptr, 0, opts));
  ASSERT_CUDA(decode(nullptr, &db, dc, lay, 0, lay.nblocks, nullptr, ValueLayout::kNative, nullptr, Rng(), 1, false,
                     nullptr, InType::kF32, nullptr, nullptr, 0, opts));
  DevBuf<uint8_t> temp(std::max({pb, tb, db}) + 16);
  uint8_t* odd = temp.get() + 4;
  size_t small = pb - 1;
  EXPECT_EQ(prelude(temp.get(), &small, dc, lay, dx.get(), InType::kF32, nullptr, dstats.get(), nullptr, 0, 0),
            cudaErrorInvalidValue);
  EXPECT_EQ(prelude(odd, &pb, dc, lay, dx.get(), InType::kF32, nullptr, dstats.get(), nullptr, 0, 0),
            cudaErrorMisalignedAddress);
  ASSERT_CUDA(prelude(temp.get(), &pb, dc, lay, dx.get(), InType::kF32, nullptr, dstats.get(), nullptr, 0, 0));
  EncodeOut o;
  o.values = vals.get();
  const bool uses_temp = c.rotates();  // the natural kernels need no scratch
  const cudaError_t e = encode(odd, &tb, dc, lay, 0, lay.nblocks, dx.get(), InType::kF32, nullptr, dstats.get(), Rng(),
                               o, nullptr, 0, opts);
  EXPECT_EQ(e, uses_temp ? cudaErrorMisalignedAddress : cudaSuccess);
  const cudaError_t d = decode(odd, &db, dc, lay, 0, lay.nblocks, vals.get(), ValueLayout::kNative, dstats.get(), Rng(),
                               1, false, out.get(), InType::kF32, nullptr, nullptr, 0, opts);
  EXPECT_EQ(d, uses_temp ? cudaErrorMisalignedAddress : cudaSuccess);
}

const Case kCases[] = {
    // name                scheme              b  g    w   norm n     block mp
    {"thc", Scheme::kThc, 4, 30, 16, 2, 3, 10, 0},
    {"thc_g100_u16", Scheme::kThc, 4, 100, 16, 2, 3, 10, 0},
    {"thc_b3", Scheme::kThc, 3, 12, 16, 2, 3, 10, 0},
    {"thc_u32", Scheme::kThc, 4, 30, 16, 2, 3000, 10, 0},
    {"uhc_b8_u16", Scheme::kUniformThc, 8, 255, 16, 2, 3, 10, 0},
    {"uhc_b2", Scheme::kUniformThc, 2, 3, 16, 2, 3, 10, 0},
    {"cnat_i8", Scheme::kCnat, 4, 30, 8, 2, 3, 10, 0},
    {"cnat_i16", Scheme::kCnat, 4, 30, 16, 2, 3, 10, 0},
    {"cnat_i32", Scheme::kCnat, 4, 30, 32, 2, 3, 10, 0},
    {"dnat2", Scheme::kDnat, 4, 30, 16, 2, 3, 10, 0},
    {"dnatinf", Scheme::kDnat, 4, 30, 8, 0, 3, 10, 0},
    // the multi-pass RHT, forced on small blocks (S = 2^10: 4 rows of 1024)
    {"thc", Scheme::kThc, 4, 30, 16, 2, 3, 12, 10},
    {"uhc_b8_u16", Scheme::kUniformThc, 8, 255, 16, 2, 3, 12, 10},
    {"thc", Scheme::kThc, 4, 30, 16, 2, 3, 12, 0},
    // the kernel variants (thc_kernels.cu kVar*): the same bits as variant 0, fused and multi-pass
    {"thc_v1", Scheme::kThc, 4, 30, 16, 2, 3, 10, 0, 1},
    {"thc_v2", Scheme::kThc, 4, 30, 16, 2, 3, 10, 0, 2},
    {"thc_v3", Scheme::kThc, 4, 30, 16, 2, 3, 12, 0, 3},
    {"thc_v3", Scheme::kThc, 4, 30, 16, 2, 3, 12, 10, 3},
    {"uhc_b8_u16_v3", Scheme::kUniformThc, 8, 255, 16, 2, 3, 10, 0, 3},
    {"thc_v4", Scheme::kThc, 4, 30, 16, 2, 3, 10, 0, 4},
    {"thc_v5", Scheme::kThc, 4, 30, 16, 2, 3, 12, 0, 5},
    {"thc_v6", Scheme::kThc, 4, 30, 16, 2, 3, 12, 10, 6},
    // a thread's loads run ahead only where it has several chunks: 2^14 / 8 > 1024 threads
    {"thc_v2", Scheme::kThc, 4, 30, 16, 2, 3, 14, 0, 2},
    {"thc_v7", Scheme::kThc, 4, 30, 16, 2, 3, 13, 0, 7},
    // Real block sizes, on the emulator too since its fibers switch in user space (about 75 s of
    // CPU for these): the variants at the default block, the largest fused block, natural
    // multi-pass, a forced multi-pass of 2^11 rows, the largest Cnat block.
    {"thc_v3", Scheme::kThc, 4, 30, 16, 2, 3, 15, 0, 3},
    {"thc_v1", Scheme::kThc, 4, 30, 16, 2, 3, 15, 0, 1},
    {"thc_v2", Scheme::kThc, 4, 30, 16, 2, 3, 15, 0, 2},
    {"thc_v7", Scheme::kThc, 4, 30, 16, 2, 3, 15, 0, 7},
    {"thc_v5", Scheme::kThc, 4, 30, 16, 2, 3, 15, 0, 5},
    {"thc", Scheme::kThc, 4, 30, 16, 2, 3, 15, 0},
    {"thc", Scheme::kThc, 4, 30, 16, 2, 3, 16, 0},
    {"thc", Scheme::kThc, 4, 30, 16, 2, 3, 14, 11},
    {"cnat_i16", Scheme::kCnat, 4, 30, 16, 2, 3, 20, 0},
#if !defined(THC_CUDA_EMULATION)
    // the largest THC block: on a device only (140 s of CPU on the emulator)
    {"thc", Scheme::kThc, 4, 30, 16, 2, 3, 20, 0},
#endif
};

INSTANTIATE_TEST_SUITE_P(All, CodecKernels,
                         ::testing::Combine(::testing::ValuesIn(kCases), ::testing::Values(0, 1, 2, 3, 4, 5)),
                         case_name);
INSTANTIATE_TEST_SUITE_P(All, CodecKernelsOnce, ::testing::ValuesIn(kCases), [](const ::testing::TestParamInfo<Case>& i) {
  std::ostringstream o;
  o << i.param.name << "_b" << i.param.block_log2;
  if (i.param.force_multipass_log2) o << "_mp" << i.param.force_multipass_log2;
  return o.str();
});

}  // namespace
}  // namespace thc::cuda::test
