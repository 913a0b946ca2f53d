// The wire format: golden bytes, round trips, and rejection of every malformed shape.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "common/net.h"
#include "switch_offload/protocol/builder.h"
#include "switch_offload/protocol/wire.h"

namespace {

using namespace thc::switch_offload::proto;

const JobId kJob{0x01020304, 0x1122334455667788ull, 4};

TEST(SwitchProtocol, HeaderGoldenBytes) {
  Header h = data_header(MsgType::kDataIndex, kJob, 2, 16, 21, 9, WireInt::kU16, 200, 4, 3);
  h.flags = kFlagRetransmit;
  uint8_t b[kHeaderBytes];
  ASSERT_EQ(write_header(h, b, sizeof b), kHeaderBytes);
  const uint8_t want[kHeaderBytes] = {
      0x54, 0x48, 0x43, 0x41,  // magic "THCA"
      0x01, 17, 0x00, 0x02,    // version, DATA_INDEX, flags
      0x01, 0x02, 0x03, 0x04,  // job
      0x00, 0x02, 0x00, 0x04,  // worker 2 of 4
      0x80, 0x05,              // slot 21 % 16 = 5, shadow (21/16)&1 = 1
      0x02, 0x04,              // u16 sums, b = 4
      0x00, 0xC8, 0x00, 0x00,  // count 200, contributors 0
      0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88,  // token
      0, 0, 0, 0, 0, 0, 0, 21,  // seq
      0, 0, 0, 9,               // op
      0, 0, 0, 3,               // aux: table id
      0, 0, 0, 0, 0, 0, 0, 0};  // bitmap
  EXPECT_EQ(std::vector<uint8_t>(b, b + kHeaderBytes), std::vector<uint8_t>(want, want + kHeaderBytes));
}

TEST(SwitchProtocol, FixedPayloadSizes) {
  EXPECT_EQ(data_payload_bytes(MsgType::kDataValue, WireInt::kU8, 0), 256u);
  EXPECT_EQ(data_payload_bytes(MsgType::kDataValue, WireInt::kI16, 0), 512u);
  EXPECT_EQ(data_payload_bytes(MsgType::kDataValue, WireInt::kU32, 0), 1024u);
  EXPECT_EQ(data_payload_bytes(MsgType::kDataMax, WireInt::kU32, 0), 1024u);
  for (int b = 1; b <= 8; ++b) EXPECT_EQ(data_payload_bytes(MsgType::kDataIndex, WireInt::kU8, b), 32u * b);
  EXPECT_LE(kHeaderBytes + 1024, 1472u) << "widest data packet must fit a 1500-byte MTU (IPv4+UDP)";
}

TEST(SwitchProtocol, IndexBitOrderIsLsbFirst) {
  // b = 3: codes 5, 3, 7 -> stream bits 101 110 111 (LSB first) -> byte0 = 0b11 011 101 = 0xDD
  std::vector<uint8_t> p = make_indices(kJob, 0, 16, 0, 0, WireInt::kU8, 3, 0, {5, 3, 7});
  EXPECT_EQ(p[kHeaderBytes], 0xDD);
  EXPECT_EQ(p[kHeaderBytes + 1], 0x01);
  EXPECT_EQ(get_index(p.data() + kHeaderBytes, 0, 3), 5u);
  EXPECT_EQ(get_index(p.data() + kHeaderBytes, 1, 3), 3u);
  EXPECT_EQ(get_index(p.data() + kHeaderBytes, 2, 3), 7u);
}

TEST(SwitchProtocol, CopyIndicesAnyOffset) {
  std::mt19937 rng(3);
  for (int b = 1; b <= 8; ++b) {
    std::vector<uint8_t> codes(1000);
    for (auto& c : codes) c = static_cast<uint8_t>(rng() & ((1u << b) - 1));
    std::vector<uint8_t> packed((codes.size() * b + 7) / 8, 0);
    for (size_t i = 0; i < codes.size(); ++i)
      for (int k = 0; k < b; ++k)
        if ((codes[i] >> k) & 1) packed[(i * b + k) / 8] |= static_cast<uint8_t>(1u << ((i * b + k) % 8));
    for (uint64_t first : {0ull, 1ull, 7ull, 256ull, 513ull}) {
      const uint64_t n = std::min<uint64_t>(256, codes.size() - first);
      std::vector<uint8_t> out(32 * b, 0);
      copy_indices(packed.data(), first, n, b, out.data());
      for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(get_index(out.data(), i, b), codes[first + i]) << "b=" << b << " first=" << first;
      for (uint64_t i = n; i < 256; ++i) ASSERT_EQ(get_index(out.data(), i, b), 0u) << "padding must be zero";
    }
  }
}

TEST(SwitchProtocol, RoundTripEveryType) {
  TableSpec t;
  t.id = 2;
  t.bits = 3;
  t.sum = WireInt::kI32;
  for (int i = 0; i < 8; ++i) t.values[i] = -4 + i;
  std::vector<std::vector<uint8_t>> pkts = {
      make_join(kJob, 1, 3, 64, 5000, &t), make_join(kJob, 0, 4, 1, 0), make_table(kJob, 3, t), make_leave(kJob, 2),
      make_values(kJob, 0, 8, 100, 7, WireInt::kI8, {1, 2, 255}),
      make_values(kJob, 3, 8, 3, 1, WireInt::kU32, std::vector<uint32_t>(256, 1), MsgType::kDataMax),
      make_indices(kJob, 1, 8, 9, 2, WireInt::kU8, 8, 1, std::vector<uint8_t>(256, 200))};
  for (const auto& p : pkts) {
    Header h;
    const uint8_t* pl;
    size_t plen;
    ASSERT_EQ(parse(p.data(), p.size(), &h, &pl, &plen), ParseError::kOk) << msg_type_name(static_cast<MsgType>(p[5]));
    uint8_t back[kHeaderBytes];
    write_header(h, back, sizeof back);
    EXPECT_TRUE(std::equal(back, back + kHeaderBytes, p.begin()));
    if (h.type == MsgType::kJoin && plen > kJoinFixedBytes + kTableHeaderBytes) {
      JoinBody b;
      ASSERT_EQ(parse_join(pl, plen, h.nworkers, &b), ParseError::kOk);
      EXPECT_EQ(b.quorum, 3);
      EXPECT_EQ(b.slots, 64);
      EXPECT_EQ(b.quorum_timeout_us, 5000u);
      EXPECT_EQ(b.table.bits, 3);
      EXPECT_EQ(b.table.values[0], -4);
      EXPECT_EQ(b.table.values[7], 3);
    }
  }
}

TEST(SwitchProtocol, RejectsMalformed) {
  const std::vector<uint8_t> good = make_values(kJob, 1, 16, 0, 0, WireInt::kU16, {1, 2, 3});
  auto parse_err = [](const std::vector<uint8_t>& p) { return parse(p.data(), p.size(), nullptr, nullptr, nullptr); };
  ASSERT_EQ(parse_err(good), ParseError::kOk);
  EXPECT_EQ(parse(nullptr, 0, nullptr, nullptr, nullptr), ParseError::kTruncated);
  for (size_t n = 0; n < good.size(); ++n) {
    const ParseError e = parse(good.data(), n, nullptr, nullptr, nullptr);
    EXPECT_NE(e, ParseError::kOk) << "prefix of " << n << " bytes accepted";
    if (n < kHeaderBytes) {
      EXPECT_EQ(e, ParseError::kTruncated);
    }
  }
  auto mut = [&](size_t off, uint8_t v) {
    auto x = good;
    x[off] = v;
    return parse_err(x);
  };
  EXPECT_EQ(mut(0, 0), ParseError::kBadMagic);
  EXPECT_EQ(mut(4, 2), ParseError::kBadVersion);
  EXPECT_EQ(mut(5, 0), ParseError::kBadType);
  EXPECT_EQ(mut(5, 200), ParseError::kBadType);
  EXPECT_EQ(mut(7, 0x80), ParseError::kBadField);   // unknown flag
  EXPECT_EQ(mut(13, 4), ParseError::kBadField);     // worker 4 of 4
  EXPECT_EQ(mut(15, 0), ParseError::kBadField);     // 0 workers
  EXPECT_EQ(mut(15, 65), ParseError::kBadField);    // 65 workers
  EXPECT_EQ(mut(18, 7), ParseError::kBadField);     // encoding
  EXPECT_EQ(mut(18, 3), ParseError::kBadLength);    // u32 with a u16-sized payload
  EXPECT_EQ(mut(19, 4), ParseError::kBadField);     // bits on a value packet
  EXPECT_EQ(mut(21, 0), ParseError::kBadField);     // count 0
  EXPECT_EQ(mut(20, 1), ParseError::kBadField);     // count 259
  EXPECT_EQ(mut(23, 1), ParseError::kBadField);     // contributors upstream
  EXPECT_EQ(mut(55, 1), ParseError::kBadField);     // bitmap upstream
  auto longer = good;
  longer.push_back(0);
  EXPECT_EQ(parse_err(longer), ParseError::kBadLength);
  std::vector<uint8_t> huge(kMaxPacketBytes + 1, 0);
  std::copy(good.begin(), good.end(), huge.begin());
  EXPECT_EQ(parse_err(huge), ParseError::kBadLength);

  // A result whose bitmap disagrees with its contributor count.
  Header r = data_header(MsgType::kResult, kJob, 0, 16, 0, 0, WireInt::kU8, 10);
  r.contributors = 2;
  r.bitmap = 0b111;
  EXPECT_EQ(parse_err(make_packet(r, std::vector<uint8_t>(256))), ParseError::kBadField);
  r.bitmap = 0b10001;  // worker 4 of 4
  EXPECT_EQ(parse_err(make_packet(r, std::vector<uint8_t>(256))), ParseError::kBadField);
  r.bitmap = 0b1001;
  EXPECT_EQ(parse_err(make_packet(r, std::vector<uint8_t>(256))), ParseError::kOk);

  // Join bodies: quorum above n, zero slots, table bits 9, trailing bytes.
  JoinBody b;
  std::vector<uint8_t> body(kMaxPacketBytes);
  b.quorum = 5;
  b.slots = 4;
  body.resize(write_join(b, body.data(), body.size()));
  EXPECT_EQ(parse_join(body.data(), body.size(), 4, nullptr), ParseError::kBadField);
  b.quorum = 4;
  b.slots = 0;
  body.assign(kMaxPacketBytes, 0);
  body.resize(write_join(b, body.data(), body.size()));
  EXPECT_EQ(parse_join(body.data(), body.size(), 4, nullptr), ParseError::kBadField);
  auto j = make_join(kJob, 0, 4, 4, 0);
  j[kHeaderBytes + kJoinFixedBytes + 1] = 9;
  EXPECT_EQ(parse_err(j), ParseError::kBadField);
  j = make_join(kJob, 0, 4, 4, 0);
  j.push_back(0);
  EXPECT_EQ(parse_err(j), ParseError::kBadLength);
}

TEST(SwitchProtocol, RandomBytesNeverCrashAndAcceptedOnesRoundTrip) {
  std::mt19937_64 rng(12345);
  const std::vector<uint8_t> seed = make_values(kJob, 1, 16, 0, 0, WireInt::kU8, {1, 2, 3});
  for (int it = 0; it < 20000; ++it) {
    std::vector<uint8_t> p = seed;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) p[rng() % kHeaderBytes] = static_cast<uint8_t>(rng());
    if (rng() % 4 == 0) p.resize(rng() % (p.size() + 8));
    Header h;
    if (parse(p.data(), p.size(), &h, nullptr, nullptr) == ParseError::kOk) {
      uint8_t back[kHeaderBytes];
      write_header(h, back, sizeof back);
      ASSERT_TRUE(std::equal(back, back + kHeaderBytes, p.begin()));
    }
  }
}

TEST(SwitchProtocol, UdpUrlParsing) {
  std::string host, err;
  uint16_t port = 0;
  ASSERT_TRUE(thc::parse_udp_url("udp://127.0.0.1:4791", &host, &port, &err)) << err;
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 4791);
  ASSERT_TRUE(thc::parse_udp_url("localhost:9", &host, &port, &err));
  EXPECT_EQ(host, "localhost");
  ASSERT_TRUE(thc::parse_udp_url("udp://[::1]:5000", &host, &port, &err));
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 5000);
  for (const char* bad : {"udp://127.0.0.1", "udp://:80", "udp://h:0", "udp://h:70000", "tcp://h:1", "h:1x", "::1:5"})
    EXPECT_FALSE(thc::parse_udp_url(bad, &host, &port, &err)) << bad;
}

}  // namespace
