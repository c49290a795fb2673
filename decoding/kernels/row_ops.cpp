// Attention for the static forward, computed so that a row's result depends on its position and the
// cache alone: not on how many rows the forward has, nor on how many threads run it
// (decoding/kernels/row_ops.py says where it runs).
//
// Why: BLAS matmuls split their work by the thread count and the matrix shape. At 8 threads a
// 14-row verify forward's attention (its 98 x 64 probabilities-times-values product) summed in
// another order than a one-token step's, so a verify row differed from the step at its position and
// speculation could change the text. Here every (row, head) pair is one task for one thread, and its
// sums run in an order fixed by this code:
// - a score is the dot product of the query with one key: 16 lanes of products over the head's
//   dimensions, the lanes then summed by a fixed tree; keys go in blocks of 16 aligned to position 0,
//   so key j always takes lane j % 16 and the same tree;
// - softmax: the maximum (order-free), e^(s - max) lane by lane, their sum over the same aligned
//   blocks (missing keys add 0.0), the lanes summed by the fixed tree;
// - the output: the values weighted by e^(s - max) summed key by key from position 0, then scaled
//   by 1 / sum.
// Nothing depends on the thread count or on rows other than the task's own.
//
// Written with GCC/Clang vector extensions (16 lanes of float): the compiler maps them to the
// CPU's registers (AVX-512: one, NEON: four). On AVX2 GCC moved them through the stack, so AVX2
// builds run attend_one_avx2, the same sums on 8-lane halves. No -ffast-math: the compiler keeps
// the order of every sum as written. tests/engine/test_row_invariance.py pins the bits every build
// must give.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int L = 16;
typedef float vf __attribute__((vector_size(L * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(L * sizeof(int32_t))));

inline vf load(const float* p) { vf v; std::memcpy(&v, p, sizeof v); return v; }
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
inline vf splat(float x) { return vf{} + x; }

// 16 vectors -> one vector whose lane t is the sum of a[t]'s lanes, by a fixed tree (every lane's
// sum is added up in the same order).
inline vf lane_sums(const vf* a) {
  vf h[8], q[4], e[2];
  for (int i = 0; i < 8; ++i)
    h[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(a[2 * i], a[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int i = 0; i < 4; ++i)
    q[i] = __builtin_shufflevector(h[2 * i], h[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(h[2 * i], h[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  for (int i = 0; i < 2; ++i)
    e[i] = __builtin_shufflevector(q[2 * i], q[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           __builtin_shufflevector(q[2 * i], q[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  return __builtin_shufflevector(e[0], e[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(e[0], e[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

// The sum of one vector's lanes by lane_sums' tree.
inline float lane_sum(vf v) {
  vf a[L] = {};
  a[0] = v;
  float out[L];
  store(out, lane_sums(a));
  return out[0];
}

// e^x for x <= 0 (scores less their maximum), lane by lane; below -87 it is 0. Cephes' expf: x =
// n ln2 + r, e^r by a degree-6 polynomial, 2^n put in the exponent bits. Lanes past the last key
// hold anything: clamped to [-87, 0] first, so no lane's exponent overflows.
template <typename V, typename VI>
inline V exp_nonpositive(V x) {
  const V lo = V{} - 87.0f, zero = V{};
  const V xc = x < lo ? lo : (x > zero ? zero : x);
  const V magic = V{} + 12582912.0f;  // 1.5 * 2^23: adding and taking it away rounds to an integer
  const V n = (xc * 1.44269504088896341f + magic) - magic;
  V r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  V p = V{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  VI bits = (__builtin_convertvector(n, VI) + 127) << 23;
  V scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return x < lo ? zero : p * scale;
}

// One query row of one head over keys 0..keys-1: out[d] (D vectors of 16 dimensions).
template <int D>
void attend_one(const float* q, const float* k, const float* v, int64_t keys, float* out, std::vector<float>& buf) {
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
      for (int x = 1; x < D; ++x) a = a + qv[x] * load(kj + x * L);
      acc[t] = a;
    }
    store(s + j0, lane_sums(acc));
  }
  float max = s[0];
  for (int64_t j = 1; j < keys; ++j) max = s[j] > max ? s[j] : max;
  vf total = splat(0.0f);
  for (int64_t j0 = 0; j0 < padded; j0 += L) {
    vf e = exp_nonpositive<vf, vi>(load(s + j0) - max);
    if (j0 + L > keys) {  // lanes past the last key count nothing
      alignas(64) float kept[L];
      store(kept, e);
      for (int t = static_cast<int>(keys - j0); t < L; ++t) kept[t] = 0.0f;
      e = load(kept);
    }
    store(s + j0, e);
    total = total + e;
  }
  vf o[D];
  for (int x = 0; x < D; ++x) o[x] = splat(0.0f);
  for (int64_t j = 0; j < keys; ++j) {
    const float* vj = v + j * D * L;
    const float w = s[j];
    for (int x = 0; x < D; ++x) o[x] = o[x] + w * load(vj + x * L);
  }
  const float inv = 1.0f / lane_sum(total);
  for (int x = 0; x < D; ++x) store(out + x * L, o[x] * inv);
}

#if defined(__AVX2__) && !defined(__AVX512F__)
// attend_one for AVX2 builds, on 8-lane vectors (one register each). GCC lowers the 16-lane vectors
// above through the stack on AVX2 (a head over 1,100 keys took 52 us, against 8 on AVX-512); here
// each 16-lane vector is its two halves and every sum is the one attend_one makes: lane by lane the
// same multiply-adds, and per key the same tree (lanes l + l+8, then l + l+4, l + l+2, l + l+1), so
// the bits are attend_one's on every CPU.
typedef float v8 __attribute__((vector_size(8 * sizeof(float))));
typedef int32_t vi8 __attribute__((vector_size(8 * sizeof(int32_t))));

inline v8 load8(const float* p) { v8 v; std::memcpy(&v, p, sizeof v); return v; }
inline void store8(float* p, v8 v) { std::memcpy(p, &v, sizeof v); }

// b[t] holds key t's 16 lanes already added as l + l+8: the 8 keys' sums, in key order
inline v8 key_sums8(const v8* b) {
  v8 q[4], e[2];
  for (int i = 0; i < 4; ++i)
    q[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
           __builtin_shufflevector(b[2 * i], b[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  for (int i = 0; i < 2; ++i)
    e[i] = __builtin_shufflevector(q[2 * i], q[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
           __builtin_shufflevector(q[2 * i], q[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15);
  return __builtin_shufflevector(e[0], e[1], 0, 2, 4, 6, 8, 10, 12, 14) +
         __builtin_shufflevector(e[0], e[1], 1, 3, 5, 7, 9, 11, 13, 15);
}

template <int D>
void attend_one_avx2(const float* q, const float* k, const float* v, int64_t keys, float* out, std::vector<float>& buf) {
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
        lo = lo + ql[x] * load8(kj + x * L);
        hi = hi + qh[x] * load8(kj + x * L + 8);
      }
      b[t] = lo + hi;
    }
    store8(s + j0, key_sums8(b));
  }
  float max = s[0];
  for (int64_t j = 1; j < keys; ++j) max = s[j] > max ? s[j] : max;
  v8 total_lo = v8{}, total_hi = v8{};
  for (int64_t j0 = 0; j0 < padded; j0 += L) {
    v8 e_lo = exp_nonpositive<v8, vi8>(load8(s + j0) - max), e_hi = exp_nonpositive<v8, vi8>(load8(s + j0 + 8) - max);
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
  v8 ol[D], oh[D];
  for (int x = 0; x < D; ++x) { ol[x] = v8{}; oh[x] = v8{}; }
  for (int64_t j = 0; j < keys; ++j) {
    const float* vj = v + j * D * L;
    const float w = s[j];
    for (int x = 0; x < D; ++x) {
      ol[x] = ol[x] + w * load8(vj + x * L);
      oh[x] = oh[x] + w * load8(vj + x * L + 8);
    }
  }
  // lane_sum's tree over the total's 16 lanes
  alignas(32) float t8[8];
  store8(t8, total_lo + total_hi);
  const float c0 = t8[0] + t8[4], c1 = t8[1] + t8[5], c2 = t8[2] + t8[6], c3 = t8[3] + t8[7];
  const float inv = 1.0f / ((c0 + c2) + (c1 + c3));
  for (int x = 0; x < D; ++x) {
    store8(out + x * L, ol[x] * inv);
    store8(out + x * L + 8, oh[x] * inv);
  }
}
#define ATTEND_ONE attend_one_avx2
#else
#define ATTEND_ONE attend_one
#endif

template <int D>
void attend_rows(const float* q, const float* k, const float* v, float* out, int64_t n, int64_t heads,
                 int64_t kv_heads, int64_t cache_len, int64_t start) {
  const int64_t group = heads / kv_heads, d = D * L;
  // one task per (row, head): a decode step's 14 heads keep every thread busy
  at::parallel_for(0, n * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> buf;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t r = task / heads, h = task % heads, kvh = h / group;
      const int64_t offset = kvh * cache_len * d;
      ATTEND_ONE<D>(q + (r * heads + h) * d, k + offset, v + offset, start + r + 1, out + (r * heads + h) * d, buf);
    }
  });
}

}  // namespace

// q [n, heads, d] float32 (already scaled), k and v [kv_heads, cache_len, d] float32 (one layer's
// cache, rows start..start+n-1 written): [n, heads * d], row r attending keys 0..start+r.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t start) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat && q.is_contiguous(), "causal_attention: q [n, h, d] float32");
  TORCH_CHECK(k.dim() == 3 && k.scalar_type() == at::kFloat && k.is_contiguous() && v.sizes() == k.sizes() &&
              v.scalar_type() == at::kFloat && v.is_contiguous(), "causal_attention: k, v [kvh, len, d] float32");
  const int64_t n = q.size(0), heads = q.size(1), d = q.size(2), kv_heads = k.size(0), cache_len = k.size(1);
  TORCH_CHECK(k.size(2) == d && heads % kv_heads == 0, "causal_attention: heads");
  TORCH_CHECK(start >= 0 && start + n <= cache_len, "causal_attention: rows past the cache");
  auto out = at::empty({n, heads * d}, q.options());
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  switch (d) {
    case 32: attend_rows<2>(qp, kp, vp, op, n, heads, kv_heads, cache_len, start); break;
    case 64: attend_rows<4>(qp, kp, vp, op, n, heads, kv_heads, cache_len, start); break;
    case 80: attend_rows<5>(qp, kp, vp, op, n, heads, kv_heads, cache_len, start); break;
    case 96: attend_rows<6>(qp, kp, vp, op, n, heads, kv_heads, cache_len, start); break;
    case 128: attend_rows<8>(qp, kp, vp, op, n, heads, kv_heads, cache_len, start); break;
    case 256: attend_rows<16>(qp, kp, vp, op, n, heads, kv_heads, cache_len, start); break;
    default: TORCH_CHECK(false, "causal_attention: head size ", d, " (32, 64, 80, 96, 128 or 256)");
  }
  return out;
}

TORCH_LIBRARY(draftwise_rows, lib) {
  lib.def("causal_attention(Tensor q, Tensor k, Tensor v, int start) -> Tensor");
}

TORCH_LIBRARY_IMPL(draftwise_rows, CPU, lib) {
  lib.impl("causal_attention", &causal_attention);
}
