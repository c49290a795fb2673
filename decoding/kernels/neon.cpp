// avx512vnni.cpp's ops for aarch64 with the dot-product extension: neon_core.h's blocks, on
// torch's threads (blocks of 16 outputs split among them, as on x86).
#include "ops.h"  // the ops' checks and their registration
#include "neon_core.h"

namespace {

void quantize_rows(const float* x, int64_t rows, int64_t k, int8_t* xq, float* scales) {
  draftwise::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) draftwise_neon::quantize_row(x + m * k, k, xq + m * k, scales + m);
  });
}

}  // namespace

at::Tensor q8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& weight_sums,
                     const at::Tensor& scale) {
  const auto xc = draftwise_ops::checked_q8(x, packed, scale);
  const int64_t m = xc.size(0), k = xc.size(1), blocks = packed.size(0), n = blocks * 16;
  (void)weight_sums;  // signed activations need no offset correction here
  auto out = at::empty({m, n}, xc.options());
  auto xq = at::empty({m, k}, xc.options().dtype(at::kChar));
  auto xs = at::empty({m}, xc.options());
  quantize_rows(xc.data_ptr<float>(), m, k, xq.data_ptr<int8_t>(), xs.data_ptr<float>());
  const int8_t *w = packed.data_ptr<int8_t>(), *q = xq.data_ptr<int8_t>();
  const float *sp = xs.data_ptr<float>(), *sc = scale.data_ptr<float>();
  float* o = out.data_ptr<float>();
  draftwise::parallel_for(0, blocks, 8, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      for (int64_t r = 0; r < m; ++r)
        draftwise_neon::q8_block_row(w + b * k * 16, q + r * k, sp[r], sc + b * 16, k, o + r * n + b * 16);
  });
  return out;
}

at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                     const at::Tensor& lows, int64_t group) {
  const auto xc = draftwise_ops::checked_q4(x, packed, scales, lows, group);
  const int64_t m = xc.size(0), k = xc.size(1), blocks = packed.size(0), n = blocks * 16;
  const int64_t groups = k / group;
  auto out = at::empty({m, n}, xc.options());
  auto xq = at::empty({m, k}, xc.options().dtype(at::kChar));
  auto xs = at::empty({m}, xc.options());
  auto gsum = at::empty({m, groups}, xc.options().dtype(at::kInt));
  quantize_rows(xc.data_ptr<float>(), m, k, xq.data_ptr<int8_t>(), xs.data_ptr<float>());
  const int8_t* q = xq.data_ptr<int8_t>();
  int32_t* gs = gsum.data_ptr<int32_t>();
  for (int64_t r = 0; r < m; ++r) draftwise_neon::group_sums(q + r * k, k, group, gs + r * groups);
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const auto* sc = reinterpret_cast<const uint16_t*>(scales.data_ptr<at::Half>());
  const auto* lo = reinterpret_cast<const uint16_t*>(lows.data_ptr<at::Half>());
  const float* s = xs.data_ptr<float>();
  float* o = out.data_ptr<float>();
  draftwise::parallel_for(0, blocks, 8, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      for (int64_t r = 0; r < m; ++r)
        draftwise_neon::q4_block_row(w + b * k * 8, sc + b * groups * 16, lo + b * groups * 16, q + r * k,
                                     gs + r * groups, s[r], k, group, o + r * n + b * 16);
  });
  return out;
}
