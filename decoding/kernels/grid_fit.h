// The int4 format's grids: for each group of weights, the scale and low (weight = code * scale + low,
// codes 0..15, scale and low in fp16) with the least squared error among min..max in 15 steps, min..max
// in 11-14 steps anchored at either end, and least-squares refits of scale and low to the chosen codes.
// Why these candidates: the presets' weights come from a GGUF file, where a Q4_K group's values lie on
// a grid of 16 levels that need not reach both ends of 0..15 (integer_linear.py, pack).
//
// Once in torch ops this was 33 s of the 1.5B's first start: ~150 passes over small tensors per chunk
// of groups. Here each group is fitted in registers: 16 groups at a time, one per vector lane, every
// step of the arithmetic an IEEE operation on one lane (no reassociation, no contraction: the
// kernels build with -ffp-contract=off), so the grids are the same bits on every instruction set, with
// any thread count and from any compiler. A lane's sums run over its group's weights in order.
//
// No torch here: ops.h registers it as torch's op, tests/kernels/grid_fit_test.cpp pins its bits on
// every build (x86's, aarch64's under qemu) without torch.
#pragma once
#if defined(__FAST_MATH__)
#error "grid_fit.h needs IEEE arithmetic: -ffast-math folds round_even away and reorders the sums"
#endif
#include <cstdint>
#include <cstring>
#include <initializer_list>

namespace draftwise_fit {

constexpr int LANES = 16;
constexpr int MAX_GROUP = 256;
constexpr float ROUNDER = 12582912.0f;  // 1.5 * 2^23: x + ROUNDER - ROUNDER rounds x to an integer

// torch.round's rounding (to nearest, ties to even) for |x| < 2^22; larger magnitudes keep their sign
// and stay beyond 15 or below 0, where the codes are clamped anyway.
inline float round_even(float x) {
  return (x + ROUNDER) - ROUNDER;  // not folded to x: the kernels build without -ffast-math
}

// x rounded to the nearest fp16 value (ties to even), as a float: torch's x.half().float(). Both
// ranges are computed and one is selected, without branches, so that a loop over lanes vectorizes.
inline float fp16_round(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t sign = u & 0x80000000u, a = u ^ sign;
  uint32_t normal = (a + 0x0FFFu + ((a >> 13) & 1u)) & ~0x1FFFu;  // keep 10 of the 23 fraction bits
  normal = normal >= 0x47800000u ? 0x7f800000u : normal;          // past 65504: inf
  float magnitude, tiny;
  std::memcpy(&magnitude, &a, 4);
  tiny = round_even(magnitude * 16777216.0f) * (1.0f / 16777216.0f);  // subnormals: multiples of 2^-24
  uint32_t subnormal;
  std::memcpy(&subnormal, &tiny, 4);
  uint32_t r = a >= 0x38800000u ? normal : subnormal;  // below 2^-14: fp16's subnormal range
  r = a >= 0x7f800000u ? a : r;                         // inf and NaN as they are
  r |= sign;
  float out;
  std::memcpy(&out, &r, 4);
  return out;
}

// 16 groups, weights transposed so that lane l of row e is group l's weight e.
struct Block {
  int group;
  float w[MAX_GROUP][LANES];
  float scale[LANES], low[LANES], best[LANES];
  float codes[MAX_GROUP][LANES];  // the best grid's
  float trial[MAX_GROUP][LANES];  // a candidate's

  // Each lane's squared error on the grid (scale, low), both rounded to fp16 as the kernel reads them;
  // the candidate's codes go to `trial`.
  void error(const float* cand_scale, const float* cand_low, float* err) {
    // locals, not `err` itself: a pointer that may alias the weights left the loop below scalar
    float s[LANES], l[LANES], sum[LANES];
    for (int i = 0; i < LANES; ++i) {
      s[i] = fp16_round(cand_scale[i]);
      l[i] = fp16_round(cand_low[i]);
      sum[i] = 0.0f;
    }
    for (int e = 0; e < group; ++e) {
      for (int i = 0; i < LANES; ++i) {
        float c = round_even((w[e][i] - l[i]) / s[i]);
        c = c < 0.0f ? 0.0f : c;  // written as comparisons: a NaN code stays NaN, as in torch.clamp
        c = c > 15.0f ? 15.0f : c;
        trial[e][i] = c;
        const float d = c * s[i] + l[i] - w[e][i];
        sum[i] += d * d;
      }
    }
    std::memcpy(err, sum, sizeof(sum));
  }

  // The candidate replaces the best grid in each lane where it errs strictly less.
  void keep(const float* cand_scale, const float* cand_low) {
    float err[LANES];
    error(cand_scale, cand_low, err);
    int32_t better[LANES];  // all ones where the candidate errs less
    for (int i = 0; i < LANES; ++i) {
      better[i] = err[i] < best[i] ? -1 : 0;
      scale[i] = better[i] ? cand_scale[i] : scale[i];
      low[i] = better[i] ? cand_low[i] : low[i];
      best[i] = better[i] ? err[i] : best[i];
    }
    // the codes by bits and a mask, not `better ? trial : codes`: GCC's AVX2 vectorizer turned that
    // into masked loads whose codes differed from every other build's (tests/kernels/grid_fit_test.cpp)
    for (int e = 0; e < group; ++e)
      for (int i = 0; i < LANES; ++i) {
        uint32_t kept, tried;
        std::memcpy(&kept, &codes[e][i], 4);
        std::memcpy(&tried, &trial[e][i], 4);
        const uint32_t mask = static_cast<uint32_t>(better[i]);
        kept = (tried & mask) | (kept & ~mask);
        std::memcpy(&codes[e][i], &kept, 4);
      }
  }

  void refit() {
    float code_mean[LANES], weight_mean[LANES], var[LANES], cov[LANES], s[LANES], l[LANES];
    for (int i = 0; i < LANES; ++i) code_mean[i] = weight_mean[i] = var[i] = cov[i] = 0.0f;
    for (int e = 0; e < group; ++e)
      for (int i = 0; i < LANES; ++i) {
        code_mean[i] += codes[e][i];
        weight_mean[i] += w[e][i];
      }
    for (int i = 0; i < LANES; ++i) {
      code_mean[i] /= static_cast<float>(group);
      weight_mean[i] /= static_cast<float>(group);
    }
    for (int e = 0; e < group; ++e)
      for (int i = 0; i < LANES; ++i) {
        const float dc = codes[e][i] - code_mean[i];
        var[i] += dc * dc;
        cov[i] += dc * (w[e][i] - weight_mean[i]);
      }
    for (int i = 0; i < LANES; ++i) {
      var[i] /= static_cast<float>(group);
      cov[i] /= static_cast<float>(group);
      float fitted = cov[i] / (var[i] < 1e-12f ? 1e-12f : var[i]);
      fitted = var[i] > 0.0f ? fitted : scale[i];
      s[i] = fitted < 1e-8f ? 1e-8f : fitted;
      l[i] = var[i] > 0.0f ? weight_mean[i] - s[i] * code_mean[i] : low[i];
    }
    keep(s, l);
  }

  void fit(int refits) {
    float lo[LANES], hi[LANES], s[LANES], l[LANES];
    for (int i = 0; i < LANES; ++i) lo[i] = hi[i] = w[0][i];
    for (int e = 1; e < group; ++e)
      for (int i = 0; i < LANES; ++i) {
        lo[i] = w[e][i] < lo[i] ? w[e][i] : lo[i];
        hi[i] = w[e][i] > hi[i] ? w[e][i] : hi[i];
      }
    for (int i = 0; i < LANES; ++i) {
      const float step = (hi[i] - lo[i]) / 15.0f;
      scale[i] = step < 1e-8f ? 1e-8f : step;
      low[i] = lo[i];
    }
    error(scale, low, best);
    std::memcpy(codes, trial, sizeof(float) * LANES * group);
    for (const float steps : {14.0f, 13.0f, 12.0f, 11.0f}) {
      for (int i = 0; i < LANES; ++i) {
        const float step = (hi[i] - lo[i]) / steps;
        s[i] = step < 1e-8f ? 1e-8f : step;
      }
      keep(s, lo);
      for (int i = 0; i < LANES; ++i) l[i] = hi[i] - 15.0f * s[i];
      keep(s, l);
    }
    for (int r = 0; r < refits; ++r) refit();
  }
};

// Groups [begin, end) of `in` ([groups, group] floats): each one's scale and low (fp16 values, as
// floats) and its weights' codes on that grid (a NaN code, from a grid of zero scale, is 0: the weight
// is then the low whatever its code). Groups are fitted 16 at a time; a short last block repeats its
// last group in the spare lanes.
inline void fit_groups(const float* in, int group, int refits, int64_t begin, int64_t end,
                       float* scale, float* low, uint8_t* codes) {
  Block* b = new Block();
  b->group = group;
  for (int64_t first = begin; first < end; first += LANES) {
    for (int i = 0; i < LANES; ++i) {
      const int64_t g = first + i < end ? first + i : end - 1;
      for (int e = 0; e < group; ++e) b->w[e][i] = in[g * group + e];
    }
    b->fit(refits);
    for (int i = 0; i < LANES && first + i < end; ++i) {
      const int64_t g = first + i;
      scale[g] = fp16_round(b->scale[i]);
      low[g] = fp16_round(b->low[i]);
      for (int e = 0; e < group; ++e) {
        const float c = b->codes[e][i];
        codes[g * group + e] = c == c ? static_cast<uint8_t>(c) : 0;
      }
    }
  }
  delete b;
}

}  // namespace draftwise_fit

