#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>

#include "collectives/engine/knobs.h"
#include "thc/thc.h"

namespace thc::engine {
namespace {

TEST(Knobs, EveryKnobHasDefaultHelpAndUniqueName) {
  std::set<std::string> names;
  for (const Knob& k : knobs()) {
    EXPECT_TRUE(names.insert(k.env).second) << k.env;
    EXPECT_EQ(std::string(k.env).rfind("THC_", 0), 0u);
    EXPECT_GT(std::string(k.help).size(), 5u);
  }
}

TEST(Knobs, DefaultsAndEnvironment) {
  thc_config_t c;
  ASSERT_EQ(thc_config_init(&c), THC_SUCCESS);
  EXPECT_EQ(c.bits, 4);
  EXPECT_EQ(c.granularity, 30);
  EXPECT_DOUBLE_EQ(c.p, 1.0 / 32);
  EXPECT_EQ(c.algo, THC_ALGO_AUTO);
  EXPECT_EQ(c.threads, 1);  // safe when ranks share the cores
  setenv("THC_P", "1/64", 1);
  setenv("THC_ALGO", "ps", 1);
  setenv("THC_DNAT_NORM", "inf", 1);
  ASSERT_EQ(thc_config_init(&c), THC_SUCCESS);
  EXPECT_DOUBLE_EQ(c.p, 1.0 / 64);
  EXPECT_EQ(c.algo, THC_ALGO_PS);
  EXPECT_EQ(c.dnat_norm, 0);
  setenv("THC_ALGO", "ring", 1);
  EXPECT_EQ(thc_config_init(&c), THC_ERR_INVALID_ARG);
  EXPECT_NE(std::string(thc_last_error()).find("THC_ALGO"), std::string::npos);
  setenv("THC_ALGO", "auto", 1);
  setenv("THC_BITS", "4x", 1);
  EXPECT_EQ(thc_config_init(&c), THC_ERR_INVALID_ARG);
  unsetenv("THC_BITS");
  unsetenv("THC_P");
  unsetenv("THC_ALGO");
  unsetenv("THC_DNAT_NORM");
}

TEST(Knobs, SetAndGetByName) {
  thc_config_t c;
  ASSERT_EQ(thc_config_init(&c), THC_SUCCESS);
  ASSERT_EQ(thc_config_set(&c, "THC_BITS", "2"), THC_SUCCESS);
  ASSERT_EQ(thc_config_set(&c, "THC_P", "1/64"), THC_SUCCESS);
  ASSERT_EQ(thc_config_set(&c, "THC_ALGO", "ps"), THC_SUCCESS);
  EXPECT_EQ(c.bits, 2);
  EXPECT_DOUBLE_EQ(c.p, 1.0 / 64);
  EXPECT_EQ(c.algo, THC_ALGO_PS);
  char buf[64];
  ASSERT_EQ(thc_config_get(&c, "THC_ALGO", buf, sizeof buf), THC_SUCCESS);
  EXPECT_STREQ(buf, "ps");
  ASSERT_EQ(thc_config_get(&c, "THC_BITS", buf, sizeof buf), THC_SUCCESS);
  EXPECT_STREQ(buf, "2");
  // Too small a buffer, unknown names and malformed values are refused; cfg stays as it was.
  EXPECT_EQ(thc_config_get(&c, "THC_BITS", buf, 1), THC_ERR_INVALID_ARG);
  EXPECT_EQ(thc_config_set(&c, "THC_NO_SUCH_KNOB", "1"), THC_ERR_INVALID_ARG);
  EXPECT_NE(std::string(thc_last_error()).find("THC_NO_SUCH_KNOB"), std::string::npos);
  EXPECT_EQ(thc_config_set(&c, "THC_BITS", "2x"), THC_ERR_INVALID_ARG);
  EXPECT_EQ(thc_config_set(&c, "THC_ALGO", "ring"), THC_ERR_INVALID_ARG);
  EXPECT_EQ(c.bits, 2);
  EXPECT_EQ(c.algo, THC_ALGO_PS);
  // The enumeration names every knob of the table once, then NULL.
  size_t n = 0;
  while (thc_knob_name(static_cast<int>(n))) ++n;
  EXPECT_EQ(n, knobs().size());
  EXPECT_STREQ(thc_knob_name(0), knobs()[0].env);
  EXPECT_EQ(thc_knob_name(-1), nullptr);
}

}  // namespace
}  // namespace thc::engine
