"""A row of the static forward is the same bits whatever the number of rows in its forward and the
number of threads: at 1, 2, 3, 4, 8 and 16 threads (more than this machine's cores: oversubscribed,
which is slow but computes what such a machine computes), every verify width 1-17 and the prompt
chunk's width, at positions that span two attention windows and that reach the buffer's end.

The models have the real presets' layer shapes (the 0.5B's and the 1.5B's: the widths at which
torch's element-wise ops and BLAS split rows among threads) with two layers and random weights; the
real 0.5B on real code tokens is checked in the real-model test below."""
from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from decoding.kernels import row_ops
from decoding.models.static_decoder import WINDOW_STEP, StaticDecoder
from decoding.runners.static import STATIC_PREFILL_CHUNK

THREADS = (1, 2, 3, 4, 8, 16)
SHAPES = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_attention_heads=12, num_key_value_heads=2),
}
MAX_LEN = 2 * WINDOW_STEP + STATIC_PREFILL_CHUNK


@pytest.fixture(autouse=True)
def _threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _decoder(shape: str, fmt: str) -> StaticDecoder:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from decoding.models.weights import kernel

    if kernel(fmt).startswith("aten"):  # DRAFTWISE_ISA=portable (make test-isa)
        pytest.skip("ATen's int4 kernel is not exact by construction (several rows take another path on "
                    "AMX CPUs): its runner does not draft on a CPU, tested in test_weights.py")

    torch.manual_seed(0)
    config = Qwen2Config(num_hidden_layers=2, vocab_size=1024, max_position_embeddings=4096,
                         tie_word_embeddings=False, **SHAPES[shape])
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # weights of a trained model's spread: activations reach SiLU's whole range
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.06)
    return StaticDecoder(model, fmt, MAX_LEN)


def _ids(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(10, 1000, (n,), generator=torch.Generator().manual_seed(seed))


@torch.inference_mode()
def _steps(model: StaticDecoder, ids: torch.Tensor, start: int, n: int) -> torch.Tensor:
    return torch.cat([model(ids[start + i:start + i + 1], start + i, 1) for i in range(n)])


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_verify_rows_equal_decode_steps_at_every_thread_count(shape, fmt):
    model = _decoder(shape, fmt)
    ids = _ids(MAX_LEN)
    # a short cache, one whose 17 rows span two windows, and one whose rows end at the buffer's end
    starts = (5, WINDOW_STEP - 8, MAX_LEN - 17)
    with torch.inference_mode():
        model(ids[:max(starts)], 0, 1)  # the cache before each start, read once at one thread count
        reference = None
        for threads in THREADS:
            torch.set_num_threads(threads)
            steps = {s: _steps(model, ids, s, 17) for s in starts}
            if reference is None:
                reference = steps
            for s in starts:  # a step is a step at any thread count
                assert torch.equal(steps[s], reference[s]), f"{threads} threads: steps at {s} changed"
                for width in range(1, 18):
                    rows = model(ids[s:s + width], s, width)
                    assert torch.equal(rows, steps[s][:width]), \
                        f"{threads} threads, {width} rows at {s}: {float((rows - steps[s][:width]).abs().max()):.3g} apart"


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_a_prompt_read_in_chunks_leaves_the_cache_one_token_steps_leave(fmt):
    """The prompt chunk's width (256 rows) at 2 and 8 threads: the cache a prompt leaves, and the
    logits after it, are those of one-token steps."""
    model = _decoder("0.5b", fmt)
    n = STATIC_PREFILL_CHUNK + 40
    ids = _ids(n, seed=2)
    with torch.inference_mode():
        torch.set_num_threads(1)
        steps = _steps(model, ids, 0, n)
        k, v = model.k_cache[:, :, :n].clone(), model.v_cache[:, :, :n].clone()
        for threads in (2, 8):
            torch.set_num_threads(threads)
            model(ids[:STATIC_PREFILL_CHUNK], 0, 1)
            last = model(ids[STATIC_PREFILL_CHUNK:n], STATIC_PREFILL_CHUNK, n - STATIC_PREFILL_CHUNK)
            assert torch.equal(model.k_cache[:, :, :n], k) and torch.equal(model.v_cache[:, :, :n], v), threads
            assert torch.equal(last, steps[STATIC_PREFILL_CHUNK:]), threads


def test_torch_silu_alone_splits_rows_by_thread_count_and_row_ops_silu_does_not():
    """Why row_ops.silu exists, and that the checks above can fail: ATen's SiLU over several rows
    differs from the same rows one at a time once threads split the rows mid-way."""
    torch.manual_seed(0)
    torch.set_num_threads(8)
    differs = []
    for width in (4864, 8960):
        for n in range(2, 18):
            x = torch.randn(n, 2 * width)[:, :width] * 3
            one_at_a_time = torch.cat([F.silu(x[i:i + 1]) for i in range(n)])
            assert torch.equal(row_ops.silu(x), one_at_a_time), (width, n)
            if not torch.equal(F.silu(x), one_at_a_time):
                differs.append((width, n))
    if not differs:
        pytest.skip("torch's SiLU split no rows here (its vector width divides every thread's share)")


@pytest.mark.skipif(row_ops.problem() is not None, reason=f"attention kernel: {row_ops.problem()}")
@pytest.mark.parametrize("d", [64, 80, 128])
def test_attention_kernel_is_close_to_softmax_attention_and_each_row_is_its_own(d):
    torch.manual_seed(0)
    kv_heads, heads, length = 2, 14, 300
    keys, values = torch.randn(kv_heads, length, d), torch.randn(kv_heads, length, d)
    q = torch.randn(40, heads, d) * 0.3
    got = row_ops.causal_attention(q, keys, values, 100)
    group = heads // kv_heads
    for r in (0, 17, 39):
        for h in (0, 6, 13):
            seen = 100 + r + 1
            p = torch.softmax(keys[h // group, :seen].double() @ q[r, h].double(), -1)
            want = p @ values[h // group, :seen].double()
            assert torch.allclose(got[r, h * d:(h + 1) * d].double(), want, atol=2e-6), (r, h)
    for threads in (1, 3, 8):
        torch.set_num_threads(threads)
        assert torch.equal(torch.cat([row_ops.causal_attention(q[i:i + 1], keys, values, 100 + i) for i in range(40)]), got)


# causal_attention's output on the inputs below, recorded on the AVX-512 build; every other build
# (make test-isa: the avx2 and avxvnni builds, both on row_ops.cpp's 8-lane AVX2 code) must give it
# bit for bit.
ATTENTION_DIGEST = (0x840E04803049682B, 0x96ADD5EF059F5BD7)


@pytest.mark.skipif(row_ops.problem() is not None, reason=f"attention kernel: {row_ops.problem()}")
def test_attention_computes_the_same_bits_on_every_instruction_set():
    """Fixed inputs (integers over powers of two: exact floats whatever CPU made them), rows whose
    keys end inside and at the end of a 16-key block, over 1,000 keys, head sizes 64 and 128: a
    build whose sums ran in another order (say, AVX2's 8-lane halves of each 16-lane vector added in
    another tree) fails."""
    from tests.engine.test_integer_kernels import Xorshift, fnv1a

    rng, digests = Xorshift(), []
    for d, length, start, rows in ((64, 1100, 1000, 19), (128, 200, 30, 17)):
        def exact(n: int, scale: int) -> torch.Tensor:
            return torch.tensor(rng.uniform(-2000, 2000, n), dtype=torch.float32) / scale
        keys, values = exact(2 * length * d, 1024).reshape(2, length, d), exact(2 * length * d, 2048).reshape(2, length, d)
        q = exact(rows * 14 * d, 4096).reshape(rows, 14, d)
        digests.append(fnv1a(row_ops.causal_attention(q, keys, values, start)))
    assert tuple(digests) == ATTENTION_DIGEST


@pytest.mark.real_model
def test_the_real_model_on_real_code_is_row_exact_at_eight_threads():
    from decoding.models.checkpoint import load_model
    from pathlib import Path

    import decoding.speculative

    loaded = load_model("qwen2.5-coder-0.5b", weights="int8")
    model = loaded.model
    ids = torch.tensor(loaded.tokenizer(Path(decoding.speculative.__file__).read_text())["input_ids"][:700])
    torch.set_num_threads(8)
    with torch.inference_mode():
        for start in (40, 600):
            model(ids[:start], 0, 1)
            steps = _steps(model, ids, start, 17)
            for width in (2, 8, 14, 16, 17):
                assert torch.equal(model(ids[start:start + width], start, width), steps[:width]), (start, width)
