// avx512vnni.cpp's two ops for AVX2 CPUs without VNNI (most laptops): the same layouts, the same
// quantization and the same bits, with 256-bit integer instructions.
//
// AVX2 has no u8 x s8 dot product into 32 bits; `vpmaddubsw` multiplies u8 by s8 and adds pairs into
// int16 with saturation, so each use keeps its pair sums in range:
// - int8 (q8_linear): activations stay signed codes (-127..127, no offset) and llama.cpp's sign trick
//   moves each activation's sign onto its weight: |x| * (w * sign(x)) pairs reach 2 * 127 * 127 = 32258
//   at most, below int16's 32767. `vpmaddwd` by ones then adds pairs of those into int32.
// - int4 (q4_linear): codes are 0..15, so code x activation pairs reach 2 * 15 * 127 = 3810.
// Integer sums are exact in any order, and the float epilogues are avx512vnni.cpp's, so every row is
// bit for bit what the VNNI kernel (and, for int8, `torch._int_mm`) computes, at every width: one
// quantization per format whatever CPU runs it.
//
// Built with DRAFTWISE_AVXVNNI (Intel 12th gen on, AMD Zen 5: AVX-VNNI without AVX-512), each
// u8 x s8 product of four pairs goes straight into int32 with `vpdpbusd` on 256-bit registers. int8
// then takes avx512vnni.cpp's operands: activations offset by 128 to unsigned bytes (no sign trick),
// and 128 x each output's weight sum taken off the integer sum, so the same sums; a verify row costs
// two instructions a step where the sign trick took five here. int4 multiplies codes by x as AVX2 does.
#include "ops.h"  // the ops' checks, their drivers and their registration
#include <cmath>
#include <cstdint>
#include <cstring>
#include <immintrin.h>

namespace {

// avx512vnni.cpp's quantize_row_bytes with offset 0, 8 values an instruction: the same division,
// rounding (to nearest even) and clamping per value, so the same codes.
void quantize_row(const float* r, int64_t k, int8_t* out, float* scale) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 vmax = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(r + i)));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float amax = 0.0f;
  for (float v : lanes) amax = std::max(amax, v);
  for (; i < k; ++i) amax = std::max(amax, std::fabs(r[i]));
  const float s = std::max(amax / 127.0f, 1e-12f);
  *scale = s;
  const __m256 vs = _mm256_set1_ps(s), hi = _mm256_set1_ps(127.f), lo = _mm256_set1_ps(-127.f);
  for (i = 0; i + 8 <= k; i += 8) {
    __m256 v = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(r + i), vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm256_min_ps(hi, _mm256_max_ps(lo, v));
    alignas(32) int32_t codes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(codes), _mm256_cvtps_epi32(v));
    for (int j = 0; j < 8; ++j) out[i + j] = static_cast<int8_t>(codes[j]);
  }
  for (; i < k; ++i) {
    float v = std::nearbyint(r[i] / s);
    out[i] = static_cast<int8_t>(static_cast<int32_t>(std::min(127.f, std::max(-127.f, v))));
  }
}

// Weights are read this many bytes ahead of their use. The hardware prefetcher alone kept one row of
// the 0.5B's lm_head at ~11 GB/s on 2 threads, and a few rows (a verify forward) lost more to it; a
// software prefetch ~4 KB ahead made both about 1.6x faster (a prefetch never changes a result).
constexpr int64_t PREFETCH = 4096;

// acc + the sums of four u8 x s8 products per int32 lane (the s8 side within +-127, so AVX2's
// int16 pair sums never saturate)
inline __m256i add_dot4(__m256i acc, __m256i u8, __m256i s8, __m256i ones) {
#ifdef DRAFTWISE_AVXVNNI
  (void)ones;
  return _mm256_dpbusd_avx_epi32(acc, u8, s8);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u8, s8), ones));
#endif
}

// What ops.h's drivers run on AVX2 (and AVX-VNNI)
struct Avx2 {
  static constexpr int ROWS = 4;  // rows sharing each weight load (2 accumulators a row: 8 of 16 registers)
#ifdef DRAFTWISE_AVXVNNI
  static constexpr bool Q8_OFFSET = true;
#else
  static constexpr bool Q8_OFFSET = false;  // signed activations need no offset correction here
#endif

  static void q8_quantize_row(const float* r, int64_t k, int8_t* out, float* scale) {
    quantize_row(r, k, out, scale);
#ifdef DRAFTWISE_AVXVNNI
    // code + 128 as an unsigned byte: for codes in -127..127 that is the code's bits with the top one
    // flipped
    uint8_t* codes = reinterpret_cast<uint8_t*>(out);
    for (int64_t i = 0; i < k; ++i) codes[i] ^= 0x80;
#endif
  }

  static void q4_quantize_row(const float* r, int64_t k, int8_t* out, float* scale) { quantize_row(r, k, out, scale); }

  // One block of 16 int8 outputs for R rows: acc[2r], acc[2r+1] hold outputs 0-7 and 8-15. AVX2: xq
  // holds signed codes; AVX-VNNI: codes + 128 as bytes (q8_quantize_row), so acc is the sum plus 128 x
  // the weights' sum, taken off again before the epilogue.
  template <int R>
  static void q8_block_rows(const int8_t* w, const float* wscale, const int32_t* wsum, const int8_t* const* xq,
                            const float* xs, int64_t k, float* const* out) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[2 * R];
    for (int r = 0; r < 2 * R; ++r) acc[r] = _mm256_setzero_si256();
    for (int64_t s = 0; s < k / 4; ++s) {
      _mm_prefetch(reinterpret_cast<const char*>(w + s * 64 + PREFETCH), _MM_HINT_T0);
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + s * 64));
      const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + s * 64 + 32));
      for (int r = 0; r < R; ++r) {
        int32_t x4;
        std::memcpy(&x4, xq[r] + s * 4, 4);
        const __m256i xb = _mm256_set1_epi32(x4);
#ifdef DRAFTWISE_AVXVNNI
        (void)ones;
        acc[2 * r] = _mm256_dpbusd_avx_epi32(acc[2 * r], xb, w0);
        acc[2 * r + 1] = _mm256_dpbusd_avx_epi32(acc[2 * r + 1], xb, w1);
#else
        const __m256i xa = _mm256_abs_epi8(xb);
        acc[2 * r] = add_dot4(acc[2 * r], xa, _mm256_sign_epi8(w0, xb), ones);
        acc[2 * r + 1] = add_dot4(acc[2 * r + 1], xa, _mm256_sign_epi8(w1, xb), ones);
#endif
      }
    }
    const __m256 ws0 = _mm256_loadu_ps(wscale), ws1 = _mm256_loadu_ps(wscale + 8);
#ifdef DRAFTWISE_AVXVNNI
    const __m256i off0 = _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wsum)), 7);
    const __m256i off1 = _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wsum + 8)), 7);
#else
    (void)wsum;
    const __m256i off0 = _mm256_setzero_si256(), off1 = off0;
#endif
    for (int r = 0; r < R; ++r) {
      const __m256 xsc = _mm256_set1_ps(xs[r]);
      const __m256i sum0 = _mm256_sub_epi32(acc[2 * r], off0), sum1 = _mm256_sub_epi32(acc[2 * r + 1], off1);
      _mm256_storeu_ps(out[r], _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sum0), xsc), ws0));
      _mm256_storeu_ps(out[r] + 8, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sum1), xsc), ws1));
    }
  }

  // One block of 16 int4 outputs for R rows (avx512vnni.cpp's q4_block_rows): per group, codes x
  // activations in int32, then scale and low applied in floats in the VNNI kernel's order.
  template <int R>
  static void q4_block_rows(const uint8_t* w, const at::Half* sc, const at::Half* lo, const int8_t* const* xq,
                            const int32_t* const* gsum, const float* xs, int64_t k, int64_t group, float* const* out) {
    const __m256i mask = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 facc[2 * R];
    for (int r = 0; r < 2 * R; ++r) facc[r] = _mm256_setzero_ps();
    const int64_t groups = k / group, steps = group / 8;
    for (int64_t g = 0; g < groups; ++g) {
      __m256i acc[2 * R];
      for (int r = 0; r < 2 * R; ++r) acc[r] = _mm256_setzero_si256();
      for (int64_t s = 0; s < steps; ++s) {
        const int64_t i = g * group + s * 8;
        _mm_prefetch(reinterpret_cast<const char*>(w + i * 8 + PREFETCH), _MM_HINT_T0);
        const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i * 8));
        const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i * 8 + 32));
        const __m256i low0 = _mm256_and_si256(v0, mask), high0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), mask);
        const __m256i low1 = _mm256_and_si256(v1, mask), high1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), mask);
        for (int r = 0; r < R; ++r) {
          int32_t x0, x1;
          std::memcpy(&x0, xq[r] + i, 4);
          std::memcpy(&x1, xq[r] + i + 4, 4);
          const __m256i b0 = _mm256_set1_epi32(x0), b1 = _mm256_set1_epi32(x1);
          acc[2 * r] = add_dot4(add_dot4(acc[2 * r], low0, b0, ones), high0, b1, ones);
          acc[2 * r + 1] = add_dot4(add_dot4(acc[2 * r + 1], low1, b0, ones), high1, b1, ones);
        }
      }
      for (int half = 0; half < 2; ++half) {
        const __m256 scale = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + g * 16 + half * 8)));
        const __m256 lows = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo + g * 16 + half * 8)));
        for (int r = 0; r < R; ++r) {
          __m256& f = facc[2 * r + half];
          f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[2 * r + half]), scale, f);
          f = _mm256_fmadd_ps(_mm256_set1_ps(static_cast<float>(gsum[r][g])), lows, f);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int half = 0; half < 2; ++half)
        _mm256_storeu_ps(out[r] + half * 8, _mm256_mul_ps(facc[2 * r + half], _mm256_set1_ps(xs[r])));
  }
};

}  // namespace

at::Tensor q8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& weight_sums,
                     const at::Tensor& scale) {
  return draftwise_ops::q8_linear_on<Avx2>(x, packed, weight_sums, scale);
}

at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                     const at::Tensor& lows, int64_t group) {
  return draftwise_ops::q4_linear_on<Avx2>(x, packed, scales, lows, group);
}
