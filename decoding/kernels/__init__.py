"""The C++ kernels the static forward runs on, one file per instruction set, built on the user's
machine at set-up (`build.py`; `DRAFTWISE_ISA` forces a path).

- `integer_linear.py`: int8 and int4 weights times int8 activations, summed in integers, so every
  row gets the same bits on every CPU and at every width; packing and quantizing the weights.
  Its ops, one file per instruction set: `avx512vnni.cpp`, `avx2.cpp` (AVX2, and AVX-VNNI when built
  with DRAFTWISE_AVXVNNI), `neon.cpp` (aarch64 with the dot product) around `neon_core.h` (no torch:
  tests/kernels/ runs it under qemu); `ops.h` their shared checks and registration.
- `row_ops.py` / `row_ops.cpp`: attention and SiLU computed per row in an order no thread count changes;
  the attention's sums in `row_ops_core.h` (no torch: tests/kernels/ runs each build of it), the same
  bits from its vector builds and its plain C++ one.
- `parallel.h`: the kernels' loops on torch's threads, whichever compiler built them (GCC, clang).
"""
