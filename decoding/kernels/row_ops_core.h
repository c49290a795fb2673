// Attention for one query row of one head, computed so that its result depends on its position and
// the cache alone: not on how many rows the forward has, nor on how many threads run it, nor on
// which CPU or compiler built it. row_ops.cpp runs it for torch; tests/kernels/row_ops_test.cpp runs
// every build of it (portable C++, AVX2, AVX-512, aarch64 under qemu; GCC 11, GCC 12, clang) against
// the same bits without torch.
//
// Why: BLAS matmuls split their work by the thread count and the matrix shape. At 8 threads a
// 14-row verify forward's attention (its 98 x 64 probabilities-times-values product) summed in
// another order than a one-token step's, so a verify row differed from the step at its position and
// speculation could change the text. Here every (row, head) pair is one task for one thread, and its
// sums run in an order fixed by this code:
// - a score is the dot product of the query with one key: 16 lanes of products over the head's
//   dimensions (lane l takes dimensions l, l+16, ...: a product, then fused multiply-adds), the lanes
//   then summed by a fixed tree (l + l+8, then l + l+4, l + l+2, l + l+1);
// - softmax: the maximum (order-free), e^(s - max), their sum in 16 lanes over blocks of 16 keys
//   aligned to position 0 (missing keys add 0), the lanes summed by the same tree;
// - the output: the values weighted by e^(s - max) summed key by key from position 0 (fused
//   multiply-adds), then scaled by 1 / sum.
//
// Three implementations of those sums, chosen when it is built: 16-lane vectors (GCC/clang vector
// extensions: one AVX-512 register, four NEON ones), 8-lane halves of them for AVX2 (GCC moved the
// 16-lane vectors through the stack there, 6x slower), and plain C++ with no vector extension
// (DRAFTWISE_PORTABLE: any CPU, any C++ compiler). Every multiply-add that is fused is fused by name
// (an intrinsic or std::fma) and the kernels are built with -ffp-contract=off, so no compiler fuses
// or splits one of its own accord; with no -ffast-math none reorders a sum. So every build gives the
// same bits: tests/engine/test_row_invariance.py and tests/kernels/row_ops_test.cpp pin them.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

// The vector code is written for AVX-512, AVX2 (with FMA) and aarch64, in GCC's vector extensions
// (clang has them and defines __GNUC__ too); any other build is the plain C++ one.
#if !defined(DRAFTWISE_PORTABLE) && \
    !(defined(__GNUC__) && (defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__)) || defined(__aarch64__)))
#define DRAFTWISE_PORTABLE 1
#endif

#if !defined(DRAFTWISE_PORTABLE)
#if defined(__aarch64__)
#include <arm_neon.h>
#else
#include <immintrin.h>
#endif
#endif

namespace draftwise_rows {

constexpr int L = 16;

// ---- the arithmetic, written out one value at a time (the portable build, and the reference) ------

// The sum of 16 lanes by the fixed tree.
inline float tree16(const float* a) {
  float c[8], d[4];
  for (int l = 0; l < 8; ++l) c[l] = a[l] + a[l + 8];
  for (int l = 0; l < 4; ++l) d[l] = c[l] + c[l + 4];
  const float e0 = d[0] + d[2], e1 = d[1] + d[3];
  return e0 + e1;
}

// e^x for x <= 0 (scores less their maximum); below -87 it is 0. Cephes' expf: x = n ln2 + r, e^r
// by a degree-6 polynomial, 2^n put in the exponent bits. x is clamped to [-87, 0] first, so no
// exponent overflows (the vector builds compute lanes past the last key too).
inline float exp_nonpositive(float x) {
  const float xc = x < -87.0f ? -87.0f : (x > 0.0f ? 0.0f : x);
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding and taking it away rounds to an integer
  const float n = std::fma(xc, 1.44269504088896341f, magic) - magic;
  float r = std::fma(-n, 0.693359375f, xc);
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r * r, r) + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) * (1 << 23);
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x < -87.0f ? 0.0f : p * scale;
}

// One query row q[D * 16] of one head over keys 0..keys-1 (k, v: [keys][D * 16]): out[D * 16].
template <int D>
void attend_one_portable(const float* q, const float* k, const float* v, int64_t keys, float* out,
                         std::vector<float>& buf) {
  const int64_t padded = (keys + L - 1) / L * L;
  buf.resize(padded);
  float* s = buf.data();
  for (int64_t j = 0; j < padded; ++j) {
    if (j >= keys) { s[j] = 0.0f; continue; }
    const float* kj = k + j * D * L;
    float a[L];
    for (int l = 0; l < L; ++l) a[l] = q[l] * kj[l];
    for (int x = 1; x < D; ++x)
      for (int l = 0; l < L; ++l) a[l] = std::fma(q[x * L + l], kj[x * L + l], a[l]);
    s[j] = tree16(a);
  }
  float max = s[0];
  for (int64_t j = 1; j < keys; ++j) max = s[j] > max ? s[j] : max;
  float total[L] = {};
  for (int64_t j0 = 0; j0 < padded; j0 += L)
    for (int l = 0; l < L; ++l) {
      const float e = j0 + l < keys ? exp_nonpositive(s[j0 + l] - max) : 0.0f;  // missing keys add 0
      s[j0 + l] = e;
      total[l] = total[l] + e;
    }
  float o[D * L] = {};
  for (int64_t j = 0; j < keys; ++j) {
    const float* vj = v + j * D * L;
    for (int i = 0; i < D * L; ++i) o[i] = std::fma(s[j], vj[i], o[i]);
  }
  const float inv = 1.0f / tree16(total);
  for (int i = 0; i < D * L; ++i) out[i] = o[i] * inv;
}

#if !defined(DRAFTWISE_PORTABLE)
// ---- the same sums on vectors ----------------------------------------------------------------------

#if defined(__AVX2__) && !defined(__AVX512F__)
#define DRAFTWISE_ROWS_8 1  // AVX2: 8-lane halves
#endif

// GCC has __builtin_shufflevector from version 12 on; older ones take __builtin_shuffle's mask vector.
#if defined(__clang__) || __GNUC__ >= 12
#define DRAFTWISE_SHUFFLE(mask_type, a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define DRAFTWISE_SHUFFLE(mask_type, a, b, ...) __builtin_shuffle(a, b, mask_type{__VA_ARGS__})
#endif

#if defined(DRAFTWISE_ROWS_8)
typedef float v8 __attribute__((vector_size(8 * sizeof(float))));
typedef int32_t vi8 __attribute__((vector_size(8 * sizeof(int32_t))));

inline v8 load8(const float* p) { v8 v; std::memcpy(&v, p, sizeof v); return v; }
inline void store8(float* p, v8 v) { std::memcpy(p, &v, sizeof v); }
// a * b + c rounded once, lane by lane
inline v8 fmadd(v8 a, v8 b, v8 c) { return (v8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
#else
typedef float vf __attribute__((vector_size(L * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(L * sizeof(int32_t))));

inline vf load(const float* p) { vf v; std::memcpy(&v, p, sizeof v); return v; }
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
inline vf splat(float x) { return vf{} + x; }

// a * b + c rounded once, lane by lane
inline vf fmadd(vf a, vf b, vf c) {
#if defined(__AVX512F__)
  return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__aarch64__)
  float32x4_t x[4], y[4], z[4];
  std::memcpy(x, &a, sizeof a);
  std::memcpy(y, &b, sizeof b);
  std::memcpy(z, &c, sizeof c);
  for (int i = 0; i < 4; ++i) z[i] = vfmaq_f32(z[i], x[i], y[i]);
  std::memcpy(&c, z, sizeof c);
  return c;
#else
  for (int i = 0; i < L; ++i) c[i] = std::fma(a[i], b[i], c[i]);
  return c;
#endif
}

// 16 vectors -> one vector whose lane t is the sum of a[t]'s lanes by the fixed tree.
inline vf lane_sums(const vf* a) {
  vf h[8], q[4], e[2];
  for (int i = 0; i < 8; ++i)
    h[i] = DRAFTWISE_SHUFFLE(vi, a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           DRAFTWISE_SHUFFLE(vi, a[2 * i], a[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int i = 0; i < 4; ++i)
    q[i] = DRAFTWISE_SHUFFLE(vi, h[2 * i], h[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           DRAFTWISE_SHUFFLE(vi, h[2 * i], h[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  for (int i = 0; i < 2; ++i)
    e[i] = DRAFTWISE_SHUFFLE(vi, q[2 * i], q[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           DRAFTWISE_SHUFFLE(vi, q[2 * i], q[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  return DRAFTWISE_SHUFFLE(vi, e[0], e[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         DRAFTWISE_SHUFFLE(vi, e[0], e[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}
#endif

// exp_nonpositive lane by lane
template <typename V, typename VI>
inline V exp_lanes(V x) {
  const V lo = V{} - 87.0f, zero = V{};
  const V xc = x < lo ? lo : (x > zero ? zero : x);
  const V magic = V{} + 12582912.0f;
  const V n = fmadd(xc, V{} + 1.44269504088896341f, magic) - magic;
  V r = fmadd(-n, V{} + 0.693359375f, xc);
  r = fmadd(n, V{} + 2.12194440e-4f, r);
  V p = V{} + 1.9875691500e-4f;
  p = fmadd(p, r, V{} + 1.3981999507e-3f);
  p = fmadd(p, r, V{} + 8.3334519073e-3f);
  p = fmadd(p, r, V{} + 4.1665795894e-2f);
  p = fmadd(p, r, V{} + 1.6666665459e-1f);
  p = fmadd(p, r, V{} + 5.0000001201e-1f);
  p = fmadd(p, r * r, r) + 1.0f;
  VI bits = (__builtin_convertvector(n, VI) + 127) * (1 << 23);
  V scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x < lo ? zero : p * scale;
}

#if defined(DRAFTWISE_ROWS_8)
// attend_one_16 on 8-lane vectors (one AVX2 register each): each 16-lane vector is its two halves,
// and per key the first step of the tree (l + l+8) adds the halves, then the rest of the tree.
// b[t] holds key t's 16 lanes already added as l + l+8: the 8 keys' sums, in key order
inline v8 key_sums8(const v8* b) {
  v8 q[4], e[2];
  for (int i = 0; i < 4; ++i)
    q[i] = DRAFTWISE_SHUFFLE(vi8, b[2 * i], b[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
           DRAFTWISE_SHUFFLE(vi8, b[2 * i], b[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  for (int i = 0; i < 2; ++i)
    e[i] = DRAFTWISE_SHUFFLE(vi8, q[2 * i], q[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
           DRAFTWISE_SHUFFLE(vi8, q[2 * i], q[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15);
  return DRAFTWISE_SHUFFLE(vi8, e[0], e[1], 0, 2, 4, 6, 8, 10, 12, 14) +
         DRAFTWISE_SHUFFLE(vi8, e[0], e[1], 1, 3, 5, 7, 9, 11, 13, 15);
}

// Softmax's weights over one query's scores, in place: e^(s - max) for its keys, 0 for the lanes past
// the last key up to the block of 16; and their sums in 16 lanes (as two 8-lane halves), key block
// by key block from position 0.
inline void softmax_weights8(float* s, int64_t keys, v8& total_lo, v8& total_hi) {
  float max = s[0];
  for (int64_t j = 1; j < keys; ++j) max = s[j] > max ? s[j] : max;
  total_lo = v8{};
  total_hi = v8{};
  const int64_t padded = (keys + L - 1) / L * L;
  for (int64_t j0 = 0; j0 < padded; j0 += L) {
    v8 e_lo = exp_lanes<v8, vi8>(load8(s + j0) - max), e_hi = exp_lanes<v8, vi8>(load8(s + j0 + 8) - max);
    if (j0 + L > keys) {  // lanes past the last key count nothing
      alignas(32) float kept[L];
      store8(kept, e_lo);
      store8(kept + 8, e_hi);
      for (int t = static_cast<int>(keys - j0); t < L; ++t) kept[t] = 0.0f;
      e_lo = load8(kept);
      e_hi = load8(kept + 8);
    }
    store8(s + j0, e_lo);
    store8(s + j0 + 8, e_hi);
    total_lo = total_lo + e_lo;
    total_hi = total_hi + e_hi;
  }
}

template <int D>
void attend_one_8(const float* q, const float* k, const float* v, int64_t keys, float* out, std::vector<float>& buf) {
  const int64_t padded = (keys + L - 1) / L * L;
  buf.resize(padded);
  float* s = buf.data();
  v8 ql[D], qh[D];
  for (int x = 0; x < D; ++x) { ql[x] = load8(q + x * L); qh[x] = load8(q + x * L + 8); }
  for (int64_t j0 = 0; j0 < padded; j0 += 8) {
    v8 b[8];
    for (int t = 0; t < 8; ++t) {
      const int64_t j = j0 + t;
      if (j >= keys) { b[t] = v8{}; continue; }
      const float* kj = k + j * D * L;
      v8 lo = ql[0] * load8(kj), hi = qh[0] * load8(kj + 8);
      for (int x = 1; x < D; ++x) {
        lo = fmadd(ql[x], load8(kj + x * L), lo);
        hi = fmadd(qh[x], load8(kj + x * L + 8), hi);
      }
      b[t] = lo + hi;
    }
    store8(s + j0, key_sums8(b));
  }
  v8 total_lo, total_hi;
  softmax_weights8(s, keys, total_lo, total_hi);
  v8 ol[D], oh[D];
  for (int x = 0; x < D; ++x) { ol[x] = v8{}; oh[x] = v8{}; }
  for (int64_t j = 0; j < keys; ++j) {
    const float* vj = v + j * D * L;
    const v8 w = v8{} + s[j];
    for (int x = 0; x < D; ++x) {
      ol[x] = fmadd(w, load8(vj + x * L), ol[x]);
      oh[x] = fmadd(w, load8(vj + x * L + 8), oh[x]);
    }
  }
  alignas(32) float lanes[L];
  store8(lanes, total_lo);
  store8(lanes + 8, total_hi);
  const float inv = 1.0f / tree16(lanes);
  for (int x = 0; x < D; ++x) {
    store8(out + x * L, ol[x] * inv);
    store8(out + x * L + 8, oh[x] * inv);
  }
}

// attend_block_16 on 8-lane vectors: attend_one_8's operations for each query, the reading shared.
struct BlockScratch {
  std::vector<v8> acc;  // [query][8]: a block of 8 keys' lane sums (l + l+8), before the rest of the tree
  std::vector<float> s;  // [query][padded keys]
};

template <int D>
void attend_block_8(const float* const* qs, const int64_t* keys, int nq, const float* k, const float* v,
                    float* const* outs, BlockScratch& scratch) {
  int64_t most = 0;
  for (int i = 0; i < nq; ++i) most = keys[i] > most ? keys[i] : most;
  const int64_t padded = (most + L - 1) / L * L;
  scratch.acc.resize(static_cast<size_t>(nq) * 8);
  scratch.s.resize(static_cast<size_t>(nq) * padded);
  v8* acc = scratch.acc.data();
  float* s = scratch.s.data();
  for (int64_t j0 = 0; j0 < padded; j0 += 8) {
    for (int t = 0; t < 8; ++t) {
      const int64_t j = j0 + t;
      v8 kl[D], kh[D];
      if (j < most)
        for (int x = 0; x < D; ++x) { kl[x] = load8(k + j * D * L + x * L); kh[x] = load8(k + j * D * L + x * L + 8); }
      for (int i = 0; i < nq; ++i) {
        if (j >= keys[i]) { acc[i * 8 + t] = v8{}; continue; }
        const float* q = qs[i];
        v8 lo = load8(q) * kl[0], hi = load8(q + 8) * kh[0];
        for (int x = 1; x < D; ++x) {
          lo = fmadd(load8(q + x * L), kl[x], lo);
          hi = fmadd(load8(q + x * L + 8), kh[x], hi);
        }
        acc[i * 8 + t] = lo + hi;
      }
    }
    for (int i = 0; i < nq; ++i)
      if (j0 < (keys[i] + L - 1) / L * L) store8(s + i * padded + j0, key_sums8(acc + i * 8));
  }
  alignas(32) float lanes[L];
  float inv[64];
  for (int i = 0; i < nq; ++i) {  // attend_one_8's softmax, query by query
    float* si = s + i * padded;
    const int64_t n = keys[i];
    v8 total_lo, total_hi;
    softmax_weights8(si, n, total_lo, total_hi);
    store8(lanes, total_lo);
    store8(lanes + 8, total_hi);
    inv[i] = 1.0f / tree16(lanes);
  }
  constexpr int Q = D <= 2 ? 4 : (D <= 4 ? 2 : 1);  // 2 * D * Q sums in 16 registers
  for (int i0 = 0; i0 < nq; i0 += Q) {
    const int m = nq - i0 < Q ? nq - i0 : Q;
    v8 ol[Q][D], oh[Q][D];
    int64_t reach = 0;
    for (int i = 0; i < m; ++i) {
      for (int x = 0; x < D; ++x) { ol[i][x] = v8{}; oh[i][x] = v8{}; }
      reach = keys[i0 + i] > reach ? keys[i0 + i] : reach;
    }
    for (int64_t j = 0; j < reach; ++j) {
      const float* vj = v + j * D * L;
      for (int i = 0; i < m; ++i) {
        if (j >= keys[i0 + i]) continue;
        const v8 w = v8{} + s[(i0 + i) * padded + j];
        for (int x = 0; x < D; ++x) {
          ol[i][x] = fmadd(w, load8(vj + x * L), ol[i][x]);
          oh[i][x] = fmadd(w, load8(vj + x * L + 8), oh[i][x]);
        }
      }
    }
    for (int i = 0; i < m; ++i)
      for (int x = 0; x < D; ++x) {
        store8(outs[i0 + i] + x * L, ol[i][x] * inv[i0 + i]);
        store8(outs[i0 + i] + x * L + 8, oh[i][x] * inv[i0 + i]);
      }
  }
}
#else
// Softmax's weights over one query's scores, in place: e^(s - max) for its keys, 0 for the lanes past
// the last key up to the block of 16; and their sums in 16 lanes, key block by key block from 0.
inline vf softmax_weights16(float* s, int64_t keys) {
  float max = s[0];
  for (int64_t j = 1; j < keys; ++j) max = s[j] > max ? s[j] : max;
  vf total = splat(0.0f);
  const int64_t padded = (keys + L - 1) / L * L;
  for (int64_t j0 = 0; j0 < padded; j0 += L) {
    vf e = exp_lanes<vf, vi>(load(s + j0) - max);
    if (j0 + L > keys) {  // lanes past the last key count nothing
      alignas(64) float kept[L];
      store(kept, e);
      for (int t = static_cast<int>(keys - j0); t < L; ++t) kept[t] = 0.0f;
      e = load(kept);
    }
    store(s + j0, e);
    total = total + e;
  }
  return total;
}

template <int D>
void attend_one_16(const float* q, const float* k, const float* v, int64_t keys, float* out, std::vector<float>& buf) {
  const int64_t padded = (keys + L - 1) / L * L;
  buf.resize(padded);
  float* s = buf.data();
  vf qv[D];
  for (int x = 0; x < D; ++x) qv[x] = load(q + x * L);
  for (int64_t j0 = 0; j0 < padded; j0 += L) {
    vf acc[L];
    for (int t = 0; t < L; ++t) {
      const int64_t j = j0 + t;
      if (j >= keys) { acc[t] = splat(0.0f); continue; }
      const float* kj = k + j * D * L;
      vf a = qv[0] * load(kj);
      for (int x = 1; x < D; ++x) a = fmadd(qv[x], load(kj + x * L), a);
      acc[t] = a;
    }
    store(s + j0, lane_sums(acc));
  }
  const vf total = softmax_weights16(s, keys);
  vf o[D];
  for (int x = 0; x < D; ++x) o[x] = splat(0.0f);
  for (int64_t j = 0; j < keys; ++j) {
    const float* vj = v + j * D * L;
    const vf w = splat(s[j]);
    for (int x = 0; x < D; ++x) o[x] = fmadd(w, load(vj + x * L), o[x]);
  }
  alignas(64) float lanes[L];
  store(lanes, total);
  const float inv = 1.0f / tree16(lanes);
  for (int x = 0; x < D; ++x) store(out + x * L, o[x] * inv);
}

// Many queries over one kv head's cache at once (a prompt's rows, and the query heads that share the kv
// head): each query's scores, softmax and output are computed by exactly attend_one_16's operations in
// its order, so each gives the bits attend_one_16 gives it alone. What is shared is the reading: a key
// is loaded once for every query's dot product, a value once for a few queries' sums, where one query
// at a time read the whole cache again (at 1,024 keys, a layer's K and V are 512 KB for each of a
// 256-row prompt's 3,584 queries on the 0.5B: the cache's reading, not the arithmetic, was the cost).
struct BlockScratch {
  std::vector<vf> acc;  // [query][16]: a block of 16 keys' lane products, before their tree
  std::vector<float> s;  // [query][padded keys]: scores, then e^(score - max)
};

template <int D>
void attend_block_16(const float* const* qs, const int64_t* keys, int nq, const float* k, const float* v,
                     float* const* outs, BlockScratch& scratch) {
  int64_t most = 0;
  for (int i = 0; i < nq; ++i) most = keys[i] > most ? keys[i] : most;
  const int64_t padded = (most + L - 1) / L * L;
  scratch.acc.resize(static_cast<size_t>(nq) * L);
  scratch.s.resize(static_cast<size_t>(nq) * padded);
  vf* acc = scratch.acc.data();
  float* s = scratch.s.data();
  for (int64_t j0 = 0; j0 < padded; j0 += L) {
    for (int t = 0; t < L; ++t) {
      const int64_t j = j0 + t;
      vf kv[D];
      if (j < most)
        for (int x = 0; x < D; ++x) kv[x] = load(k + j * D * L + x * L);
      for (int i = 0; i < nq; ++i) {
        if (j >= keys[i]) { acc[i * L + t] = splat(0.0f); continue; }
        const float* q = qs[i];
        vf a = load(q) * kv[0];
        for (int x = 1; x < D; ++x) a = fmadd(load(q + x * L), kv[x], a);
        acc[i * L + t] = a;
      }
    }
    for (int i = 0; i < nq; ++i)
      if (j0 < keys[i]) store(s + i * padded + j0, lane_sums(acc + i * L));
  }
  alignas(64) float lanes[L];
  float inv[64];
  for (int i = 0; i < nq; ++i) {  // attend_one_16's softmax, query by query
    float* si = s + i * padded;
    store(lanes, softmax_weights16(si, keys[i]));
    inv[i] = 1.0f / tree16(lanes);
  }
  // the values, key by key from position 0 for each query (its fused multiply-adds in attend_one_16's
  // order), a few queries at a time so that their sums stay in registers while each value is loaded once
  constexpr int Q = D <= 4 ? 4 : (D <= 8 ? 2 : 1);
  for (int i0 = 0; i0 < nq; i0 += Q) {
    const int m = nq - i0 < Q ? nq - i0 : Q;
    vf o[Q][D];
    int64_t reach = 0;
    for (int i = 0; i < m; ++i) {
      for (int x = 0; x < D; ++x) o[i][x] = splat(0.0f);
      reach = keys[i0 + i] > reach ? keys[i0 + i] : reach;
    }
    for (int64_t j = 0; j < reach; ++j) {
      vf vv[D];
      for (int x = 0; x < D; ++x) vv[x] = load(v + j * D * L + x * L);
      for (int i = 0; i < m; ++i) {
        if (j >= keys[i0 + i]) continue;
        const vf w = splat(s[(i0 + i) * padded + j]);
        for (int x = 0; x < D; ++x) o[i][x] = fmadd(w, vv[x], o[i][x]);
      }
    }
    for (int i = 0; i < m; ++i)
      for (int x = 0; x < D; ++x) store(outs[i0 + i] + x * L, o[i][x] * inv[i0 + i]);
  }
}

#endif
#endif

// This build's implementation, and its name (row_ops.cpp reports it).
template <int D>
inline void attend_one(const float* q, const float* k, const float* v, int64_t keys, float* out, std::vector<float>& buf) {
#if defined(DRAFTWISE_PORTABLE)
  attend_one_portable<D>(q, k, v, keys, out, buf);
#elif defined(DRAFTWISE_ROWS_8)
  attend_one_8<D>(q, k, v, keys, out, buf);
#else
  attend_one_16<D>(q, k, v, keys, out, buf);
#endif
}

inline const char* implementation() {
#if defined(DRAFTWISE_PORTABLE)
  return "portable";
#elif defined(DRAFTWISE_ROWS_8)
  return "8-lane";
#else
  return "16-lane";
#endif
}

// Rows start..start+n-1 of one head size (D * 16) over a layer's cache: q [n][heads][D * 16],
// k, v [kv_heads][cache_len][D * 16], out [n][heads][D * 16]; row r attends keys 0..start+r. Tasks
// [first, last) of the n * heads (row, head) pairs, so a caller can split them among threads.
template <int D>
void attend_tasks(const float* q, const float* k, const float* v, float* out, int64_t heads, int64_t kv_heads,
                  int64_t cache_len, int64_t start, int64_t first, int64_t last) {
  const int64_t group = heads / kv_heads, d = D * L;
  std::vector<float> buf;
  for (int64_t task = first; task < last; ++task) {
    const int64_t r = task / heads, h = task % heads, offset = (h / group) * cache_len * d;
    attend_one<D>(q + (r * heads + h) * d, k + offset, v + offset, start + r + 1, out + (r * heads + h) * d, buf);
  }
}

#if !defined(DRAFTWISE_PORTABLE)
// Rows of a block that share each key's and value's reading, with the query heads of their kv head.
constexpr int64_t BLOCK_ROWS = 2;
constexpr int MAX_BLOCK_QUERIES = 64;  // attend_block_16's per-query room (BLOCK_ROWS x query heads a kv head)

// How many tasks attend_blocked splits rows start..start+n-1 into: (block of rows, kv head) pairs.
inline int64_t blocked_tasks(int64_t n, int64_t heads, int64_t kv_heads) {
  return heads / kv_heads * BLOCK_ROWS <= MAX_BLOCK_QUERIES ? (n + BLOCK_ROWS - 1) / BLOCK_ROWS * kv_heads : 0;
}

template <int D>
void attend_blocked_tasks(const float* q, const float* k, const float* v, float* out, int64_t n, int64_t heads,
                          int64_t kv_heads, int64_t cache_len, int64_t start, int64_t first, int64_t last) {
  const int64_t group = heads / kv_heads, d = D * L;
  BlockScratch scratch;
  const float* qs[MAX_BLOCK_QUERIES];
  float* outs[MAX_BLOCK_QUERIES];
  int64_t keys[MAX_BLOCK_QUERIES];
  for (int64_t task = first; task < last; ++task) {
    const int64_t block = task / kv_heads, g = task % kv_heads, offset = g * cache_len * d;
    int nq = 0;
    for (int64_t r = block * BLOCK_ROWS; r < n && r < (block + 1) * BLOCK_ROWS; ++r)
      for (int64_t h = g * group; h < (g + 1) * group; ++h, ++nq) {
        qs[nq] = q + (r * heads + h) * d;
        outs[nq] = out + (r * heads + h) * d;
        keys[nq] = start + r + 1;
      }
#if defined(DRAFTWISE_ROWS_8)
    attend_block_8<D>(qs, keys, nq, k + offset, v + offset, outs, scratch);
#else
    attend_block_16<D>(qs, keys, nq, k + offset, v + offset, outs, scratch);
#endif
  }
}

// attend_blocked_tasks for a head size given at run time: false where it is not one of these.
inline bool attend_blocked(int64_t head_dim, const float* q, const float* k, const float* v, float* out, int64_t n,
                           int64_t heads, int64_t kv_heads, int64_t cache_len, int64_t start, int64_t first,
                           int64_t last) {
  switch (head_dim) {
    case 16: attend_blocked_tasks<1>(q, k, v, out, n, heads, kv_heads, cache_len, start, first, last); return true;
    case 32: attend_blocked_tasks<2>(q, k, v, out, n, heads, kv_heads, cache_len, start, first, last); return true;
    case 64: attend_blocked_tasks<4>(q, k, v, out, n, heads, kv_heads, cache_len, start, first, last); return true;
    case 80: attend_blocked_tasks<5>(q, k, v, out, n, heads, kv_heads, cache_len, start, first, last); return true;
    case 96: attend_blocked_tasks<6>(q, k, v, out, n, heads, kv_heads, cache_len, start, first, last); return true;
    case 128: attend_blocked_tasks<8>(q, k, v, out, n, heads, kv_heads, cache_len, start, first, last); return true;
    case 256: attend_blocked_tasks<16>(q, k, v, out, n, heads, kv_heads, cache_len, start, first, last); return true;
    default: return false;
  }
}
#else
inline int64_t blocked_tasks(int64_t, int64_t, int64_t) { return 0; }  // this build runs a query at a time
inline bool attend_blocked(int64_t, const float*, const float*, const float*, float*, int64_t, int64_t, int64_t,
                           int64_t, int64_t, int64_t, int64_t) { return false; }
#endif

// attend_tasks for a head size given at run time: false where it is not one of these.
inline bool attend(int64_t head_dim, const float* q, const float* k, const float* v, float* out, int64_t heads,
                   int64_t kv_heads, int64_t cache_len, int64_t start, int64_t first, int64_t last) {
  switch (head_dim) {
    case 16: attend_tasks<1>(q, k, v, out, heads, kv_heads, cache_len, start, first, last); return true;
    case 32: attend_tasks<2>(q, k, v, out, heads, kv_heads, cache_len, start, first, last); return true;
    case 64: attend_tasks<4>(q, k, v, out, heads, kv_heads, cache_len, start, first, last); return true;
    case 80: attend_tasks<5>(q, k, v, out, heads, kv_heads, cache_len, start, first, last); return true;
    case 96: attend_tasks<6>(q, k, v, out, heads, kv_heads, cache_len, start, first, last); return true;
    case 128: attend_tasks<8>(q, k, v, out, heads, kv_heads, cache_len, start, first, last); return true;
    case 256: attend_tasks<16>(q, k, v, out, heads, kv_heads, cache_len, start, first, last); return true;
    default: return false;
  }
}

}  // namespace draftwise_rows
