// avx512vnni.cpp's two ops for ARM (aarch64 with the dot-product extension: Apple Silicon, Graviton 2+,
// recent Snapdragon), without torch: neon.cpp wraps it for torch, and
// tests/kernels/neon_kernel_test.cpp runs it under qemu on any machine with a cross compiler.
//
// The same layouts, quantization and bits as the x86 kernels: activations are quantized to signed
// codes per row by the same rule (scalar here: the same division, round-half-even and clamp per
// value), `sdot` (vdotq_s32) multiplies signed bytes by signed bytes four at a time into int32 lanes
// -- exactly one 16-output block's layout: 4 lanes of 4 bytes per 16-byte register -- and the float
// epilogues are the x86 kernels', fused multiply-adds included.
#pragma once
#include <arm_neon.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace draftwise_neon {

// One row's codes (-127..127) and scale: Int8Linear's rule, as avx512vnni.cpp's quantize_row_bytes.
inline void quantize_row(const float* r, int64_t k, int8_t* out, float* scale) {
  float amax = 0.0f;
  for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(r[i]));
  const float s = std::max(amax / 127.0f, 1e-12f);
  *scale = s;
  for (int64_t i = 0; i < k; ++i) {
    const float v = std::nearbyint(r[i] / s);
    out[i] = static_cast<int8_t>(static_cast<int32_t>(std::min(127.f, std::max(-127.f, v))));
  }
}

inline int8x16_t broadcast4(const int8_t* p) {
  int32_t x4;
  std::memcpy(&x4, p, 4);
  return vreinterpretq_s8_s32(vdupq_n_s32(x4));
}

// int8: one block of 16 outputs (packed [K/4][64] bytes) for one row of codes: out[16] =
// (float(sum) * x_scale) * w_scale.
inline void q8_block_row(const int8_t* w, const int8_t* xq, float xs, const float* wscale, int64_t k, float* out) {
  int32x4_t acc[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
  for (int64_t s = 0; s < k / 4; ++s) {
    const int8x16_t x = broadcast4(xq + s * 4);
    for (int c = 0; c < 4; ++c) acc[c] = vdotq_s32(acc[c], vld1q_s8(w + s * 64 + c * 16), x);
  }
  const float32x4_t vxs = vdupq_n_f32(xs);
  for (int c = 0; c < 4; ++c)
    vst1q_f32(out + c * 4, vmulq_f32(vmulq_f32(vcvtq_f32_s32(acc[c]), vxs), vld1q_f32(wscale + c * 4)));
}

// int4: one block of 16 outputs (packed [K/8][64] bytes of nibbles; fp16 scales and lows [K/group][16]
// as raw bits) for one row of codes with its group sums: the VNNI kernel's block_rows for one row.
inline void q4_block_row(const uint8_t* w, const uint16_t* sc, const uint16_t* lo, const int8_t* xq,
                         const int32_t* gsum, float xs, int64_t k, int64_t group, float* out) {
  const uint8x16_t mask = vdupq_n_u8(0x0F);
  float32x4_t facc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
  const int64_t groups = k / group, steps = group / 8;
  for (int64_t g = 0; g < groups; ++g) {
    int32x4_t acc[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t i = g * group + s * 8;
      const int8x16_t x0 = broadcast4(xq + i), x1 = broadcast4(xq + i + 4);
      for (int c = 0; c < 4; ++c) {
        const uint8x16_t v = vld1q_u8(w + i * 8 + c * 16);
        acc[c] = vdotq_s32(acc[c], vreinterpretq_s8_u8(vandq_u8(v, mask)), x0);
        acc[c] = vdotq_s32(acc[c], vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), x1);
      }
    }
    const float32x4_t gs = vdupq_n_f32(static_cast<float>(gsum[g]));
    for (int c = 0; c < 4; ++c) {
      const float32x4_t scale = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(sc + g * 16 + c * 4)));
      const float32x4_t low = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(lo + g * 16 + c * 4)));
      facc[c] = vfmaq_f32(facc[c], vcvtq_f32_s32(acc[c]), scale);
      facc[c] = vfmaq_f32(facc[c], gs, low);
    }
  }
  const float32x4_t vxs = vdupq_n_f32(xs);
  for (int c = 0; c < 4; ++c) vst1q_f32(out + c * 4, vmulq_f32(facc[c], vxs));
}

inline void group_sums(const int8_t* xq, int64_t k, int64_t group, int32_t* out) {
  for (int64_t g = 0; g < k / group; ++g) {
    int32_t sum = 0;
    for (int64_t j = 0; j < group; ++j) sum += xq[g * group + j];
    out[g] = sum;
  }
}

}  // namespace draftwise_neon
