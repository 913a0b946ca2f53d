// The engine: one compressed allreduce = prelude exchange, then a pipeline of chunks (whole
// blocks) where encoding chunk k+1 overlaps the aggregation of chunk k, then decode.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "collectives/codec/codec.h"
#include "collectives/engine/dtype.h"
#include "thc/thc.h"
#include "transport/reducer.h"

namespace thc::engine {

// Error-feedback state of one tensor (THC Algorithm 3): x = grad + e; e <- x - own contribution.
struct ErrorFeedback {
  std::vector<float> residual;
  uint64_t count = 0;  // bound on first use
  void reset() {
    residual.clear();
    count = 0;
  }
};

enum class Algo { kInt, kPs };

struct EngineStats {
  uint64_t calls = 0;
  uint64_t elements = 0;
  uint64_t wire_bytes_up = 0;
  uint64_t wire_bytes_down = 0;
  uint64_t float_bytes = 0;
  Algo last_algo = Algo::kInt;
};

class Engine {
 public:
  // Collective: agrees on the shared seed with all ranks of the reducer.
  Engine(std::unique_ptr<transport::Reducer> reducer, const thc_config_t& cfg);

  int rank() const { return reducer_->rank(); }
  int size() const { return reducer_->size(); }
  transport::Reducer& reducer() { return *reducer_; }
  const thc_config_t& config() const { return cfg_; }
  uint64_t seed() const { return seed_; }

  // send may equal recv (in place). mean selects AVG over SUM. ef may be null.
  void allreduce(codec::Scheme scheme, const void* send, void* recv, uint64_t count, DType dtype,
                 bool mean, ErrorFeedback* ef);

  const codec::Codec& codec_for(codec::Scheme scheme);
  codec::Params params_for(codec::Scheme scheme) const;
  Algo choose_algo(const codec::Codec& c) const;
  const EngineStats& stats() const { return stats_; }

 private:
  std::unique_ptr<transport::Reducer> reducer_;
  thc_config_t cfg_;
  uint64_t seed_ = 0;
  uint32_t round_ = 0;
  std::map<int, std::unique_ptr<codec::Codec>> codecs_;
  EngineStats stats_;
};

}  // namespace thc::engine
