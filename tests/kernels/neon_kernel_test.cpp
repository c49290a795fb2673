// The ARM kernel's core (decoding/kernels/neon_core.h) against a plain reference of the same
// arithmetic -- exact integer sums, the x86 kernels' float epilogue -- bit for bit, at every row
// count 1..17 and for inputs whose size is and is not a multiple of the vector widths; and on the
// inputs of tests/engine/test_integer_kernels.py's cross-ISA test, against the digests the x86 kernels give.
// Built with an aarch64 cross compiler and run under qemu (`make test-arm`): no ARM machine here.
#include "neon_core.h"

#include <cstdio>
#include <cstring>
#include <vector>

#include "xorshift.h"

namespace {

using draftwise_test::uniform;

float half_to_float(uint16_t bits) {
  __fp16 h;
  std::memcpy(&h, &bits, 2);
  return static_cast<float>(h);
}

uint16_t float_to_half(float f) {
  __fp16 h = static_cast<__fp16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

// The rule every kernel quantizes a row by, written out again.
void reference_quantize(const float* r, int k, std::vector<int8_t>& q, float& scale) {
  float amax = 0.0f;
  for (int i = 0; i < k; ++i) amax = std::max(amax, std::fabs(r[i]));
  scale = std::max(amax / 127.0f, 1e-12f);
  q.resize(k);
  for (int i = 0; i < k; ++i) q[i] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, std::nearbyint(r[i] / scale))));
}

std::vector<float> activations(int rows, int k) {
  std::vector<float> x(static_cast<size_t>(rows) * k);
  for (int r = 0; r < rows; ++r) {
    const float magnitude = static_cast<float>(uniform(1, 4000)) / 64.0f;
    for (int i = 0; i < k; ++i) x[r * k + i] = magnitude * static_cast<float>(uniform(-1000, 1000)) / 1000.0f;
  }
  if (rows > 3) std::fill(x.begin() + 3 * k, x.begin() + 4 * k, 0.0f);  // a zero row: the scale's floor
  return x;
}

int failures = 0, checks = 0;

void expect_same(const float* got, const float* want, int n, const char* what, int rows, int k) {
  ++checks;
  if (std::memcmp(got, want, sizeof(float) * n) != 0) {
    ++failures;
    for (int i = 0; i < n; ++i)
      if (std::memcmp(got + i, want + i, sizeof(float)) != 0) {
        std::printf("FAIL %s rows=%d k=%d: output %d is %.9g, the reference %.9g\n", what, rows, k, i, got[i], want[i]);
        break;
      }
  }
}

void check_q8(int n, int k) {
  std::vector<int8_t> weights(static_cast<size_t>(n) * k), packed(static_cast<size_t>(n) * k);
  std::vector<float> wscale(n);
  for (auto& w : weights) w = static_cast<int8_t>(uniform(-127, 127));
  for (auto& s : wscale) s = static_cast<float>(uniform(1, 1000)) / 4096.0f;
  for (int b = 0; b < n / 16; ++b)  // integer_linear.py's pack_int8: [N/16][K/4][16 lanes x 4 bytes]
    for (int s = 0; s < k / 4; ++s)
      for (int j = 0; j < 16; ++j)
        for (int t = 0; t < 4; ++t) packed[(static_cast<size_t>(b) * (k / 4) + s) * 64 + j * 4 + t] = weights[(16 * b + j) * k + 4 * s + t];
  for (int rows = 1; rows <= 17; ++rows) {
    const auto x = activations(rows, k);
    std::vector<float> got(static_cast<size_t>(rows) * n), want(got.size());
    for (int r = 0; r < rows; ++r) {
      std::vector<int8_t> q(k), rq;
      float xs, rs;
      draftwise_neon::quantize_row(&x[r * k], k, q.data(), &xs);
      reference_quantize(&x[r * k], k, rq, rs);
      ++checks;
      if (q != rq || xs != rs) { ++failures; std::printf("FAIL quantize rows=%d k=%d\n", rows, k); }
      for (int b = 0; b < n / 16; ++b) draftwise_neon::q8_block_row(&packed[static_cast<size_t>(b) * k * 16], q.data(), xs, &wscale[b * 16], k, &got[r * n + b * 16]);
      for (int j = 0; j < n; ++j) {
        int32_t sum = 0;
        for (int i = 0; i < k; ++i) sum += static_cast<int32_t>(rq[i]) * weights[j * k + i];
        want[r * n + j] = (static_cast<float>(sum) * rs) * wscale[j];
      }
    }
    expect_same(got.data(), want.data(), rows * n, "q8", rows, k);
  }
}

void check_q4(int n, int k, int group) {
  const int groups = k / group;
  std::vector<uint8_t> codes(static_cast<size_t>(n) * k), packed(static_cast<size_t>(n) * k / 2);
  std::vector<uint16_t> scales(static_cast<size_t>(n) * groups), lows(scales.size());
  for (auto& c : codes) c = static_cast<uint8_t>(uniform(0, 15));
  for (auto& s : scales) s = float_to_half(static_cast<float>(uniform(1, 300)) / 1024.0f);
  for (auto& l : lows) l = float_to_half(static_cast<float>(uniform(-300, 300)) / 1024.0f);
  for (int b = 0; b < n / 16; ++b)  // integer_linear.py's pack: [N/16][K/8][16 lanes x 4 bytes of two nibbles]
    for (int s = 0; s < k / 8; ++s)
      for (int j = 0; j < 16; ++j)
        for (int t = 0; t < 4; ++t) {
          const int row = 16 * b + j;
          packed[(static_cast<size_t>(b) * (k / 8) + s) * 64 + j * 4 + t] =
              static_cast<uint8_t>(codes[row * k + 8 * s + t] | (codes[row * k + 8 * s + 4 + t] << 4));
        }
  // scales and lows per block: [N/16][K/group][16]
  std::vector<uint16_t> sc(scales.size()), lo(lows.size());
  for (int b = 0; b < n / 16; ++b)
    for (int g = 0; g < groups; ++g)
      for (int j = 0; j < 16; ++j) {
        sc[(static_cast<size_t>(b) * groups + g) * 16 + j] = scales[(16 * b + j) * groups + g];
        lo[(static_cast<size_t>(b) * groups + g) * 16 + j] = lows[(16 * b + j) * groups + g];
      }
  for (int rows = 1; rows <= 17; ++rows) {
    const auto x = activations(rows, k);
    std::vector<float> got(static_cast<size_t>(rows) * n), want(got.size());
    for (int r = 0; r < rows; ++r) {
      std::vector<int8_t> q(k);
      std::vector<int32_t> gsum(groups);
      float xs;
      draftwise_neon::quantize_row(&x[r * k], k, q.data(), &xs);
      draftwise_neon::group_sums(q.data(), k, group, gsum.data());
      for (int b = 0; b < n / 16; ++b)
        draftwise_neon::q4_block_row(&packed[static_cast<size_t>(b) * k * 8], &sc[static_cast<size_t>(b) * groups * 16],
                                     &lo[static_cast<size_t>(b) * groups * 16], q.data(), gsum.data(), xs, k, group, &got[r * n + b * 16]);
      for (int j = 0; j < n; ++j) {
        float facc = 0.0f;
        for (int g = 0; g < groups; ++g) {
          int32_t acc = 0, qsum = 0;
          for (int i = g * group; i < (g + 1) * group; ++i) {
            acc += static_cast<int32_t>(codes[j * k + i]) * q[i];
            qsum += q[i];
          }
          facc = std::fma(static_cast<float>(acc), half_to_float(scales[j * groups + g]), facc);
          facc = std::fma(static_cast<float>(qsum), half_to_float(lows[j * groups + g]), facc);
        }
        want[r * n + j] = facc * xs;
      }
    }
    expect_same(got.data(), want.data(), rows * n, "q4", rows, k);
  }
}

uint64_t fnv1a(const std::vector<float>& v) {
  uint64_t h = 0xCBF29CE484222325ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 0x100000001B3ull;
  return h;
}

// tests/engine/test_integer_kernels.py's cross_isa_outputs, made from the same numbers of the same generator
// (restarted), through this kernel: its digests must be the ones the AVX-512 VNNI kernel gave there.
void check_against_x86() {
  draftwise_test::state = 88172645463325252ull;
  const int rows = 19, k = 896, n = 160, blocks = n / 16, groups = k / 32;
  std::vector<float> x(rows * k), scale(n);
  for (auto& v : x) v = static_cast<float>(uniform(-2000, 2000)) / 256.0f;
  std::fill(x.begin() + 3 * k, x.begin() + 4 * k, 0.0f);
  std::vector<int8_t> packed8(static_cast<size_t>(blocks) * (k / 4) * 64);
  for (auto& w : packed8) w = static_cast<int8_t>(uniform(-127, 127));
  for (auto& s : scale) s = static_cast<float>(uniform(1, 1000)) / 4096.0f;
  std::vector<uint8_t> packed4(static_cast<size_t>(blocks) * (k / 8) * 64);
  for (auto& c : packed4) c = static_cast<uint8_t>(uniform(0, 255));
  std::vector<uint16_t> grids(2 * blocks * groups * 16);
  for (auto& g : grids) g = float_to_half(static_cast<float>(uniform(-300, 300)) / 1024.0f);
  const uint16_t *sc = grids.data(), *lo = grids.data() + blocks * groups * 16;
  std::vector<float> q8(rows * n), q4(rows * n);
  for (int r = 0; r < rows; ++r) {
    std::vector<int8_t> q(k);
    std::vector<int32_t> gsum(groups);
    float xs;
    draftwise_neon::quantize_row(&x[r * k], k, q.data(), &xs);
    draftwise_neon::group_sums(q.data(), k, 32, gsum.data());
    for (int b = 0; b < blocks; ++b) {
      draftwise_neon::q8_block_row(&packed8[static_cast<size_t>(b) * k * 16], q.data(), xs, &scale[b * 16], k, &q8[r * n + b * 16]);
      draftwise_neon::q4_block_row(&packed4[static_cast<size_t>(b) * k * 8], sc + b * groups * 16, lo + b * groups * 16,
                                   q.data(), gsum.data(), xs, k, 32, &q4[r * n + b * 16]);
    }
  }
  const uint64_t want8 = 0x0A215A9E27156384ull, want4 = 0xB39D1A8BBEBEE6AAull;
  checks += 2;
  if (fnv1a(q8) != want8) { ++failures; std::printf("FAIL q8 differs from the x86 kernels' bits\n"); }
  if (fnv1a(q4) != want4) { ++failures; std::printf("FAIL q4 differs from the x86 kernels' bits\n"); }
}

}  // namespace

int main() {
  check_against_x86();
  for (int k : {4, 36, 64, 324, 896}) check_q8(48, k);   // K: within one vector, not a multiple of 16, the 0.5B's
  for (int k : {32, 96, 896}) check_q4(32, k, 32);
  check_q4(16, 256, 64);
  std::printf("%d passed, %d failed\n", checks - failures, failures);
  return failures == 0 ? 0 : 1;
}
