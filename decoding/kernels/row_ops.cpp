// Attention for the static forward (decoding/kernels/row_ops.py says where it runs): each (row, head)
// one task, computed by row_ops_core.h in an order its code fixes, so a row's result depends on its
// position and the cache alone, not on how many rows the forward has, how many threads run it, nor
// which instruction set or compiler built it.
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <string>

#include "parallel.h"
#include "row_ops_core.h"

namespace {

bool head_size_taken(int64_t d) {
  return d == 16 || d == 32 || d == 64 || d == 80 || d == 96 || d == 128 || d == 256;
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
  TORCH_CHECK(head_size_taken(d), "causal_attention: head size ", d, " (16, 32, 64, 80, 96, 128 or 256)");
  auto out = at::empty({n, heads * d}, q.options());
  const float *qp = q.const_data_ptr<float>(), *kp = k.const_data_ptr<float>(), *vp = v.const_data_ptr<float>();
  float* op = out.data_ptr<float>();
  // one task per (block of rows, kv head) where this build shares each key's reading among them, else
  // per (row, head): either way each (row, head) is computed alike, so how tasks fall changes no bits
  const int64_t blocked = draftwise_rows::blocked_tasks(n, heads, kv_heads);
  if (blocked > 0) {
    draftwise::parallel_for(0, blocked, 1, [&](int64_t first, int64_t last) {
      draftwise_rows::attend_blocked(d, qp, kp, vp, op, n, heads, kv_heads, cache_len, start, first, last);
    });
    return out;
  }
  draftwise::parallel_for(0, n * heads, 1, [&](int64_t first, int64_t last) {
    draftwise_rows::attend(d, qp, kp, vp, op, heads, kv_heads, cache_len, start, first, last);
  });
  return out;
}

// How this build computes and threads: its implementation of the sums ("portable", "8-lane",
// "16-lane") and how its loops get threads (row_ops.py logs a build that runs on one).
std::string build_info() {
  return std::string(draftwise_rows::implementation()) + ", " + draftwise::threading();
}

TORCH_LIBRARY(draftwise_rows, lib) {
  lib.def("causal_attention(Tensor q, Tensor k, Tensor v, int start) -> Tensor");
  lib.def("build_info() -> str", &build_info);
}

TORCH_LIBRARY_IMPL(draftwise_rows, CPU, lib) {
  lib.impl("causal_attention", &causal_attention);
}
