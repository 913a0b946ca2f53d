// Replays the fuzzers' regression corpus (switch_offload/fuzz/corpus) through the same entry
// points the libFuzzer targets use, in the ordinary build: a crash or a violated invariant found
// once by fuzzing stays fixed.
#include <gtest/gtest.h>

#include <dirent.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "switch_offload/fuzz/harness.h"

#ifndef THC_SWITCH_CORPUS_DIR
#error "THC_SWITCH_CORPUS_DIR must name switch_offload/fuzz/corpus"
#endif

namespace {

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') out.push_back(dir + "/" + e->d_name);
    closedir(d);
  }
  return out;
}

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

TEST(SwitchFuzzCorpus, PacketParser) {
  const auto files = files_in(std::string(THC_SWITCH_CORPUS_DIR) + "/packet");
  ASSERT_GE(files.size(), 10u) << "corpus missing";
  for (const auto& f : files) {
    SCOPED_TRACE(f);
    const auto b = read_all(f);
    EXPECT_EQ(thc::switch_offload::fuzz::packet_one(b.data(), b.size()), 0);
    // Every packet is also a (one-record-garbled) engine input.
    EXPECT_EQ(thc::switch_offload::fuzz::engine_one(b.data(), b.size()), 0);
  }
}

TEST(SwitchFuzzCorpus, EngineSessions) {
  const auto files = files_in(std::string(THC_SWITCH_CORPUS_DIR) + "/engine");
  ASSERT_GE(files.size(), 3u) << "corpus missing";
  for (const auto& f : files) {
    SCOPED_TRACE(f);
    const auto b = read_all(f);
    EXPECT_EQ(thc::switch_offload::fuzz::engine_one(b.data(), b.size()), 0);
  }
}

TEST(SwitchFuzzCorpus, FramedPacketsAsEngineInput) {
  // Each packet of the packet corpus, framed as a session, from all four peers.
  for (const auto& f : files_in(std::string(THC_SWITCH_CORPUS_DIR) + "/packet")) {
    const auto p = read_all(f);
    std::vector<uint8_t> s;
    for (int peer = 0; peer < 4; ++peer) thc::switch_offload::fuzz::frame(&s, peer, 1, p, peer == 3);
    EXPECT_EQ(thc::switch_offload::fuzz::engine_one(s.data(), s.size()), 0) << f;
  }
}

}  // namespace
