"""The int4 kernel (decoding/kernels/integer_linear.py): its rows are exact at every width, and its
results are the packed weights' products.
Skipped where the CPU lacks AVX-512 VNNI or no C++ compiler builds it (int4 then runs on ATen's
kernel, which tests/engine/test_weights.py covers)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from decoding.kernels import integer_linear

pytestmark = pytest.mark.skipif(not integer_linear.load(), reason=f"int4 kernel: {integer_linear.problem()}")


def _layer(out_features: int = 96, in_features: int = 256, seed: int = 0) -> tuple[nn.Linear, integer_linear.Q4Linear]:
    torch.manual_seed(seed)
    dense = nn.Linear(in_features, out_features)
    return dense, integer_linear.Q4Linear(dense.weight, dense.bias)


def test_packing_finds_a_grid_the_weights_already_lie_on_and_beats_min_max_elsewhere():
    """A Q4_K file's weights (the presets') lie on a grid of 16 levels per group that need not span
    0..15: packing finds it (the usual min..max grid would not); on other weights it errs less than
    min..max in 15 steps."""
    torch.manual_seed(0)
    scale = torch.rand(64, 8, 1) * 0.01 + 0.001
    codes = torch.randint(2, 14, (64, 8, 32)).float()  # 12 of the 16 levels used
    codes[..., 0], codes[..., 1] = 2, 13  # (each group spans them)
    on_grid = (codes * scale - 0.05).reshape(64, 256).half().float()
    packed, scales, lows = integer_linear.pack(on_grid)
    assert (integer_linear.unpack(packed, scales, lows) - on_grid).abs().max() < 2e-4

    dense = nn.Linear(256, 96).weight.detach()
    got = integer_linear.unpack(*integer_linear.pack(dense))
    groups = dense.reshape(96, 8, 32)
    low = groups.amin(-1, keepdim=True)
    step = (groups.amax(-1, keepdim=True) - low) / 15
    min_max = (torch.round((groups - low) / step) * step + low).reshape(96, 256)
    assert (got - dense).pow(2).sum() < (min_max - dense).pow(2).sum()


def test_each_row_is_computed_alike_at_every_width():
    """A verify forward of n rows gives each row bit for bit a one-row forward's result, however
    the kernel groups rows (it unpacks weights once for up to 4)."""
    _, q = _layer(out_features=160, in_features=320, seed=1)
    x = torch.randn(17, 320) * torch.linspace(0.1, 10, 17)[:, None]  # rows of very different scales
    with torch.inference_mode():
        ones = torch.cat([q(x[i:i + 1]) for i in range(17)])
        for n in range(2, 18):
            assert torch.equal(q(x[:n]), ones[:n]), f"{n} rows"
        assert torch.equal(q(x[5:12]), ones[5:12])


def test_results_are_the_packed_weights_times_int8_rows():
    """The kernel's sum is what the format defines: codes * scale + low, times each row quantized
    to int8 with its own scale (up to float rounding in the sums)."""
    dense, q = _layer()
    x = torch.randn(5, 256)
    weight = integer_linear.unpack(q.packed, q.scales, q.lows)
    scale = (x.abs().amax(dim=1, keepdim=True) / 127.0)
    rows = torch.round(x / scale).clamp(-127, 127) * scale
    want = rows.double() @ weight.double().T + dense.bias.detach().double()
    got = q(x).double()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-4)
    # and close to the float layer it was made from
    assert ((got - dense(x).double()).norm() / dense(x).double().norm()).item() < 0.1


def test_layers_that_do_not_fit_the_layout_are_refused():
    assert integer_linear.fits(32, 64) and not integer_linear.fits(40, 64) and not integer_linear.fits(32, 48)


def test_packed_weights_are_kept_on_disk_by_their_content(tmp_path, monkeypatch):
    """Fitting the grids takes seconds per layer on a laptop CPU: a second load reads them back, and
    other weights are packed anew, never served another matrix's codes."""
    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path))
    dense, _ = _layer()
    first = integer_linear.cached_pack(dense.weight)
    kept = list((tmp_path / "packed").iterdir())
    assert len(kept) == 1
    monkeypatch.setattr(integer_linear, "pack", lambda *a, **k: pytest.fail("packed again instead of read back"))
    again = integer_linear.cached_pack(dense.weight)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    monkeypatch.undo()
    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path))
    other = nn.Linear(256, 96).weight
    assert not torch.equal(integer_linear.cached_pack(other)[0], first[0])
    assert len(list((tmp_path / "packed").iterdir())) == 2


def _int_mm_reference(layer, x: torch.Tensor) -> torch.Tensor:
    """Int8Linear's arithmetic with exact integer sums (`torch._int_mm`'s where it is exact)."""
    weight = integer_linear.unpack_int8(layer.qweight)
    scale = (x.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=1e-12)
    xq = torch.round(x / scale).clamp(-127, 127).to(torch.int8)
    return (xq.int() @ weight.int().t()).float() * scale * layer.scale + layer.bias  # exact, unlike _int_mm without VNNI


def test_the_int8_kernel_gives_int_mms_bits_at_every_width():
    """Int8Linear on draftwise's kernel (q8_linear): bit for bit exact integer sums, one row or many
    (up to a prompt chunk's), so int8's texts and the quality gate's figures do not move with it,
    and each row of a verify forward is a decode step's."""
    from decoding.models.weights import Int8Linear

    torch.manual_seed(2)
    dense = nn.Linear(324, 160)  # 324 inputs: not a multiple of 64
    layer = Int8Linear.from_linear(dense)
    assert layer.vnni and layer.qweight.shape == (10, 81, 64)
    x = torch.randn(70, 324) * torch.linspace(0.01, 30, 70)[:, None]
    with torch.inference_mode():
        ones = torch.cat([layer(x[i:i + 1]) for i in range(70)])
        for n in (1, 2, 3, 4, 5, 8, 9, 16, 17, 64, 70):
            assert torch.equal(layer(x[:n]), _int_mm_reference(layer, x[:n])), f"{n} rows"
            assert torch.equal(layer(x[:n]), ones[:n]), f"{n} rows against one at a time"


def test_an_lm_head_over_an_odd_vocabulary_runs_on_the_kernel_not_on_int_mm():
    """100 outputs, not a multiple of the kernel's blocks of 16 (vocabularies like 32,001): zero rows
    pad it to the block, so it gets the kernel's exact sums, not `_int_mm`'s (which saturate on CPUs
    without VNNI), and a tied embedding still reads its own rows."""
    from decoding.models.weights import Int8Embedding, Int8Linear, int8_rows

    torch.manual_seed(3)
    table = nn.Embedding(100, 64)
    head = Int8Linear.from_linear(nn.Linear(64, 100))
    assert head.vnni and head.qweight.shape == (7, 16, 64)
    x = torch.randn(9, 64) * 5
    with torch.inference_mode():
        got = head(x)
        assert got.shape == (9, 100)
        weight = integer_linear.unpack_int8(head.qweight)[:100]
        scale = (x.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=1e-12)
        codes = torch.round(x / scale).clamp(-127, 127).int()
        assert torch.equal(got, (codes @ weight.int().t()).float() * scale * head.scale[:100] + head.bias)
        assert torch.equal(torch.cat([head(x[i:i + 1]) for i in range(9)]), got)
    q, s = int8_rows(table.weight)
    embedding = Int8Embedding.from_embedding(table, tied_head=Int8Linear(q, s, None))
    ids = torch.tensor([[0, 57, 99], [15, 16, 96]])
    assert torch.equal(embedding(ids), nn.functional.embedding(ids, q).float() * s[ids].unsqueeze(-1))


def test_an_embedding_tied_to_a_packed_lm_head_reads_its_rows():
    from decoding.models.weights import Int8Embedding, Int8Linear, int8_rows

    table = nn.Embedding(48, 64)
    head = Int8Linear(*int8_rows(table.weight), None)
    tied = Int8Embedding.from_embedding(table, tied_head=head)
    assert tied.qweight.data_ptr() == head.qweight.data_ptr()
    ids = torch.tensor([[0, 15, 16, 47], [3, 3, 31, 32]])
    q, s = int8_rows(table.weight)
    assert torch.equal(tied(ids), nn.functional.embedding(ids, q).float() * s[ids].unsqueeze(-1))
    assert torch.equal(integer_linear.unpack_int8(head.qweight), q)


def test_packed_layers_beyond_the_limit_go_least_recently_used_first(tmp_path):
    import os
    import time

    now = time.time()
    for i in range(4):
        f = tmp_path / f"layer{i}-g32-v2.safetensors"
        f.write_bytes(b"x" * 100)
        os.utime(f, (now - 100 + i, now - 100 + i))  # layer0 used longest ago
    stale = tmp_path / "layer9-g32-v2.tmp123"
    stale.write_bytes(b"x")
    os.utime(stale, (now - 7200, now - 7200))
    from decoding.home import paths

    paths.evict_least_recently_used(tmp_path, limit=250)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["layer2-g32-v2.safetensors", "layer3-g32-v2.safetensors"]


class Xorshift:
    """tests/kernels/neon_kernel_test.cpp's generator, number for number."""

    def __init__(self) -> None:
        self.state = 88172645463325252

    def uniform(self, lo: int, hi: int, n: int) -> list[int]:
        out, s, mask = [], self.state, (1 << 64) - 1
        for _ in range(n):
            s ^= (s << 13) & mask
            s ^= s >> 7
            s ^= (s << 17) & mask
            out.append(lo + (s & 0xFFFFFFFF) % (hi - lo + 1))
        self.state = s
        return out


def fnv1a(t: torch.Tensor) -> int:
    h = 0xCBF29CE484222325
    for byte in t.contiguous().numpy().tobytes():
        h = ((h ^ byte) * 0x100000001B3) & ((1 << 64) - 1)
    return h


# The two ops' outputs on the inputs below, recorded on the AVX-512 VNNI kernel; the AVX2 kernel (make
# test-isa) and the ARM one (make test-arm: the same numbers in neon_kernel_test.cpp) must give them.
CROSS_ISA_DIGESTS = (0x0A215A9E27156384, 0xB39D1A8BBEBEE6AA)


def cross_isa_outputs() -> tuple[torch.Tensor, ...]:
    """(x, int8 weights [N, K], their scales, q8_linear's output, q4_linear's output)."""
    rng = Xorshift()
    x = torch.tensor(rng.uniform(-2000, 2000, 19 * 896), dtype=torch.float32).reshape(19, 896) / 256
    x[3] = 0.0  # a zero row: the scale's floor
    packed8 = torch.tensor(rng.uniform(-127, 127, 10 * 224 * 64), dtype=torch.int8).reshape(10, 224, 64)
    scale = torch.tensor(rng.uniform(1, 1000, 160), dtype=torch.float32) / 4096
    packed4 = torch.tensor(rng.uniform(0, 255, 10 * 112 * 64), dtype=torch.uint8).reshape(10, 112, 64)
    grids = (torch.tensor(rng.uniform(-300, 300, 2 * 10 * 28 * 16), dtype=torch.float32) / 1024).half()
    scales, lows = grids.reshape(2, 10, 28, 16)
    weights = integer_linear.unpack_int8(packed8)
    return (x, weights, scale, torch.ops.draftwise.q8_linear(x, packed8, weights.sum(1, dtype=torch.int32), scale),
            torch.ops.draftwise.q4_linear(x, packed4, scales.contiguous(), lows.contiguous(), 32))


def test_every_instruction_set_computes_the_same_bits():
    """Fixed integer-valued inputs (packed codes and grids made directly: pack()'s float fitting is
    ATen's, not the kernel's), their outputs pinned: a kernel that computed every row alike but
    wrongly would pass the row tests, not this one. The int8 output is also exact integer sums."""
    x, weights, scale, q8, q4 = cross_isa_outputs()
    assert (fnv1a(q8), fnv1a(q4)) == CROSS_ISA_DIGESTS
    x_scale = (x.abs().amax(1, keepdim=True) / 127).clamp(min=1e-12)
    codes = torch.round(x / x_scale).clamp(-127, 127).int()
    assert torch.equal(q8, (codes @ weights.int().t()).float() * x_scale * scale)


def test_a_forced_instruction_set_the_cpu_lacks_is_refused_clearly(monkeypatch):
    from decoding.kernels import build as kernel_build

    kernel_build.isa.cache_clear()
    try:
        monkeypatch.setenv("DRAFTWISE_ISA", "sse9")
        with pytest.raises(kernel_build.IsaError, match="use one of"):
            kernel_build.isa()
        kernel_build.isa.cache_clear()
        monkeypatch.setenv("DRAFTWISE_ISA", "avx2")
        monkeypatch.setattr(kernel_build, "cpu_flags", lambda: {"sse4_2"})
        with pytest.raises(kernel_build.IsaError, match="lacks avx2"):
            kernel_build.isa()
    finally:
        kernel_build.isa.cache_clear()


def test_an_avx_vnni_laptop_gets_the_vnni_kernel_only_where_the_compiler_builds_it(monkeypatch):
    """An Alder Lake-class CPU (AVX-VNNI, no AVX-512): `auto` picks avxvnni, but falls back to the
    AVX2 kernel where the compiler predates -mavxvnni (a compiler that rejects every flag stands in)."""
    from decoding.kernels import build as kernel_build

    monkeypatch.setattr(kernel_build, "cpu_flags", lambda: {"avx2", "avx_vnni", "fma", "f16c"})
    monkeypatch.setattr(kernel_build.platform, "machine", lambda: "x86_64")
    monkeypatch.delenv("DRAFTWISE_ISA", raising=False)
    kernel_build.isa.cache_clear()
    try:
        assert kernel_build.isa() == "avxvnni" and kernel_build.runnable() == ["avxvnni", "avx2", "portable"]
        monkeypatch.setenv("CXX", "false")  # what the compiler takes is asked of each compiler anew
        kernel_build.isa.cache_clear()
        assert kernel_build.isa() == "avx2" and kernel_build.runnable() == ["avx2", "portable"]
        monkeypatch.setenv("DRAFTWISE_ISA", "avxvnni")
        kernel_build.isa.cache_clear()
        with pytest.raises(kernel_build.IsaError, match="does not take -mavxvnni"):
            kernel_build.isa()
    finally:
        kernel_build.isa.cache_clear()


# ---- packing's grid fit (decoding/kernels/grid_fit.h) ----------------------------------------------


def _fit_groups_reference(groups: torch.Tensor, refits: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """The grid fit as it was written in torch ops before it moved to the kernel (grid_fit.h says why):
    the candidates and refits, one tensor op at a time. torch sums a group in its own order, so a
    near-tie between two candidates can go either way: the kernel is compared with this on the
    error it reaches, not bit for bit."""
    def error(scale, low):
        scale, low = scale.half().float(), low.half().float()
        codes = torch.round((groups - low) / scale).clamp(0, 15)
        return (codes * scale + low - groups).pow(2).sum(-1, keepdim=True), codes

    lo, hi = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    scale, low = ((hi - lo) / 15).clamp(min=1e-8), lo
    best, codes = error(scale, low)

    def keep(candidate_scale, candidate_low):
        nonlocal scale, low, best, codes
        err, c = error(candidate_scale, candidate_low)
        better = err < best
        scale, low = torch.where(better, candidate_scale, scale), torch.where(better, candidate_low, low)
        best, codes = torch.where(better, err, best), torch.where(better, c, codes)

    for steps in (14, 13, 12, 11):
        step = ((hi - lo) / steps).clamp(min=1e-8)
        keep(step, lo)
        keep(step, hi - 15 * step)
    for _ in range(refits):
        mean_code, mean_weight = codes.mean(-1, keepdim=True), groups.mean(-1, keepdim=True)
        var = (codes - mean_code).pow(2).mean(-1, keepdim=True)
        fitted = ((codes - mean_code) * (groups - mean_weight)).mean(-1, keepdim=True) / var.clamp(min=1e-12)
        fitted = torch.where(var > 0, fitted, scale).clamp(min=1e-8)
        keep(fitted, torch.where(var > 0, mean_weight - fitted * mean_code, low))
    return scale.half().float().reshape(-1), low.half().float().reshape(-1)


def _grid_error(groups: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    codes = torch.round((groups - low[:, None]) / scale[:, None]).clamp(0, 15)
    return (codes * scale[:, None] + low[:, None] - groups).pow(2).sum(-1)


def test_the_grid_fit_reaches_the_reference_fits_error():
    """On noise-like weights and on weights that lie on a Q4_K-like grid (levels 2..13 of 16, what the
    presets' GGUF files hold): the kernel picks the reference's grid in all but near-ties, errs as
    little in total, never more than the usual min..max grid, finds the grid the weights lie on, and
    its codes are the ones that grid gives."""
    torch.manual_seed(3)
    noise = torch.randn(20_000, 32) * 0.02
    step, codes = torch.rand(8_000, 1) * 0.01 + 0.001, torch.randint(2, 14, (8_000, 32)).float()
    codes[:, 0], codes[:, 1] = 2, 13
    on_grid = (codes * step - 0.05).half().float()
    for groups in (noise, on_grid):
        scale, low, got_codes = torch.ops.draftwise.fit_int4_grids(groups.contiguous(), integer_linear.REFITS)
        ref_scale, ref_low = _fit_groups_reference(groups.unsqueeze(1))
        same = (scale == ref_scale) & (low == ref_low)
        assert same.float().mean() > 0.998, f"{int((~same).sum())} of {len(same)} grids differ from the reference's"
        err, ref_err = _grid_error(groups, scale, low), _grid_error(groups, ref_scale, ref_low)
        assert float(err.sum()) <= float(ref_err.sum()) * (1 + 1e-3)
        lo, hi = groups.amin(-1), groups.amax(-1)
        min_max = _grid_error(groups, ((hi - lo) / 15).half().float(), lo.half().float())  # in fp16, as stored
        assert bool((err <= min_max * (1 + 1e-5)).all())
        assert torch.equal(scale, scale.half().float()) and torch.equal(low, low.half().float())
        expected = torch.round((groups - low[:, None]) / scale[:, None]).clamp(0, 15)
        assert torch.equal(got_codes, expected.to(torch.uint8))
    assert float(err.sum()) < float(min_max.sum()) / 100  # on the grid: found, where min..max misses it


def grid_fit_inputs() -> torch.Tensor:
    """tests/kernels/grid_fit_test.cpp's groups, number for number: 69 groups of 32 (a short block of 5
    at their end), from noise, from Q4_K-like grids, and the edges: all zeros (a zero scale), all
    equal, values whose grid is fp16-subnormal, values whose low overflows fp16; then 20,000 groups of
    full-precision values, whose near-ties a fused multiply-add flips, and enough blocks of 16 for
    every thread."""
    rng = Xorshift()
    noise = lambda n: torch.tensor(rng.uniform(-3000, 3000, n * 32), dtype=torch.float32).reshape(n, 32) / 65536  # noqa: E731
    first = noise(40)
    grids = []
    for _ in range(20):
        step = torch.tensor(rng.uniform(1, 300, 1), dtype=torch.float32) / 65536
        low = torch.tensor(rng.uniform(-3000, 0, 1), dtype=torch.float32) / 65536
        grids.append(torch.tensor(rng.uniform(2, 13, 32), dtype=torch.float32) * step + low)
    zeros, equal = torch.zeros(1, 32), torch.full((1, 32), 0.25)
    subnormal = torch.tensor(rng.uniform(-1000, 1000, 32), dtype=torch.float32).reshape(1, 32) / 16777216
    huge = torch.tensor(rng.uniform(-100000, 100000, 32), dtype=torch.float32).reshape(1, 32)
    short = noise(5)
    fine = torch.tensor(rng.uniform(-8388607, 8388607, 20_000 * 32), dtype=torch.float32).reshape(-1, 32) / 536870912
    return torch.cat([first, torch.stack(grids), zeros, equal, subnormal, huge, short, fine]).contiguous()


# fit_int4_grids' scales, lows and codes on grid_fit_inputs(), recorded on the AVX-512 VNNI build;
# every other build (make test-isa, make test-toolchains; make test-arm: grid_fit_test.cpp) must give it.
GRID_FIT_DIGEST = 0x76D2C79E4F794763


def test_the_grid_fit_gives_the_same_bits_on_every_instruction_set_and_thread_count():
    groups = grid_fit_inputs()
    outputs = torch.ops.draftwise.fit_int4_grids(groups, integer_linear.REFITS)
    digest = fnv1a(torch.cat([outputs[0], outputs[1], outputs[2].reshape(-1).float()]))
    assert digest == GRID_FIT_DIGEST, hex(digest)
    threads = torch.get_num_threads()
    assert len(groups) > 16 * 16 * max(2, threads)  # blocks of 16 groups, 16 blocks a task: every thread gets some
    try:
        torch.set_num_threads(1)
        assert all(torch.equal(a, b) for a, b in zip(torch.ops.draftwise.fit_int4_grids(groups, integer_linear.REFITS), outputs))
    finally:
        torch.set_num_threads(threads)
    assert outputs[0][60] == 0 and outputs[1][60] == 0  # all zeros: a zero scale, the low 0
