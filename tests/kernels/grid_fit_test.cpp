// Packing's grid fit (decoding/kernels/grid_fit.h) as one build compiled it, without torch: on
// tests/engine/test_integer_kernels.py's grid_fit_inputs(), number for number, its scales, lows and
// codes must give GRID_FIT_DIGEST there. tests/kernels/test_row_ops_core.py builds it with this
// machine's compiler for each instruction set this CPU runs and the plain C++ one (`make
// test-toolchains`: GCC 11 and clang), `make test-arm` for aarch64 under qemu. A build that fuses
// multiply-adds of its own accord fails (clang's with -ffp-contract=fast does; the kernels build
// with -ffp-contract=off, and grid_fit.h refuses -ffast-math).
#include "grid_fit.h"

#include <cstdio>
#include <vector>

#include "xorshift.h"

namespace {

float uniform(int lo, int hi) { return static_cast<float>(draftwise_test::uniform(lo, hi)); }

void push_noise(std::vector<float>& out, int groups) {
  for (int i = 0; i < groups * 32; ++i) out.push_back(uniform(-3000, 3000) / 65536.0f);
}

uint64_t fnv1a(const unsigned char* bytes, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; ++i) h = (h ^ bytes[i]) * 0x100000001B3ull;
  return h;
}

}  // namespace

int main() {
  std::vector<float> in;
  push_noise(in, 40);
  for (int g = 0; g < 20; ++g) {  // Q4_K-like: levels 2..13 of a grid
    const float step = uniform(1, 300) / 65536.0f, low = uniform(-3000, 0) / 65536.0f;
    for (int e = 0; e < 32; ++e) in.push_back(uniform(2, 13) * step + low);
  }
  for (int e = 0; e < 32; ++e) in.push_back(0.0f);                               // a zero scale
  for (int e = 0; e < 32; ++e) in.push_back(0.25f);                              // all equal
  for (int e = 0; e < 32; ++e) in.push_back(uniform(-1000, 1000) / 16777216.0f);  // fp16-subnormal grid
  for (int e = 0; e < 32; ++e) in.push_back(uniform(-100000, 100000));            // a low past fp16's range
  push_noise(in, 5);  // a short last block
  // 20,000 groups of full-precision values: near-ties that a fused multiply-add flips (clang's build
  // with -ffp-contract=fast fails here: tests/kernels/test_row_ops_core.py), and blocks for threads
  for (int i = 0; i < 20000 * 32; ++i) in.push_back(uniform(-8388607, 8388607) / 536870912.0f);
  const int64_t groups = static_cast<int64_t>(in.size() / 32);
  std::vector<float> scale(groups), low(groups), codes(groups * 32);
  std::vector<uint8_t> raw(groups * 32);
  draftwise_fit::fit_groups(in.data(), 32, 4, 0, groups, scale.data(), low.data(), raw.data());
  for (size_t i = 0; i < raw.size(); ++i) codes[i] = raw[i];  // the Python test hashes them as floats
  uint64_t h = 0xCBF29CE484222325ull;
  h = fnv1a(reinterpret_cast<const unsigned char*>(scale.data()), scale.size() * 4, h);
  h = fnv1a(reinterpret_cast<const unsigned char*>(low.data()), low.size() * 4, h);
  h = fnv1a(reinterpret_cast<const unsigned char*>(codes.data()), codes.size() * 4, h);
  const uint64_t want = 0x76D2C79E4F794763ull;  // GRID_FIT_DIGEST
  const int failures = h == want ? 0 : 1;
  if (failures) std::printf("FAIL grid fit digest %016llx, not %016llx\n", static_cast<unsigned long long>(h),
                            static_cast<unsigned long long>(want));
  std::printf("grid fit: %d of 1 checks failed\n", failures);
  return failures;
}
