// What every instruction set's kernel file (avx512vnni.cpp, avx2.cpp, neon.cpp)
// shares: the two ops' argument checks, their registration with torch, and how they split work
// among threads (parallel.h). Each file includes this once and defines the two ops declared here.
// Only the headers the ops need: with torch/extension.h (Python, pybind11, all of ATen's ops) a
// kernel took 26 s of compiler time, with these 6.5 s.
#pragma once
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "parallel.h"

// x [M, K] float32 -> [M, N] float32 (integer_linear.py: Int8Linear's and Q4Linear's layouts)
at::Tensor q8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& weight_sums,
                     const at::Tensor& scale);
at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                     const at::Tensor& lows, int64_t group);

namespace draftwise_ops {

// x [M, K] float32; packed [N/16, K/4, 64] int8; scale [N] float32: x made contiguous.
inline at::Tensor checked_q8(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "q8_linear: x must be [M, K] float32");
  TORCH_CHECK(packed.scalar_type() == at::kChar && packed.dim() == 3 && packed.size(2) == 64 &&
              packed.is_contiguous(), "q8_linear: packed must be contiguous [N/16, K/4, 64] int8");
  TORCH_CHECK(packed.size(1) * 4 == x.size(1), "q8_linear: shapes");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.numel() == packed.size(0) * 16 && scale.is_contiguous(),
              "q8_linear: scale must be float32 [N]");
  return x.contiguous();
}

// x [M, K] float32; packed [N/16, K/8, 64] uint8; scales, lows [N/16, K/group, 16] fp16: x contiguous.
inline at::Tensor checked_q4(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                             const at::Tensor& lows, int64_t group) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "q4_linear: x must be [M, K] float32");
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 3 && packed.size(2) == 64, "q4_linear: packed");
  const int64_t k = x.size(1), blocks = packed.size(0);
  TORCH_CHECK(group > 0 && packed.size(1) * 8 == k && k % group == 0 && group % 8 == 0, "q4_linear: shapes");
  TORCH_CHECK(packed.is_contiguous() && scales.is_contiguous() && lows.is_contiguous(), "q4_linear: layout");
  TORCH_CHECK(scales.scalar_type() == at::kHalf && lows.scalar_type() == at::kHalf &&
              scales.numel() == blocks * (k / group) * 16 && lows.numel() == scales.numel(),
              "q4_linear: scales and lows must be fp16 [N/16, K/group, 16]");
  return x.contiguous();
}

}  // namespace draftwise_ops

TORCH_LIBRARY(draftwise, lib) {
  lib.def("q4_linear(Tensor x, Tensor packed, Tensor scales, Tensor lows, int group) -> Tensor");
  lib.def("q8_linear(Tensor x, Tensor packed, Tensor weight_sums, Tensor scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(draftwise, CPU, lib) {
  lib.impl("q4_linear", &q4_linear);
  lib.impl("q8_linear", &q8_linear);
}
