// transport/group_link.h over the in-process link: a subset of the ranks as a link of its own
// (THC_HIER's slice groups on UCX), beside a forwarding link of all the ranks.
#include "transport/group_link.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "transport/inproc/inproc.h"
#include "transport/schedules/schedules.h"

namespace thc::transport {
namespace {

// Ranks 1 and 3 of 4 as a group, ranks 0 and 2 as another, each group's MAX its own; then a MAX of
// all four through forwarding links, and integer sums over the groups' schedules.
TEST(GroupLink, SubsetsReduceAmongThemselvesBesideTheWholeGroup) {
  auto g = make_inproc_group(4, 20000);
  std::vector<std::vector<uint32_t>> gmax(4), all(4);
  std::vector<std::vector<int32_t>> sums(4);
  std::vector<std::thread> ts;
  for (int r = 0; r < 4; ++r) {
    ts.emplace_back([&, r] {
      std::shared_ptr<Link> parent = make_inproc_link(g, r);
      const std::vector<int> members = r % 2 ? std::vector<int>{3, 1} : std::vector<int>{0, 2};
      auto group = make_group_link(parent, members);
      auto fwd = make_forward_link(parent);
      EXPECT_EQ(group->size(), 2);
      EXPECT_EQ(members[static_cast<size_t>(group->rank())], r);
      EXPECT_LT(group->tag_limit(), parent->tag_limit());
      std::vector<uint32_t> w = {static_cast<uint32_t>(10 * r), static_cast<uint32_t>(100 - r), 7};
      group->max_u32(w.data(), w.size());
      gmax[static_cast<size_t>(r)] = w;
      std::vector<uint32_t> v = {static_cast<uint32_t>(r), 5};
      fwd->max_u32(v.data(), v.size());
      all[static_cast<size_t>(r)] = v;
      auto red = make_scheduled_reducer(std::move(group));
      std::vector<int32_t> x(1000);
      for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<int32_t>(i) * (r + 1);
      red->start_sum(x.data(), x.size(), IntType::kI32)->wait();
      sums[static_cast<size_t>(r)] = x;
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(gmax[1], (std::vector<uint32_t>{30, 99, 7}));
  EXPECT_EQ(gmax[3], gmax[1]);
  EXPECT_EQ(gmax[0], (std::vector<uint32_t>{20, 100, 7}));
  EXPECT_EQ(gmax[2], gmax[0]);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(all[static_cast<size_t>(r)], (std::vector<uint32_t>{3, 5}));
  for (size_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(sums[1][i], static_cast<int32_t>(i) * 6);  // ranks 1 and 3: (2 + 4) i
    EXPECT_EQ(sums[0][i], static_cast<int32_t>(i) * 4);  // ranks 0 and 2: (1 + 3) i
  }
}

// A member that never takes part: the others' MAX fails within the timeout, naming it.
TEST(GroupLink, AMissingMemberIsNamedAtTheTimeout) {
  auto g = make_inproc_group(3, 300);
  std::vector<std::string> why(3);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r) {
    ts.emplace_back([&, r] {
      std::shared_ptr<Link> parent = make_inproc_link(g, r);
      auto group = make_group_link(parent, {0, 1, 2});
      uint32_t w = 1;
      try {
        group->max_u32(&w, 1);
        ADD_FAILURE() << "rank " << r << ": the MAX completed without rank 2";
      } catch (const Error& e) {
        EXPECT_EQ(e.status(), Status::kTimeout) << e.what();
        why[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_NE(why[0].find("rank(s) 2"), std::string::npos) << why[0];
  EXPECT_NE(why[1].find("rank(s) 0"), std::string::npos) << why[1];  // rank 1 waits on member 0
}

TEST(GroupLink, MembersMustBeDistinctAndIncludeThisRank) {
  auto g = make_inproc_group(3, 1000);
  std::shared_ptr<Link> parent = make_inproc_link(g, 0);
  EXPECT_THROW(make_group_link(parent, {1, 2}), Error);
  EXPECT_THROW(make_group_link(parent, {0, 0}), Error);
  EXPECT_THROW(make_group_link(parent, {0, 3}), Error);
}

}  // namespace
}  // namespace thc::transport
