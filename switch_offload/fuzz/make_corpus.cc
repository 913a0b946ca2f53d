// Writes the seed corpus of both fuzzers: valid and malformed packets (corpus/packet) and short
// aggregator sessions (corpus/engine). The files in switch_offload/fuzz/corpus were produced by
//   thc_switch_make_corpus switch_offload/fuzz/corpus
// and are replayed by switch_fuzz_corpus_test in the normal and the sanitizer builds. Sessions
// are written unsigned with the harness's "authenticate" bit, so the harness signs them (and adds
// cookies) the way a cooperating worker would; a few records stay unsigned on purpose.
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

// The fuzzed engine offers max_lanes 512 in a 1024-byte budget (harness.cc): these are the lanes
// of each encoding there.
constexpr uint16_t kL8 = 512;    // u8 sums (index b<=8, value u8)
constexpr uint16_t kL16 = 512;   // u16/i16 (2 bytes a lane)
constexpr uint16_t kL32 = 256;   // u32/i32 and MAX

void packets() {
  JobId j = JobId::make(fuzz::fuzz_key(1), 7, 4);
  j.with_seed(0x1122334455667788ull);
  TableSpec t = thc_table(0);
  JoinParams jp;
  jp.quorum = 4;
  jp.slots = 16;
  jp.quorum_timeout_us = 1000;
  put("packet", "join_plain", make_join(j, 0, jp));
  jp.quorum = 3;
  jp.table = &t;
  put("packet", "join_table", make_join(j, 1, jp));
  put("packet", "table", make_table(j, 2, thc_table(1)));
  put("packet", "leave", make_leave(j, 3));
  put("packet", "stats", make_packet(control_header(MsgType::kStats, j, 0, 9), std::vector<uint8_t>(kStatsRequestBytes, 0), nullptr));
  put("packet", "value_u8", make_values(j, 0, 16, 0, 0, WireInt::kU8, std::vector<uint32_t>(256, 3)));
  put("packet", "value_u8_resend",
      as_resend(make_values(j, 0, 16, 0, 0, WireInt::kU8, std::vector<uint32_t>(256, 3)), 2, j));
  put("packet", "value_i16_partial", make_values(j, 1, 16, 17, 2, WireInt::kI16, std::vector<uint32_t>(100, 0xFFFF)));
  put("packet", "value_u32", make_values(j, 2, 16, 5, 1, WireInt::kU32, std::vector<uint32_t>(256, 0x01020304)));
  put("packet", "max_u32", make_values(j, 3, 16, 1, 0, WireInt::kU32, std::vector<uint32_t>(7, 99), MsgType::kDataMax));
  put("packet", "index_b4", make_indices(j, 0, 16, 3, 1, WireInt::kU8, 4, 0, codes(256, 4, 1)));
  put("packet", "index_b4_1024", make_indices(j, 0, 16, 3, 1, WireInt::kU8, 4, 0, codes(1000, 4, 1), 1024));
  put("packet", "index_b3_odd", make_indices(j, 1, 16, 4, 1, WireInt::kU16, 3, 2, codes(77, 3, 2)));
  put("packet", "index_b8", make_indices(j, 2, 16, 6, 1, WireInt::kI32, 8, 3, codes(256, 8, 3)));
  {
    Header h = data_header(MsgType::kResult, j, 1, 16, 3, 1, WireInt::kU8, 256, 256);
    h.contributors = 3;
    h.bitmap = 0b1011;
    h.flags = kFlagPartial | kFlagNotCounted;
    put("packet", "result_partial", make_packet(h, std::vector<uint8_t>(256, 45), &j.dkey));
    Header a = data_header(MsgType::kAck, j, 2, 16, 3, 1, WireInt::kNone, 0, 0);
    a.flags = kFlagNotCounted;
    put("packet", "ack_not_counted", make_packet(a, {}, &j.dkey));
    Header e = control_header(MsgType::kError, j, 1, 5);
    e.aux = static_cast<uint32_t>(ErrorCode::kLeftBehind);
    put("packet", "error_left_behind", make_packet(e, {}, &j.dkey));
    JoinAckBody ab;
    ab.seed = 0x1122334455667788ull;
    ab.slots = 16;
    ab.max_lanes = 1024;
    ab.payload_budget = kPayloadBudget1500;
    ab.nworkers = 4;
    ab.quorum = 3;
    ab.shards = 2;
    ab.quorum_timeout_us = 1000;
    ab.resume_flags = kResumeKnown;
    std::vector<uint8_t> body(kJoinAckBytes);
    write_join_ack(ab, body.data(), body.size());
    put("packet", "join_ack", make_packet(control_header(MsgType::kJoinAck, j, 0, 1), body, &j.jkey));
    put("packet", "challenge", make_packet(control_header(MsgType::kChallenge, j, 0, 1), std::vector<uint8_t>(16, 7), &j.jkey));
    Header s = control_header(MsgType::kStatsReply, j, 0, 9);
    s.aux = 2;
    put("packet", "stats_reply", make_packet(s, std::vector<uint8_t>(16, 1), nullptr));
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
    x[4] = 1;
    put("packet", "bad_version", x);
    x = v;
    x[5] = 99;
    put("packet", "bad_type", x);
    x = v;
    x[16] = 0;
    x[17] = 9;  // worker 9 of 4
    put("packet", "bad_worker", x);
    x = v;
    x[26] = 0x01;
    x[27] = 0x2C;  // count 300 > lanes 256
    put("packet", "bad_count", x);
    x = v;
    x[22] = 0;
    x[23] = 100;  // lanes not a multiple of 64
    put("packet", "bad_lanes", x);
    x = v;
    x[24] = 9;  // encoding
    put("packet", "bad_encoding", x);
    put("packet", "bad_huge", std::vector<uint8_t>(9100, 0x41));
    put("packet", "empty", {});
  }
}

// JOIN twice per worker: the first draws the CHALLENGE whose cookie the harness puts into the
// second. A worker's control nonces grow over its lives (the aggregator acts on a nonce once).
void join(std::vector<uint8_t>* s, int peer, const JobId& j, uint16_t w, const JoinParams& p, uint64_t nonce = 1) {
  frame(s, peer, 0, make_join(j, w, p, nonce));
  frame(s, peer, 0, make_join(j, w, p, nonce + 1));
}

void engine_sessions() {
  const JobId j = JobId::make(fuzz::fuzz_key(1), 3, 2);  // unsigned: the harness signs
  const uint32_t S = 4;
  TableSpec t = thc_table(0);
  JoinParams p;
  p.quorum = 2;
  p.slots = S;
  p.quorum_timeout_us = 0;
  p.max_lanes = 512;
  p.payload_budget = 1024;
  {
    // Two workers, a table, index sums over more packets than slots, a duplicate, a
    // retransmission after completion, then leave.
    std::vector<uint8_t> s;
    JoinParams pt = p;
    pt.table = &t;
    join(&s, 0, j, 0, pt);
    join(&s, 1, j, 1, p);
    for (uint64_t seq = 0; seq < 12; ++seq) {
      const uint32_t op = static_cast<uint32_t>(seq / 3);
      frame(&s, 0, 1, make_indices(j, 0, S, seq, op, WireInt::kU8, 4, 0, codes(512, 4, static_cast<int>(seq)), kL8));
      if (seq == 2) frame(&s, 0, 0, make_indices(j, 0, S, seq, 0, WireInt::kU8, 4, 0, codes(512, 4, 2), kL8));
      frame(&s, 1, 1, make_indices(j, 1, S, seq, op, WireInt::kU8, 4, 0, codes(512, 4, 5), kL8));
      if (seq == 4) frame(&s, 1, 0, make_indices(j, 1, S, seq, 1, WireInt::kU8, 4, 0, codes(512, 4, 5), kL8));
    }
    frame(&s, 0, 1, make_leave(j, 0, 10));
    frame(&s, 1, 1, make_leave(j, 1, 10));
    put("engine", "index_two_workers", s);
  }
  {
    // Quorum 2 of 3 with a 1 ms timeout: worker 2 is late and told it was not counted; a value
    // sum and a max; then worker 2 falls behind for good (slot reuse) and rejoins.
    const JobId k = JobId::make(fuzz::fuzz_key(1), 4, 3);
    JoinParams q = p;
    q.quorum_timeout_us = 1000;
    std::vector<uint8_t> s;
    for (uint16_t w = 0; w < 3; ++w) join(&s, w, k, w, q);
    frame(&s, 0, 1, make_values(k, 0, S, 0, 0, WireInt::kU32, {1, 2, 3}, MsgType::kDataMax, kL32));
    frame(&s, 1, 1, make_values(k, 1, S, 0, 0, WireInt::kU32, {3, 2, 1}, MsgType::kDataMax, kL32));
    frame(&s, 0, 20, make_values(k, 0, S, 1, 1, WireInt::kI16, std::vector<uint32_t>(256, 0xFFFE), MsgType::kDataValue, kL16), true);
    frame(&s, 1, 1, make_values(k, 1, S, 1, 1, WireInt::kI16, std::vector<uint32_t>(256, 5), MsgType::kDataValue, kL16));
    frame(&s, 2, 20, make_values(k, 2, S, 1, 1, WireInt::kI16, std::vector<uint32_t>(256, 7), MsgType::kDataValue, kL16), true);
    frame(&s, 2, 1, make_values(k, 2, S, 0, 0, WireInt::kU32, {9, 9, 9}, MsgType::kDataMax, kL32));
    for (uint64_t seq = 2; seq < 14; ++seq)
      for (uint16_t w = 0; w < 2; ++w)
        frame(&s, w, 1, make_values(k, w, S, seq, static_cast<uint32_t>(seq), WireInt::kU8, {1, 2}, MsgType::kDataValue, kL8));
    frame(&s, 2, 1, make_values(k, 2, S, 2, 2, WireInt::kU8, {1, 2}, MsgType::kDataValue, kL8));  // left behind
    JoinParams r = q;
    r.flags = kJoinRejoin;
    join(&s, 2, k, 2, r, 3);
    frame(&s, 2, 1, make_join(k, 2, r, 4));  // the same REJOIN again: a repeat, answered, not applied
    put("engine", "partial_quorum", s);
  }
  {
    // Isolation: garbage, unsigned and wrongly keyed packets, wrong version and a truncated
    // packet around a job; a STATS from a remote peer (denied) and from loopback.
    std::vector<uint8_t> s;
    join(&s, 0, j, 0, p);
    join(&s, 1, j, 1, p);
    JobId bad = JobId::make(fuzz::fuzz_key(2), 3, 2);  // a key the engine does not hold
    frame(&s, 2, 1, make_join(bad, 0, p), false, true);
    frame(&s, 2, 1, make_values(j, 0, S, 0, 0, WireInt::kU8, {1, 1}, MsgType::kDataValue, kL8), false, false);
    frame(&s, 3, 1, std::vector<uint8_t>(100, 0xEE));
    auto v = make_values(j, 0, S, 0, 0, WireInt::kU8, {1, 2}, MsgType::kDataValue, kL8);
    auto ver = v;
    ver[4] = 1;
    frame(&s, 3, 1, ver);
    frame(&s, 3, 1, std::vector<uint8_t>(v.begin(), v.begin() + 60));
    frame(&s, 0, 1, v);
    frame(&s, 1, 1, make_values(j, 1, S, 0, 0, WireInt::kU8, {3, 4}, MsgType::kDataValue, kL8));
    frame(&s, 0, 1, make_values(j, 0, S, 9, 0, WireInt::kU8, {3, 4}, MsgType::kDataValue, kL8));  // skipped ahead
    frame(&s, 0, 1, make_values(j, 0, S, 1, 1, WireInt::kU8, {3, 4}, MsgType::kDataValue, 256));   // wrong lanes
    frame(&s, 1, 1, make_packet(control_header(MsgType::kStats, j, 0, 9), std::vector<uint8_t>(kStatsRequestBytes, 0), nullptr));
    frame(&s, 3, 1, make_packet(control_header(MsgType::kStats, j, 0, 9), std::vector<uint8_t>(kStatsRequestBytes, 0), nullptr));
    put("engine", "isolation", s);
  }
  {
    // Regression (issue 07): a job freed by LEAVE while slots were open, then the same id joined
    // again with fewer slots, then ticks. Version 1 kept the freed job's open slots in an
    // engine-wide list and read past the new job's shadows in tick(); open slots belong to their
    // job now.
    std::vector<uint8_t> s;
    const JobId q = JobId::make(fuzz::fuzz_key(1), 9, 2);
    JoinParams big = p;
    big.slots = 8;
    big.quorum = 1;
    big.quorum_timeout_us = 100;
    join(&s, 0, q, 0, big);
    join(&s, 1, q, 1, big);
    for (uint64_t seq = 0; seq < 8; ++seq)
      frame(&s, 0, 0, make_values(q, 0, 8, seq, static_cast<uint32_t>(seq), WireInt::kU8, {1}, MsgType::kDataValue, kL8));
    frame(&s, 0, 0, make_leave(q, 0, 10));
    frame(&s, 1, 0, make_leave(q, 1, 10));
    JoinParams small = big;
    small.slots = 1;
    frame(&s, 0, 0, make_join(q, 0, big, 2));  // the first life's JOIN replayed: no job, no answer
    join(&s, 0, q, 0, small, 20);
    join(&s, 1, q, 1, small, 20);
    frame(&s, 0, 50, make_values(q, 0, 1, 0, 0, WireInt::kU8, {1}, MsgType::kDataValue, kL8), true);
    frame(&s, 1, 50, make_values(q, 1, 1, 0, 0, WireInt::kU8, {1}, MsgType::kDataValue, kL8), true);
    put("engine", "regress_free_rejoin_fewer_slots", s);
  }
  {
    // Restart (issue 19): both workers of a running job crash and start again with fresh JOINs
    // (newer nonces): the first is refused as busy (and asks again), the second replaces the dead
    // instance with a new incarnation; repeats and old JOINs, TABLEs and LEAVEs draw nothing new.
    std::vector<uint8_t> s;
    const JobId q = JobId::make(fuzz::fuzz_key(1), 11, 2);
    join(&s, 0, q, 0, p);
    join(&s, 1, q, 1, p);
    frame(&s, 0, 1, make_table(q, 0, thc_table(1), 3));
    for (uint64_t seq = 0; seq < 6; ++seq)
      for (uint16_t w = 0; w < 2; ++w)
        frame(&s, w, 1, make_values(q, w, S, seq, static_cast<uint32_t>(seq), WireInt::kU8, {1}, MsgType::kDataValue, kL8));
    frame(&s, 0, 1, make_table(q, 0, thc_table(1), 3));  // a repeat: acknowledged again only
    frame(&s, 0, 1, make_table(q, 0, thc_table(2), 2));  // older: a replay
    join(&s, 0, q, 0, p, 100);                            // worker 0 restarted: busy
    frame(&s, 0, 1, make_join(q, 0, p, 101));             // a repeat of the busy JOIN
    join(&s, 1, q, 1, p, 100);                            // worker 1 too: replaced
    join(&s, 0, q, 0, p, 102);                            // worker 0 asks again: joins
    frame(&s, 1, 1, make_join(q, 1, p, 2));               // the first life's JOIN: a replay
    for (uint64_t seq = 0; seq < 2; ++seq)
      for (uint16_t w = 0; w < 2; ++w)
        frame(&s, w, 1, make_values(q, w, S, seq, static_cast<uint32_t>(seq), WireInt::kU8, {2}, MsgType::kDataValue, kL8));
    frame(&s, 0, 1, make_leave(q, 0, 200));
    frame(&s, 1, 1, make_leave(q, 1, 200));
    frame(&s, 1, 1, make_join(q, 1, p, 101));             // after the end: no job is re-created
    put("engine", "restart_replace", s);
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
