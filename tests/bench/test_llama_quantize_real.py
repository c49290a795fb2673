"""`--llama-server-quants` with llama.cpp's real llama-quantize: the offline 0.5B's Q4_K_M GGUF
requantized to Q8_0 once into $DRAFTWISE_HOME/gguf, the made file's header saying Q8_0, and a second
call reusing it. The plumbing around it is tested with a stand-in in test_prompt_reading.py.

Marked `remote` (it needs binaries built from llama.cpp's source, as the llama-server tests do) and
skipped without llama-quantize (`make setup-llama-quantize` builds one, ~7 minutes on 2 cores):
`pytest -m remote tests/bench/test_llama_quantize_real.py`.
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.remote

PRESET = "qwen2.5-coder-0.5b"


def test_the_real_llama_quantize_makes_a_q8_0_file_once(tmp_path):
    from bench.llama_server import find_llama_quantize, gguf_file_type, requantized_gguf
    from decoding.models import pack
    from decoding.models.specs import PRESETS

    binary = find_llama_quantize()
    if binary is None:
        pytest.skip("no llama-quantize binary (on PATH or next to this Python): `make setup-llama-quantize` builds one")
    if not pack.is_pulled(PRESETS[PRESET]):
        pytest.skip(f"{PRESET} is not pulled (run `draftwise models pull {PRESET}`)")
    source = pack.preset_dir(PRESETS[PRESET]) / PRESETS[PRESET].gguf_name
    assert gguf_file_type(source) == "q4_k_m"  # what the presets ship
    out = requantized_gguf(source, "q8_0", binary, threads=2, home=tmp_path)
    assert out == tmp_path / "gguf" / f"{PRESET}-q8_0.gguf"
    assert gguf_file_type(out) == "q8_0"
    # Q8_0 keeps 8.5 bits a weight (llama-quantize counts them), Q4_K_M fewer: the file grows
    assert out.stat().st_size > 1.3 * source.stat().st_size
    made = out.stat().st_mtime_ns
    assert requantized_gguf(source, "q8_0", binary, home=tmp_path) == out and out.stat().st_mtime_ns == made
    assert [p.name for p in (tmp_path / "gguf").iterdir()] == [out.name]  # no temporary file left
