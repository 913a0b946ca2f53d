// The wire format (version 3): golden bytes, lanes, round trips, rejection of every malformed
// shape; and its authentication: tags, keys, key files, cookies.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <vector>

#include "common/net.h"
#include "switch_offload/protocol/auth.h"
#include "switch_offload/protocol/builder.h"
#include "switch_offload/protocol/wire.h"

namespace {

using namespace thc::switch_offload::proto;
namespace auth = thc::switch_offload::auth;

auth::Key key(uint32_t id, uint8_t fill) {
  auth::Key k;
  k.id = id;
  for (size_t i = 0; i < auth::kKeyBytes; ++i) k.bytes[i] = static_cast<uint8_t>(fill + i);
  return k;
}

JobId job4() {
  JobId j = JobId::make(key(7, 1), 0x01020304, 4);
  j.with_seed(99);
  return j;
}

TEST(SwitchProtocol, HeaderGoldenBytes) {
  const JobId j = job4();
  Header h = data_header(MsgType::kDataIndex, j, 2, 16, 21, 9, WireInt::kU16, 200, 1024, 4, 3);
  h.flags = kFlagRetransmit | kFlagFirst;
  h.attempt = 3;
  h.shard = 3;
  h.tag = 0x0102030405060708ull;
  uint8_t b[kHeaderBytes];
  ASSERT_EQ(write_header(h, b, sizeof b), kHeaderBytes);
  const uint8_t want[kHeaderBytes] = {
      0x54, 0x48, 0x43, 0x41,  // magic "THCA"
      0x03, 17, 0x00, 0x0A,    // version 3, DATA_INDEX, flags RETRANSMIT|FIRST
      0, 0, 0, 7, 0x01, 0x02, 0x03, 0x04,  // job: key id 7, label 0x01020304
      0x00, 0x02, 0x00, 0x04,  // worker 2 of 4
      0x80, 0x05,              // slot 21 % 16 = 5, shadow (21/16)&1 = 1
      0x04, 0x00,              // lanes 1024
      0x02, 0x04,              // u16 sums, b = 4
      0x00, 0xC8, 0x00, 0x03,  // count 200, attempt 3 (upstream data)
      0x00, 0x03,              // shard 3
      0, 0, 0, 0, 0, 0, 0, 21,  // seq
      0, 0, 0, 9,               // op
      0, 0, 0, 3,               // aux: table id
      0, 0, 0, 0, 0, 0, 0, 0,   // bitmap
      1, 2, 3, 4, 5, 6, 7, 8};  // tag
  EXPECT_EQ(std::vector<uint8_t>(b, b + kHeaderBytes), std::vector<uint8_t>(want, want + kHeaderBytes));
}

TEST(SwitchProtocol, LanesFollowThePayloadBudget) {
  // A 1500-byte MTU: 4-bit indices up, u8 sums down -> 1408 lanes; u16 sums 704; u32 (and the
  // MAX prelude) 352 -> 320 (multiples of 64).
  EXPECT_EQ(kPayloadBudget1500, 1408);
  EXPECT_EQ(lanes_for(MsgType::kDataIndex, WireInt::kU8, 4, kMaxLanes, kPayloadBudget1500), 1408);
  EXPECT_EQ(lanes_for(MsgType::kDataIndex, WireInt::kU16, 5, kMaxLanes, kPayloadBudget1500), 704);
  EXPECT_EQ(lanes_for(MsgType::kDataValue, WireInt::kU32, 0, kMaxLanes, kPayloadBudget1500), 320);
  EXPECT_EQ(lanes_for(MsgType::kDataMax, WireInt::kU32, 0, kMaxLanes, kPayloadBudget1500), 320);
  // The Tofino profile: 256 lanes for every encoding, as in version 1.
  for (WireInt e : {WireInt::kU8, WireInt::kU16, WireInt::kU32}) {
    EXPECT_EQ(lanes_for(MsgType::kDataValue, e, 0, kTofinoLanes, kTofinoPayloadBudget), 256);
    EXPECT_EQ(lanes_for(MsgType::kDataIndex, e, 4, kTofinoLanes, kTofinoPayloadBudget), 256);
  }
  // Jumbo frames: the budget would allow 8896, the protocol caps at 8192.
  EXPECT_EQ(lanes_for(MsgType::kDataIndex, WireInt::kU8, 4, kMaxLanes, kMaxPayloadBudget), 8192);
  EXPECT_EQ(lanes_for(MsgType::kDataIndex, WireInt::kU16, 4, kMaxLanes, kMaxPayloadBudget), 4416);
  // Whatever lanes_for returns fits: header + payload and its result within budget + header.
  for (int budget : {32, 100, 1024, 1408, 4000, kMaxPayloadBudget})
    for (MsgType t : {MsgType::kDataValue, MsgType::kDataIndex, MsgType::kDataMax})
      for (WireInt e : {WireInt::kU8, WireInt::kI16, WireInt::kU32}) {
        if (t == MsgType::kDataMax && e != WireInt::kU32) continue;
        const int bits = t == MsgType::kDataIndex ? 5 : 0;
        const int l = lanes_for(t, e, bits, kMaxLanes, budget);
        if (l == 0) continue;
        EXPECT_EQ(l % kLaneQuantum, 0);
        EXPECT_LE(data_payload_bytes(t, e, bits, l), static_cast<size_t>(budget));
        EXPECT_LE(data_payload_bytes(MsgType::kResult, t == MsgType::kDataMax ? WireInt::kU32 : e, 0, l),
                  static_cast<size_t>(budget));
      }
}

TEST(SwitchProtocol, IndexBitOrderIsLsbFirst) {
  // b = 3: codes 5, 3, 7 -> stream bits 101 110 111 (LSB first) -> byte0 = 0b11 011 101 = 0xDD
  std::vector<uint8_t> p = make_indices(job4(), 0, 16, 0, 0, WireInt::kU8, 3, 0, {5, 3, 7});
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
  const JobId j = job4();
  TableSpec t;
  t.id = 2;
  t.bits = 3;
  t.sum = WireInt::kI32;
  for (int i = 0; i < 8; ++i) t.values[i] = -4 + i;
  JoinParams p;
  p.quorum = 3;
  p.slots = 64;
  p.quorum_timeout_us = 5000;
  p.max_lanes = 1024;
  p.payload_budget = 1408;
  p.flags = kJoinRejoin;
  p.table = &t;
  JoinParams plain;
  plain.quorum = 4;
  std::vector<std::vector<uint8_t>> pkts = {
      make_join(j, 1, p), make_join(j, 0, plain), make_table(j, 3, t), make_leave(j, 2),
      make_values(j, 0, 8, 100, 7, WireInt::kI8, {1, 2, 255}),
      make_values(j, 3, 8, 3, 1, WireInt::kU32, std::vector<uint32_t>(256, 1), MsgType::kDataMax),
      make_indices(j, 1, 8, 9, 2, WireInt::kU8, 8, 1, std::vector<uint8_t>(256, 200)),
      make_indices(j, 1, 8, 9, 2, WireInt::kU8, 4, 1, std::vector<uint8_t>(1300, 9), 1344)};
  for (const auto& pk : pkts) {
    Header h;
    const uint8_t* pl;
    size_t plen;
    ASSERT_EQ(parse(pk.data(), pk.size(), &h, &pl, &plen), ParseError::kOk) << msg_type_name(static_cast<MsgType>(pk[5]));
    uint8_t back[kHeaderBytes];
    write_header(h, back, sizeof back);
    EXPECT_TRUE(std::equal(back, back + kHeaderBytes, pk.begin()));
    if (h.type == MsgType::kJoin && plen > kJoinFixedBytes + kTableHeaderBytes) {
      JoinBody b;
      ASSERT_EQ(parse_join(pl, plen, h.nworkers, &b), ParseError::kOk);
      EXPECT_EQ(b.quorum, 3);
      EXPECT_EQ(b.slots, 64);
      EXPECT_EQ(b.quorum_timeout_us, 5000u);
      EXPECT_EQ(b.max_lanes, 1024);
      EXPECT_EQ(b.payload_budget, 1408);
      EXPECT_EQ(b.flags, kJoinRejoin);
      EXPECT_EQ(b.table.bits, 3);
      EXPECT_EQ(b.table.values[0], -4);
      EXPECT_EQ(b.table.values[7], 3);
    }
  }
  JoinAckBody a;
  a.seed = 5;
  a.slots = 9;
  a.max_lanes = 1344;
  a.payload_budget = 1408;
  a.nworkers = 4;
  a.quorum = 3;
  a.shards = 2;
  a.quorum_timeout_us = 7;
  a.resume_op = 11;
  a.resume_seq = 12345;
  a.resume_flags = kResumeKnown;
  uint8_t buf[kJoinAckBytes];
  ASSERT_EQ(write_join_ack(a, buf, sizeof buf), kJoinAckBytes);
  JoinAckBody back;
  ASSERT_EQ(parse_join_ack(buf, sizeof buf, &back), ParseError::kOk);
  EXPECT_EQ(back.resume_seq, 12345u);
  EXPECT_EQ(back.shards, 2);
  // resume_flags: bit 0 resume known, bit 1 a data plane aggregates; other bits are malformed.
  a.resume_flags = kResumeKnown | kAckDataPlane;
  ASSERT_EQ(write_join_ack(a, buf, sizeof buf), kJoinAckBytes);
  ASSERT_EQ(parse_join_ack(buf, sizeof buf, &back), ParseError::kOk);
  EXPECT_EQ(back.resume_flags, kResumeKnown | kAckDataPlane);
  buf[39] = 4;
  EXPECT_EQ(parse_join_ack(buf, sizeof buf, nullptr), ParseError::kBadField);
  buf[39] = 1;
  buf[19] = 0;  // shards 0
  EXPECT_EQ(parse_join_ack(buf, sizeof buf, nullptr), ParseError::kBadField);
}

TEST(SwitchProtocol, RejectsMalformed) {
  const JobId j = job4();
  const std::vector<uint8_t> good = make_values(j, 1, 16, 0, 0, WireInt::kU16, {1, 2, 3});
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
  EXPECT_EQ(mut(4, 1), ParseError::kBadVersion);    // version 1 is not spoken any more
  EXPECT_EQ(mut(5, 0), ParseError::kBadType);
  EXPECT_EQ(mut(5, 200), ParseError::kBadType);
  EXPECT_EQ(mut(7, 0x80), ParseError::kBadField);   // unknown flag
  EXPECT_EQ(mut(7, 0x01), ParseError::kBadField);   // NOT_COUNTED upstream
  EXPECT_EQ(mut(17, 4), ParseError::kBadField);     // worker 4 of 4
  EXPECT_EQ(mut(19, 0), ParseError::kBadField);     // 0 workers
  EXPECT_EQ(mut(19, 65), ParseError::kBadField);    // 65 workers
  EXPECT_EQ(mut(22, 0), ParseError::kBadField);     // lanes 0
  EXPECT_EQ(mut(23, 65), ParseError::kBadField);    // lanes 321: not a multiple of 64
  EXPECT_EQ(mut(22, 0x40), ParseError::kBadField);  // lanes 16384 > 8192
  EXPECT_EQ(mut(23, 128), ParseError::kBadLength);  // 384 lanes with a 256-lane payload
  EXPECT_EQ(mut(24, 7), ParseError::kBadField);     // encoding
  EXPECT_EQ(mut(24, 3), ParseError::kBadLength);    // u32 with a u16-sized payload
  EXPECT_EQ(mut(25, 4), ParseError::kBadField);     // bits on a value packet
  EXPECT_EQ(mut(27, 0), ParseError::kBadField);     // count 0
  EXPECT_EQ(mut(26, 1), ParseError::kBadField);     // count 259 > lanes 256
  EXPECT_EQ(mut(29, 1), ParseError::kBadField);     // contributors upstream
  EXPECT_EQ(mut(30, 1), ParseError::kBadField);     // shard 259 > 255
  EXPECT_EQ(mut(55, 1), ParseError::kBadField);     // bitmap upstream
  auto longer = good;
  longer.push_back(0);
  EXPECT_EQ(parse_err(longer), ParseError::kBadLength);
  std::vector<uint8_t> huge(kMaxPacketBytes + 1, 0);
  std::copy(good.begin(), good.end(), huge.begin());
  EXPECT_EQ(parse_err(huge), ParseError::kBadLength);

  // A result whose bitmap disagrees with its contributor count.
  Header r = data_header(MsgType::kResult, j, 0, 16, 0, 0, WireInt::kU8, 10, 256);
  r.contributors = 2;
  r.bitmap = 0b111;
  EXPECT_EQ(parse_err(make_packet(r, std::vector<uint8_t>(256), nullptr)), ParseError::kBadField);
  r.bitmap = 0b10001;  // worker 4 of 4
  EXPECT_EQ(parse_err(make_packet(r, std::vector<uint8_t>(256), nullptr)), ParseError::kBadField);
  r.bitmap = 0b1001;
  EXPECT_EQ(parse_err(make_packet(r, std::vector<uint8_t>(256), nullptr)), ParseError::kOk);

  // Errors carry known codes only.
  Header e = control_header(MsgType::kError, j, 1, 5);
  for (uint32_t code : {0u, 1u, 6u, 11u, 1000u}) {
    e.aux = code;
    EXPECT_EQ(parse_err(make_packet(e, {}, nullptr)), ParseError::kBadField) << code;
  }
  for (ErrorCode c : {ErrorCode::kLeftBehind, ErrorCode::kNotSupported, ErrorCode::kJobBusy}) {
    e.aux = static_cast<uint32_t>(c);
    EXPECT_EQ(parse_err(make_packet(e, {}, nullptr)), ParseError::kOk);
  }

  // Join bodies: quorum above n, zero slots, lanes out of range, unknown flags, table bits 9,
  // trailing bytes.
  JoinBody b;
  std::vector<uint8_t> body(kMaxPacketBytes);
  auto body_err = [&](const JoinBody& x) {
    body.assign(kMaxPacketBytes, 0);
    body.resize(write_join(x, body.data(), body.size()));
    return parse_join(body.data(), body.size(), 4, nullptr);
  };
  b.quorum = 4;
  b.slots = 4;
  b.max_lanes = 256;
  b.payload_budget = 1024;
  EXPECT_EQ(body_err(b), ParseError::kOk);
  JoinBody x = b;
  x.quorum = 5;
  EXPECT_EQ(body_err(x), ParseError::kBadField);
  x = b;
  x.slots = 0;
  EXPECT_EQ(body_err(x), ParseError::kBadField);
  x = b;
  x.max_lanes = 32;
  EXPECT_EQ(body_err(x), ParseError::kBadField);
  x = b;
  x.flags = 2;
  EXPECT_EQ(body_err(x), ParseError::kBadField);
  JoinParams p;
  p.quorum = 4;
  p.slots = 4;
  auto jp = make_join(j, 0, p);
  jp[kHeaderBytes + kJoinFixedBytes + 1] = 9;
  EXPECT_EQ(parse_err(jp), ParseError::kBadField);
  jp = make_join(j, 0, p);
  jp.push_back(0);
  EXPECT_EQ(parse_err(jp), ParseError::kBadLength);
  // The reserved bytes (they keep every JOIN at least as large as a JOIN_ACK) must be zero.
  jp = make_join(j, 0, p);
  EXPECT_GE(jp.size(), kHeaderBytes + kJoinAckBytes) << "a JOIN_ACK would be larger than the smallest JOIN";
  jp[kHeaderBytes + kJoinFixedBytes - 1] = 1;
  EXPECT_EQ(parse_join(jp.data() + kHeaderBytes, jp.size() - kHeaderBytes, 4, nullptr), ParseError::kBadField);
}

TEST(SwitchProtocol, RandomBytesNeverCrashAndAcceptedOnesRoundTrip) {
  std::mt19937_64 rng(12345);
  const std::vector<uint8_t> seed = make_values(job4(), 1, 16, 0, 0, WireInt::kU8, {1, 2, 3});
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
  ASSERT_TRUE(thc::parse_udp_url("udp://127.0.0.1:9471", &host, &port, &err)) << err;
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 9471);
  ASSERT_TRUE(thc::parse_udp_url("localhost:9", &host, &port, &err));
  EXPECT_EQ(host, "localhost");
  ASSERT_TRUE(thc::parse_udp_url("udp://[::1]:5000", &host, &port, &err));
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 5000);
  for (const char* bad : {"udp://127.0.0.1", "udp://:80", "udp://h:0", "udp://h:70000", "tcp://h:1", "h:1x", "::1:5"})
    EXPECT_FALSE(thc::parse_udp_url(bad, &host, &port, &err)) << bad;
}

// ---- authentication -------------------------------------------------------------------------

TEST(SwitchAuth, EveryByteIsCovered) {
  JobId j = job4();
  std::vector<uint8_t> p = make_indices(j, 1, 8, 9, 2, WireInt::kU8, 4, 1, std::vector<uint8_t>(300, 9), 512);
  ASSERT_TRUE(auth::verify(j.dkey, p.data(), p.size()));
  for (size_t i = 0; i < p.size(); ++i) {
    if (i >= kTagOffset && i < kHeaderBytes) continue;  // the tag itself
    auto x = p;
    x[i] ^= 0x01;
    EXPECT_FALSE(auth::verify(j.dkey, x.data(), x.size())) << "byte " << i << " is not authenticated";
  }
  // Another job, another seed (incarnation) or another key: nothing verifies.
  JobId other = j;
  other.with_seed(100);
  EXPECT_FALSE(auth::verify(other.dkey, p.data(), p.size()));
  EXPECT_FALSE(auth::verify(j.jkey, p.data(), p.size()));
  JobId k2 = JobId::make(key(7, 2), 0x01020304, 4);
  k2.with_seed(99);
  EXPECT_FALSE(auth::verify(k2.dkey, p.data(), p.size()));
  JobId label = JobId::make(key(7, 1), 0x01020305, 4);
  label.with_seed(99);
  EXPECT_FALSE(auth::verify(label.dkey, p.data(), p.size()));
  EXPECT_FALSE(auth::verify(j.dkey, p.data(), kHeaderBytes - 1));
}

TEST(SwitchAuth, PayloadHashShortcutEqualsTheFullTag) {
  JobId j = job4();
  std::vector<uint8_t> p = make_values(j, 2, 8, 3, 1, WireInt::kU16, std::vector<uint32_t>(100, 7));
  const uint64_t ph = auth::payload_hash(j.dkey, p.data() + kHeaderBytes, p.size() - kHeaderBytes);
  EXPECT_EQ(auth::tag_from_hash(j.dkey, p.data(), ph), auth::compute_tag(j.dkey, p.data(), p.size()));
  EXPECT_EQ(load_be64(p.data() + kTagOffset), auth::compute_tag(j.dkey, p.data(), p.size()));
}

TEST(SwitchAuth, KeysParseAndFormat) {
  const auth::Key k = auth::generate_key(42);
  auth::Key back;
  std::string err;
  ASSERT_TRUE(auth::parse_key(auth::format_key(k), &back, &err)) << err;
  EXPECT_EQ(back.id, 42u);
  EXPECT_EQ(std::vector<uint8_t>(back.bytes, back.bytes + 32), std::vector<uint8_t>(k.bytes, k.bytes + 32));
  const auth::Key k2 = auth::generate_key(42);
  EXPECT_NE(std::vector<uint8_t>(k2.bytes, k2.bytes + 32), std::vector<uint8_t>(k.bytes, k.bytes + 32));
  for (const char* bad : {"", "1", ":00", "x:00", "1:00", "4294967296:" "0000000000000000000000000000000000000000000000000000000000000000",
                          "1:zz00000000000000000000000000000000000000000000000000000000000000",
                          "1:000000000000000000000000000000000000000000000000000000000000000"}) {
    EXPECT_FALSE(auth::parse_key(bad, &back, &err)) << bad;
    EXPECT_FALSE(err.empty());
  }
}

TEST(SwitchAuth, KeyFilesMustBePrivate) {
  const std::string path = "/tmp/thc_auth_test_" + std::to_string(::getpid()) + ".keys";
  ::unlink(path.c_str());
  std::string err;
  ASSERT_TRUE(auth::write_key_file(path, {auth::generate_key(0), auth::generate_key(5)}, &err)) << err;
  EXPECT_FALSE(auth::write_key_file(path, {auth::generate_key(1)}, &err)) << "must not overwrite";
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::vector<auth::Key> keys;
  ASSERT_TRUE(auth::load_key_file(path, &keys, &err)) << err;
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys[1].id, 5u);
  ::chmod(path.c_str(), 0644);
  EXPECT_FALSE(auth::load_key_file(path, &keys, &err));
  EXPECT_NE(err.find("chmod 600"), std::string::npos) << err;
  ::chmod(path.c_str(), 0600);
  {
    std::ofstream f(path, std::ios::app);
    f << auth::format_key(auth::generate_key(5)) << "\n";  // duplicate id
  }
  EXPECT_FALSE(auth::load_key_file(path, &keys, &err));
  EXPECT_NE(err.find("twice"), std::string::npos) << err;
  ::unlink(path.c_str());
  EXPECT_FALSE(auth::load_key_file(path, &keys, &err));
}

TEST(SwitchAuth, CookiesBindAddressJobWorkerAndTime) {
  auth::CookieJar jar(1'000'000);
  const uint8_t addr[4] = {10, 0, 0, 1}, other[4] = {10, 0, 0, 2};
  uint8_t c[16];
  jar.make(addr, 4, 77, 3, 5'500'000, c);
  EXPECT_TRUE(jar.check(addr, 4, 77, 3, 5'500'000, c));
  EXPECT_TRUE(jar.check(addr, 4, 77, 3, 6'900'000, c)) << "the next bucket still accepts it";
  EXPECT_FALSE(jar.check(addr, 4, 77, 3, 7'000'000, c)) << "two buckets later it expired";
  EXPECT_FALSE(jar.check(other, 4, 77, 3, 5'500'000, c));
  EXPECT_FALSE(jar.check(addr, 4, 78, 3, 5'500'000, c));
  EXPECT_FALSE(jar.check(addr, 4, 77, 2, 5'500'000, c));
  c[15] ^= 1;
  EXPECT_FALSE(jar.check(addr, 4, 77, 3, 5'500'000, c));
  auth::CookieJar other_jar(1'000'000);  // another aggregator (or a restart): its own secret
  jar.make(addr, 4, 77, 3, 5'500'000, c);
  EXPECT_FALSE(other_jar.check(addr, 4, 77, 3, 5'500'000, c));
  EXPECT_EQ(jar.valid_until(5'500'000), 7'000'000u) << "no cookie made by then verifies later";
  jar.rotate();  // a new secret: no earlier cookie verifies
  EXPECT_FALSE(jar.check(addr, 4, 77, 3, 5'500'000, c));
}

}  // namespace
