// The per-request random number generator for sampling: xoshiro256** (Blackman & Vigna, 2018)
// seeded through splitmix64. Implemented here, not with std distributions, so that one seed
// gives the same tokens on every platform and standard library.
#pragma once

#include <array>
#include <cstdint>

namespace arbor {

class Rng {
 public:
  explicit Rng(uint64_t seed);

  uint64_t next_u64();
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  // A seed from std::random_device, for requests that gave none.
  static uint64_t random_seed();

 private:
  std::array<uint64_t, 4> state_;  // never all zero (splitmix64 seeding guarantees it)
};

}  // namespace arbor
