// The one table of configuration knobs: each declared once with its environment variable,
// default and help. thc_config_init, thc-info and the README's knob list all come from it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "collectives/codec/codec.h"
#include "thc/thc.h"

namespace thc::engine {

enum class KnobKind { kInt, kLong, kDouble, kU64, kEnum, kString };

struct Knob {
  const char* env;
  KnobKind kind;
  size_t offset;          // into thc_config_t
  const char* def;        // default, as the environment would spell it
  const char* choices;    // kEnum: "name=value|name=value"
  const char* help;
  size_t capacity = 0;    // kString: bytes of the char array (value + NUL)
};

const std::vector<Knob>& knobs();
// Parse one value into cfg; false (with *err) if malformed.
bool set_knob(const Knob& k, const char* value, thc_config_t* cfg, std::string* err);
std::string knob_value(const Knob& k, const thc_config_t& cfg);
// Defaults then environment. Throws thc::Error(kInvalidArgument) on a malformed variable.
void config_from_env(thc_config_t* cfg);

// log2 of v when v is a power of two, else -1.
int log2_exact(long v);
// The codec parameters a configuration selects for a scheme (shared by the engine and the
// NCCL-like API, so both build the same codec from the same thc_config_t).
codec::Params codec_params(const thc_config_t& cfg, codec::Scheme scheme);

}  // namespace thc::engine
