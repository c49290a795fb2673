// avx512vnni.cpp's ops for aarch64 with the dot-product extension: neon_core.h's blocks, on
// torch's threads (blocks of 16 outputs split among them, as on x86).
#include "ops.h"  // the ops' checks, their drivers and their registration
#include "neon_core.h"

namespace {

// ops.h's drivers on NEON: neon_core.h's kernels, torch-free so qemu tests them, take one row a block.
struct Neon {
  static constexpr int ROWS = 1;
  static constexpr bool Q8_OFFSET = false;  // `sdot` multiplies signed by signed: no offset correction

  static void q8_quantize_row(const float* r, int64_t k, int8_t* out, float* scale) {
    draftwise_neon::quantize_row(r, k, out, scale);
  }
  static void q4_quantize_row(const float* r, int64_t k, int8_t* out, float* scale) {
    draftwise_neon::quantize_row(r, k, out, scale);
  }

  template <int R>
  static void q8_block_rows(const int8_t* w, const float* wscale, const int32_t* /*wsum*/, const int8_t* const* xq,
                            const float* xs, int64_t k, float* const* out) {
    static_assert(R == 1, "neon_core.h's blocks take one row");
    draftwise_neon::q8_block_row(w, xq[0], xs[0], wscale, k, out[0]);
  }

  template <int R>
  static void q4_block_rows(const uint8_t* w, const at::Half* sc, const at::Half* lo, const int8_t* const* xq,
                            const int32_t* const* gsum, const float* xs, int64_t k, int64_t group, float* const* out) {
    static_assert(R == 1, "neon_core.h's blocks take one row");
    draftwise_neon::q4_block_row(w, reinterpret_cast<const uint16_t*>(sc), reinterpret_cast<const uint16_t*>(lo),
                                 xq[0], gsum[0], xs[0], k, group, out[0]);
  }
};

}  // namespace

at::Tensor q8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& weight_sums,
                     const at::Tensor& scale) {
  return draftwise_ops::q8_linear_on<Neon>(x, packed, weight_sums, scale);
}

at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                     const at::Tensor& lows, int64_t group) {
  return draftwise_ops::q4_linear_on<Neon>(x, packed, scales, lows, group);
}
