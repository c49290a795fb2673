// What every instruction set's kernel file (avx512vnni.cpp, avx2.cpp, neon.cpp)
// shares: the two ops' argument checks, their registration with torch (and the int4 packing's grid
// fit, grid_fit.h), and how they split work
// among threads (parallel.h). Each file includes this once and defines the two ops declared here.
// Only the headers the ops need: with torch/extension.h (Python, pybind11, all of ATen's ops) a
// kernel took 26 s of compiler time, with these 6.5 s.
#pragma once
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <tuple>

#include "grid_fit.h"  // packing's grids (fit_int4_grids below)
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

// groups [G, group] float32 -> (scales [G] and lows [G] float32 holding fp16 values, codes [G, group]
// uint8): grid_fit.h. Threads take whole blocks of 16 groups, so the bits never depend on their number.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> fit_int4_grids(const at::Tensor& groups, int64_t refits) {
  TORCH_CHECK(groups.dim() == 2 && groups.scalar_type() == at::kFloat && groups.is_contiguous(),
              "fit_int4_grids: groups must be contiguous [G, group] float32");
  const int64_t count = groups.size(0), group = groups.size(1), lanes = draftwise_fit::LANES;
  TORCH_CHECK(group >= 1 && group <= draftwise_fit::MAX_GROUP, "fit_int4_grids: groups of 1 to 256 weights");
  at::Tensor scales = at::empty({count}, groups.options()), lows = at::empty({count}, groups.options());
  at::Tensor codes = at::empty({count, group}, groups.options().dtype(at::kByte));
  const float* in = groups.data_ptr<float>();
  float *scale = scales.data_ptr<float>(), *low = lows.data_ptr<float>();
  uint8_t* code = codes.data_ptr<uint8_t>();
  draftwise::parallel_for(0, (count + lanes - 1) / lanes, 16, [&](int64_t begin, int64_t end) {
    draftwise_fit::fit_groups(in, static_cast<int>(group), static_cast<int>(refits), begin * lanes,
                              std::min(end * lanes, count), scale, low, code);
  });
  return {scales, lows, codes};
}

}  // namespace draftwise_ops

TORCH_LIBRARY(draftwise, lib) {
  lib.def("q4_linear(Tensor x, Tensor packed, Tensor scales, Tensor lows, int group) -> Tensor");
  lib.def("q8_linear(Tensor x, Tensor packed, Tensor weight_sums, Tensor scale) -> Tensor");
  lib.def("fit_int4_grids(Tensor groups, int refits) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(draftwise, CPU, lib) {
  lib.impl("q4_linear", &q4_linear);
  lib.impl("q8_linear", &q8_linear);
  lib.impl("fit_int4_grids", &draftwise_ops::fit_int4_grids);
}
