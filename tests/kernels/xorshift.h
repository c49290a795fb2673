// The kernels' C++ tests' inputs: xorshift, number for number tests/engine/test_integer_kernels.py's
// Xorshift, so the same integers (and the exact floats made from them) on every machine.
#pragma once
#include <cstdint>

namespace draftwise_test {

inline uint64_t state = 88172645463325252ull;

inline uint32_t next() {
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return static_cast<uint32_t>(state);
}

inline int uniform(int lo, int hi) { return lo + static_cast<int>(next() % static_cast<uint32_t>(hi - lo + 1)); }

}  // namespace draftwise_test
