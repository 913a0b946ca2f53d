// Writes the seed corpus of both fuzzers: valid and malformed packets (corpus/packet) and short
// aggregator sessions (corpus/engine). The files in switch_offload/fuzz/corpus were produced by
//   thc_switch_make_corpus switch_offload/fuzz/corpus
// and are replayed by the switch_fuzz_corpus_test in every normal build.
#include <cstdio>
#include <fstream>
#include <string>
#include <sys/stat.h>
#include <vector>

#include "switch_offload/fuzz/harness.h"
#include "switch_offload/protocol/builder.h"

using namespace thc::switch_offload;
using namespace thc::switch_offload::proto;
using thc::switch_offload::fuzz::frame;

namespace {

std::string g_dir;
int g_written = 0;

void put(const std::string& sub, const std::string& name, const std::vector<uint8_t>& bytes) {
  const std::string d = g_dir + "/" + sub;
  ::mkdir(d.c_str(), 0755);
  std::ofstream f(d + "/" + name + ".bin", std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ++g_written;
}

TableSpec thc_table(uint8_t id) {
  // THC b=4, g=30 shaped table (monotone, 0..30).
  static const int32_t v[16] = {0, 4, 7, 9, 11, 13, 14, 15, 15, 16, 17, 19, 21, 23, 26, 30};
  TableSpec t;
  t.id = id;
  t.bits = 4;
  t.sum = WireInt::kU8;
  for (int i = 0; i < 16; ++i) t.values[i] = v[i];
  return t;
}

std::vector<uint8_t> codes(int n, int bits, int salt) {
  std::vector<uint8_t> c(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) c[static_cast<size_t>(i)] = static_cast<uint8_t>((i * 7 + salt) & ((1 << bits) - 1));
  return c;
}

void packets() {
  const JobId j{7, 0xABCDEF0123456789ull, 4};
  TableSpec t = thc_table(0);
  put("packet", "join_plain", make_join(j, 0, 4, 16, 1000));
  put("packet", "join_table", make_join(j, 1, 3, 16, 1000, &t));
  put("packet", "table", make_table(j, 2, thc_table(1)));
  put("packet", "leave", make_leave(j, 3));
  put("packet", "stats", make_packet(control_header(MsgType::kStats, j, 0, 9)));
  put("packet", "value_u8", make_values(j, 0, 16, 0, 0, WireInt::kU8, std::vector<uint32_t>(256, 3)));
  put("packet", "value_i16_partial", make_values(j, 1, 16, 17, 2, WireInt::kI16, std::vector<uint32_t>(100, 0xFFFF)));
  put("packet", "value_u32", make_values(j, 2, 16, 5, 1, WireInt::kU32, std::vector<uint32_t>(256, 0x01020304)));
  put("packet", "max_u32", make_values(j, 3, 16, 1, 0, WireInt::kU32, std::vector<uint32_t>(7, 99), MsgType::kDataMax));
  put("packet", "index_b4", make_indices(j, 0, 16, 3, 1, WireInt::kU8, 4, 0, codes(256, 4, 1)));
  put("packet", "index_b3_odd", make_indices(j, 1, 16, 4, 1, WireInt::kU16, 3, 2, codes(77, 3, 2)));
  put("packet", "index_b8", make_indices(j, 2, 16, 6, 1, WireInt::kI32, 8, 3, codes(256, 8, 3)));
  {
    Header h = data_header(MsgType::kResult, j, 1, 16, 3, 1, WireInt::kU8, 256);
    h.contributors = 3;
    h.bitmap = 0b1011;
    h.flags = kFlagPartial | kFlagNotCounted;
    put("packet", "result_partial", make_packet(h, std::vector<uint8_t>(256, 45)));
    Header a = data_header(MsgType::kAck, j, 2, 16, 3, 1, WireInt::kNone, 0);
    a.flags = kFlagNotCounted;
    put("packet", "ack_not_counted", make_packet(a));
    Header e = control_header(MsgType::kError, j, 1, 5);
    e.aux = static_cast<uint32_t>(ErrorCode::kBadToken);
    put("packet", "error_bad_token", make_packet(e));
    JoinAckBody ab{0x1122334455667788ull, 16, kLanes, 4, 3, 1000};
    std::vector<uint8_t> body(kJoinAckBytes);
    write_join_ack(ab, body.data(), body.size());
    put("packet", "join_ack", make_packet(control_header(MsgType::kJoinAck, j, 0, 1), body));
    Header s = control_header(MsgType::kStatsReply, j, 0, 9);
    s.aux = 2;
    put("packet", "stats_reply", make_packet(s, std::vector<uint8_t>(16, 1)));
  }
  // Malformed.
  std::vector<uint8_t> v = make_values(j, 0, 16, 0, 0, WireInt::kU8, std::vector<uint32_t>(256, 3));
  put("packet", "bad_truncated_header", std::vector<uint8_t>(v.begin(), v.begin() + 30));
  put("packet", "bad_truncated_payload", std::vector<uint8_t>(v.begin(), v.end() - 1));
  {
    auto x = v;
    x.push_back(0);
    put("packet", "bad_oversized_payload", x);
    x = v;
    x[0] ^= 0xFF;
    put("packet", "bad_magic", x);
    x = v;
    x[4] = 2;
    put("packet", "bad_version", x);
    x = v;
    x[5] = 99;
    put("packet", "bad_type", x);
    x = v;
    x[12] = 0;
    x[13] = 9;  // worker 9 of 4
    put("packet", "bad_worker", x);
    x = v;
    x[20] = 0x01;
    x[21] = 0x2C;  // count 300
    put("packet", "bad_count", x);
    x = v;
    x[18] = 9;  // encoding
    put("packet", "bad_encoding", x);
    put("packet", "bad_huge", std::vector<uint8_t>(4000, 0x41));
    put("packet", "empty", {});
  }
}

void engine_sessions() {
  const JobId j{3, 0x5EED5EED5EED5EEDull, 2};
  const uint32_t S = 4;
  TableSpec t = thc_table(0);
  {
    // Two workers, a table, index sums over more packets than slots, a duplicate, a
    // retransmission after completion, then leave.
    std::vector<uint8_t> s;
    frame(&s, 0, 0, make_join(j, 0, 2, S, 0, &t));
    frame(&s, 1, 1, make_join(j, 1, 2, S, 0));
    for (uint64_t seq = 0; seq < 12; ++seq) {
      frame(&s, 0, 1, make_indices(j, 0, S, seq, static_cast<uint32_t>(seq / 3), WireInt::kU8, 4, 0, codes(256, 4, static_cast<int>(seq))));
      if (seq == 2) frame(&s, 0, 0, make_indices(j, 0, S, seq, 0, WireInt::kU8, 4, 0, codes(256, 4, 2)));
      frame(&s, 1, 1, make_indices(j, 1, S, seq, static_cast<uint32_t>(seq / 3), WireInt::kU8, 4, 0, codes(256, 4, 5)));
      if (seq == 4) frame(&s, 1, 0, make_indices(j, 1, S, seq, 1, WireInt::kU8, 4, 0, codes(256, 4, 5)));
    }
    frame(&s, 0, 1, make_leave(j, 0));
    frame(&s, 1, 1, make_leave(j, 1));
    put("engine", "index_two_workers", s);
  }
  {
    // Quorum 2 of 3 with a 1 ms timeout: worker 2 is late and told it was not counted; a value
    // sum and a max.
    const JobId k{4, 77, 3};
    std::vector<uint8_t> s;
    for (uint16_t w = 0; w < 3; ++w) frame(&s, w, 0, make_join(k, w, 2, S, 1000));
    frame(&s, 0, 1, make_values(k, 0, S, 0, 0, WireInt::kU32, {1, 2, 3}, MsgType::kDataMax));
    frame(&s, 1, 1, make_values(k, 1, S, 0, 0, WireInt::kU32, {3, 2, 1}, MsgType::kDataMax));
    frame(&s, 0, 20, make_values(k, 0, S, 1, 1, WireInt::kI16, std::vector<uint32_t>(256, 0xFFFE)), true);
    frame(&s, 1, 1, make_values(k, 1, S, 1, 1, WireInt::kI16, std::vector<uint32_t>(256, 5)));
    frame(&s, 2, 20, make_values(k, 2, S, 1, 1, WireInt::kI16, std::vector<uint32_t>(256, 7)), true);
    frame(&s, 2, 1, make_values(k, 2, S, 0, 0, WireInt::kU32, {9, 9, 9}, MsgType::kDataMax));
    put("engine", "partial_quorum", s);
  }
  {
    // Isolation: garbage, wrong token, wrong version and a truncated packet around a job.
    std::vector<uint8_t> s;
    frame(&s, 0, 0, make_join(j, 0, 2, S, 0));
    frame(&s, 1, 0, make_join(j, 1, 2, S, 0));
    JobId bad = j;
    bad.token ^= 1;
    frame(&s, 2, 1, make_values(bad, 0, S, 0, 0, WireInt::kU8, {1, 1}));
    frame(&s, 3, 1, std::vector<uint8_t>(100, 0xEE));
    auto v = make_values(j, 0, S, 0, 0, WireInt::kU8, {1, 2});
    auto ver = v;
    ver[4] = 0;
    frame(&s, 3, 1, ver);
    frame(&s, 3, 1, std::vector<uint8_t>(v.begin(), v.begin() + 60));
    frame(&s, 0, 1, v);
    frame(&s, 1, 1, make_values(j, 1, S, 0, 0, WireInt::kU8, {3, 4}));
    frame(&s, 0, 1, make_values(j, 0, S, 9, 0, WireInt::kU8, {3, 4}));  // skipped ahead
    put("engine", "isolation", s);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTDIR\n", argv[0]);
    return 2;
  }
  g_dir = argv[1];
  ::mkdir(g_dir.c_str(), 0755);
  packets();
  engine_sessions();
  std::printf("wrote %d corpus files under %s\n", g_written, g_dir.c_str());
  return 0;
}
