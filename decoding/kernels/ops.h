// What every instruction set's kernel file (avx512vnni.cpp, avx2.cpp, neon.cpp)
// shares: the two ops' argument checks and drivers, their registration with torch (and the int4
// packing's grid fit, grid_fit.h), and how they split work among threads (parallel.h). Each file
// includes this once and defines the two ops declared here by running the drivers (below) with its
// own intrinsics, so how rows are quantized, grouped and split among threads is written once and
// cannot drift apart between instruction sets that must give the same bits.
// Only the headers the ops need: with torch/extension.h (Python, pybind11, all of ATen's ops) a
// kernel took 26 s of compiler time, with these 6.5 s.
#pragma once
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <type_traits>

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

// ---- The drivers: one per op, run with each instruction set's parts --------------------------------
//
// An instruction set's struct Isa holds only what its intrinsics make differ:
//   ROWS       rows sharing each load of weights (as many as its registers hold accumulators for)
//   Q8_OFFSET  whether q8's activation codes go in as code + 128 (an unsigned operand), so 128 x
//              each output's weight sum (weight_sums) comes off its integer sum
//   q8_quantize_row(r, k, codes, scale), q4_quantize_row(r, k, codes, scale): one row, Int8Linear's rule
//   q8_block_rows<R>(w, w_scale, w_sum, codes, x_scale, k, out): one block of 16 int8 outputs for R rows
//   q4_block_rows<R>(w, scales, lows, codes, group_sums, x_scale, k, group, out): the same for int4
// codes, group_sums and out hold R row pointers, x_scale the R rows' scales.

// Activations quantized a row at a time: codes [M, K], a scale a row and, for int4, each group's sum
// of codes [M, K/group] (what the lows add up to); the tensors own what the pointers read.
struct QuantizedRows {
  at::Tensor codes_tensor, scales_tensor, sums_tensor;
  const int8_t* codes;
  const float* scales;
  const int32_t* group_sums;  // nullptr for int8
  int64_t m, k, groups;
};

// x contiguous [M, K] float32; group 0: no group sums (int8). Rows apart on threads: a prompt chunk's
// rows are many, a decode step's one; each row is quantized on its own, so its codes never depend on
// the rows beside it.
template <class QuantizeRow>
inline QuantizedRows quantize_rows(const at::Tensor& x, int64_t group, const QuantizeRow& quantize_row) {
  const int64_t m = x.size(0), k = x.size(1), groups = group > 0 ? k / group : 0;
  at::Tensor codes = at::empty({m, k}, x.options().dtype(at::kChar)), scales = at::empty({m}, x.options());
  at::Tensor sums = group > 0 ? at::empty({m, groups}, x.options().dtype(at::kInt)) : at::Tensor();
  const float* in = x.data_ptr<float>();
  int8_t* q = codes.data_ptr<int8_t>();
  float* s = scales.data_ptr<float>();
  int32_t* gs = group > 0 ? sums.data_ptr<int32_t>() : nullptr;
  draftwise::parallel_for(0, m, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      quantize_row(in + r * k, k, q + r * k, s + r);
      for (int64_t g = 0; g < groups; ++g) {
        int32_t sum = 0;
        for (int64_t j = 0; j < group; ++j) sum += q[r * k + g * group + j];
        gs[r * groups + g] = sum;
      }
    }
  });
  return {codes, scales, sums, q, s, gs, m, k, groups};
}

// Pointers to up to ROWS rows for one block of 16 outputs.
template <int ROWS>
struct RowRun {
  const int8_t* codes[ROWS];
  const int32_t* group_sums[ROWS];
  float* out[ROWS];
};

// f(std::integral_constant<int, take>()), take in 1..R: each count of rows gets its own block_rows<R>,
// whose loops over rows the compiler unrolls into registers.
template <int R, class F>
inline void with_rows(int take, const F& f) {
  if constexpr (R > 1) {
    if (take < R) return with_rows<R - 1>(take, f);
  }
  f(std::integral_constant<int, R>());
}

// Every row for block b of 16 outputs (out: [M, n]), ROWS at a time and the rest in one last run:
// block(rows, run, x_scale) per run. Every row's sums run in the same order whatever run it is in,
// so how rows are grouped changes nothing.
template <int ROWS, class Block>
inline void for_row_runs(const QuantizedRows& x, float* out, int64_t n, int64_t b, const Block& block) {
  for (int64_t r = 0; r < x.m; r += ROWS) {
    const int take = static_cast<int>(std::min<int64_t>(ROWS, x.m - r));
    RowRun<ROWS> run;
    for (int j = 0; j < take; ++j) {
      run.codes[j] = x.codes + (r + j) * x.k;
      run.group_sums[j] = x.group_sums + (r + j) * x.groups;  // int8: nullptr + 0
      run.out[j] = out + (r + j) * n + b * 16;
    }
    with_rows<ROWS>(take, [&](auto rows) { block(rows, run, x.scales + r); });
  }
}

// x [M, K] float32; packed [N/16, K/4, 64] int8; weight_sums [N] int32 (each output's weight sum);
// scale [N] float32 -> [M, N] float32 = (float(int8(x) . w) * x_scale) * scale
template <class Isa>
at::Tensor q8_linear_on(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& weight_sums,
                        const at::Tensor& scale) {
  const auto xc = checked_q8(x, packed, scale);
  const int64_t m = xc.size(0), k = xc.size(1), blocks = packed.size(0), n = blocks * 16;
  const int32_t* ws = nullptr;  // signed activations need no offset correction
  if constexpr (Isa::Q8_OFFSET) {
    TORCH_CHECK(weight_sums.scalar_type() == at::kInt && weight_sums.numel() == n && weight_sums.is_contiguous(),
                "q8_linear: weight_sums must be int32 [N]");
    ws = weight_sums.data_ptr<int32_t>();
  }
  auto out = at::empty({m, n}, xc.options());
  const QuantizedRows q = quantize_rows(xc, 0, Isa::q8_quantize_row);
  const int8_t* w = packed.data_ptr<int8_t>();
  const float* sc = scale.data_ptr<float>();
  float* o = out.data_ptr<float>();
  // blocks split among threads; a block's weights stay in cache while every row reads them
  draftwise::parallel_for(0, blocks, 8, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      for_row_runs<Isa::ROWS>(q, o, n, b, [&](auto rows, const auto& run, const float* xs) {
        Isa::template q8_block_rows<decltype(rows)::value>(w + b * k * 16, sc + b * 16, ws ? ws + b * 16 : nullptr,
                                                           run.codes, xs, k, run.out);
      });
  });
  return out;
}

// x [M, K] float32; packed [N/16, K/8, 64] uint8; scales, lows [N/16, K/group, 16] fp16 -> [M, N] float32
template <class Isa>
at::Tensor q4_linear_on(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                        const at::Tensor& lows, int64_t group) {
  const auto xc = checked_q4(x, packed, scales, lows, group);
  const int64_t m = xc.size(0), k = xc.size(1), blocks = packed.size(0), n = blocks * 16, groups = k / group;
  auto out = at::empty({m, n}, xc.options());
  const QuantizedRows q = quantize_rows(xc, group, Isa::q4_quantize_row);
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const at::Half* sc = scales.data_ptr<at::Half>();
  const at::Half* lo = lows.data_ptr<at::Half>();
  float* o = out.data_ptr<float>();
  // blocks split among threads; a block's weights stay in cache while every row reads them
  draftwise::parallel_for(0, blocks, 8, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      for_row_runs<Isa::ROWS>(q, o, n, b, [&](auto rows, const auto& run, const float* xs) {
        Isa::template q4_block_rows<decltype(rows)::value>(w + b * k * 8, sc + b * groups * 16, lo + b * groups * 16,
                                                           run.codes, run.group_sums, xs, k, group, run.out);
      });
  });
  return out;
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
