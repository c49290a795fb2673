// int4 weights x int8 activations for the static forward's linears (decoding/kernels/integer_linear.py),
// and int8 weights x int8 activations for Int8Linear's (below, q8_linear).
//
// Why a kernel of our own: ATen's int4 CPU kernel reads the 0.5B's int4 layers at ~10 GB/s for one
// row (it unpacks to bf16 and multiplies in floats), slower than int8's `_int_mm` on twice the
// bytes. Here activations are quantized to int8 per row (Int8Linear's rule) and multiplied with the
// 4-bit codes by integer dot products (AVX-512 VNNI `vpdpbusd`: 64 multiply-adds an instruction),
// as llama.cpp's Q4 x Q8 dot products do; decode then runs at the memory's speed.
//
// Exact at every width: each row is quantized on its own and computed by the same instructions in
// the same order whatever the number of rows, so a verify forward's row equals a decode step.
//
// Layout (integer_linear.py packs it): outputs in blocks of 16 (one 32-bit lane each), inputs in steps
// of 8. For block b and step s, 64 bytes: lane j's 4 bytes hold the codes of output 16b+j at inputs
// 8s..8s+3 (low nibbles) and 8s+4..8s+7 (high nibbles). Per block and group of `group` inputs: 16
// fp16 scales and 16 fp16 lows; a weight is code * scale + low.
#include "ops.h"  // the ops' checks, their drivers and their registration
#include <cmath>
#include <cstdint>
#include <cstring>
#include <immintrin.h>

namespace {

// Weights are read this many bytes ahead of their use: the hardware prefetcher alone left one row of
// a large layer well under the memory's speed, and rows of a verify forward lost more to it (see
// avx2.cpp). A prefetch never changes a result.
constexpr int64_t PREFETCH = 4096;

// Int8Linear's rule: one scale a row (its largest magnitude maps to 127), round half to even. 16 values
// an instruction: the same division, rounding and clamping per value as scalar code, and a maximum,
// whose order changes nothing, so a row quantizes the same however it is computed. Codes are written
// as bytes, code + offset: 0 for signed codes (the int4 kernel), 128 for VNNI's unsigned operand (q8).
// (Unvectorized, this took about a third of a 256-token prompt chunk's kernel time, on one thread.)
void quantize_row_bytes(const float* r, int64_t k, int32_t offset, uint8_t* out, float* scale) {
  __m512 vmax = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(r + i)));
  float amax = _mm512_reduce_max_ps(vmax);
  for (; i < k; ++i) amax = std::max(amax, std::fabs(r[i]));
  const float s = std::max(amax / 127.0f, 1e-12f);
  *scale = s;
  const __m512 vs = _mm512_set1_ps(s), hi = _mm512_set1_ps(127.f), lo = _mm512_set1_ps(-127.f);
  const __m512i voffset = _mm512_set1_epi32(offset);
  for (i = 0; i + 16 <= k; i += 16) {
    __m512 v = _mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(r + i), vs),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm512_min_ps(hi, _mm512_max_ps(lo, v));
    // codes are within -127..127, so the low byte of code + offset is the byte wanted either way
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(v), voffset)));
  }
  for (; i < k; ++i) {
    float v = std::nearbyint(r[i] / s);
    out[i] = static_cast<uint8_t>(static_cast<int32_t>(std::min(127.f, std::max(-127.f, v))) + offset);
  }
}

// ---- int8 weights x int8 activations: Int8Linear where this file builds ---------------------------
//
// Why: oneDNN's `_int_mm` reads the 0.5B's int8 weights at ~15 GB/s for one row and 6-10 GB/s for
// the 4..16 rows of a verify forward (its small-M path), while a step's time should be the weights'
// bytes at the memory's speed. Here the q4 kernel's scheme with 8-bit codes: outputs in blocks of 16
// (one 32-bit lane each), each activation's 4 bytes broadcast against 64 bytes of weights by one
// `vpdpbusd`, no horizontal sums. VNNI multiplies unsigned by signed bytes, so activations go in
// offset by 128 and 128 x each output's weight sum comes off again.
//
// Exact: the integer sums equal `_int_mm`'s (integers add up alike in any order) and the epilogue is
// Int8Linear's, (float(sum) * x_scale) * w_scale, so the result is bit for bit the one `_int_mm`
// gives, at every width.
//
// Layout (integer_linear.py: pack_int8): for block b and step s, 64 bytes: lane j's 4 bytes are the weights
// of output 16b+j at inputs 4s..4s+3.

// What ops.h's drivers run on AVX-512 VNNI
struct Avx512Vnni {
  static constexpr int ROWS = 8;  // rows sharing each unpacked load (8 accumulators and 8 sums: 16 of 32 registers)
  static constexpr bool Q8_OFFSET = true;  // VNNI's unsigned operand: activations offset by 128

  static void q8_quantize_row(const float* r, int64_t k, int8_t* out, float* scale) {
    quantize_row_bytes(r, k, 128, reinterpret_cast<uint8_t*>(out), scale);
  }
  static void q4_quantize_row(const float* r, int64_t k, int8_t* out, float* scale) {
    quantize_row_bytes(r, k, 0, reinterpret_cast<uint8_t*>(out), scale);
  }

  // One block of 16 outputs for R rows at once: each 64 bytes of codes is unpacked once for all R.
  // Every row's sums run in the same order whatever R is, so how rows are grouped changes nothing.
  template <int R>
  static void q4_block_rows(const uint8_t* w, const at::Half* sc, const at::Half* lo, const int8_t* const* xq,
                            const int32_t* const* gsum, const float* xs, int64_t k, int64_t group, float* const* out) {
    const __m512i mask = _mm512_set1_epi8(0x0F);
    __m512 facc[R];
    for (int r = 0; r < R; ++r) facc[r] = _mm512_setzero_ps();
    const int64_t groups = k / group, steps = group / 8;
    for (int64_t g = 0; g < groups; ++g) {
      __m512i acc[R];
      for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_si512();
      for (int64_t s = 0; s < steps; ++s) {
        const int64_t i = g * group + s * 8;
        _mm_prefetch(reinterpret_cast<const char*>(w + i * 8 + PREFETCH), _MM_HINT_T0);
        const __m512i v = _mm512_loadu_si512(w + i * 8);  // 16 lanes x 8 codes
        const __m512i low = _mm512_and_si512(v, mask);
        const __m512i high = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
        for (int r = 0; r < R; ++r) {
          int32_t x0, x1;
          std::memcpy(&x0, xq[r] + i, 4);
          std::memcpy(&x1, xq[r] + i + 4, 4);
          acc[r] = _mm512_dpbusd_epi32(acc[r], low, _mm512_set1_epi32(x0));
          acc[r] = _mm512_dpbusd_epi32(acc[r], high, _mm512_set1_epi32(x1));
        }
      }
      const __m512 scale = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc + g * 16)));
      const __m512 lows = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo + g * 16)));
      for (int r = 0; r < R; ++r) {
        facc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r]), scale, facc[r]);
        facc[r] = _mm512_fmadd_ps(_mm512_set1_ps(static_cast<float>(gsum[r][g])), lows, facc[r]);
      }
    }
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(out[r], _mm512_mul_ps(facc[r], _mm512_set1_ps(xs[r])));
  }

  // One block of 16 outputs for R rows: each 64 bytes of weights is loaded once for all R. Activations
  // are codes + 128 as bytes (q8_quantize_row), so 128 x each output's weight sum comes off the sum.
  template <int R>
  static void q8_block_rows(const int8_t* w, const float* wscale, const int32_t* wsum, const int8_t* const* xq,
                            const float* xs, int64_t k, float* const* out) {
    __m512i acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_si512();
    for (int64_t s = 0; s < k / 4; ++s) {
      _mm_prefetch(reinterpret_cast<const char*>(w + s * 64 + PREFETCH), _MM_HINT_T0);
      const __m512i v = _mm512_loadu_si512(w + s * 64);
      for (int r = 0; r < R; ++r) {
        int32_t x4;
        std::memcpy(&x4, xq[r] + s * 4, 4);
        acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_set1_epi32(x4), v);
      }
    }
    const __m512i offset = _mm512_mullo_epi32(_mm512_loadu_si512(wsum), _mm512_set1_epi32(128));
    const __m512 ws = _mm512_loadu_ps(wscale);
    for (int r = 0; r < R; ++r) {
      const __m512 sum = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r], offset));
      _mm512_storeu_ps(out[r], _mm512_mul_ps(_mm512_mul_ps(sum, _mm512_set1_ps(xs[r])), ws));
    }
  }
};

}  // namespace

at::Tensor q8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& weight_sums,
                     const at::Tensor& scale) {
  return draftwise_ops::q8_linear_on<Avx512Vnni>(x, packed, weight_sums, scale);
}

at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                     const at::Tensor& lows, int64_t group) {
  return draftwise_ops::q4_linear_on<Avx512Vnni>(x, packed, scales, lows, group);
}
