"""`draftwise bench --llama-server plain,ngram-mod` against llama.cpp's own llama-server on the
offline 0.5B GGUF: one server per variant, rows timed by the server's own clock, the speculative
row's text compared with the plain server's, and no server left running when the bench ends.

Skipped without a llama-server binary (`make setup-llama-server` builds one, ~7 minutes on 2 cores).
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import PRESET

pytestmark = pytest.mark.remote


def llama_server_pids(binary: str) -> set[int]:
    import psutil

    real = os.path.realpath(binary)
    found = set()
    for p in psutil.process_iter(["exe"]):
        exe = (p.info["exe"] or "").removesuffix(" (deleted)")
        if exe and os.path.realpath(exe) == real:
            found.add(p.pid)
    return found


def test_the_bench_runs_llama_server_beside_the_engine_and_stops_it(tmp_path):
    from bench.llama_server import find_llama_server
    from decoding.models import pack
    from decoding.models.specs import PRESETS

    binary = find_llama_server()
    if binary is None:
        pytest.skip("no llama-server binary: `make setup-llama-server` builds one")
    if importlib.util.find_spec("httpx") is None:
        pytest.skip("the llama-server rows need httpx (pip install 'draftwise[bench]')")
    if not pack.is_pulled(PRESETS[PRESET]):
        pytest.skip(f"{PRESET} is not pulled (run `draftwise models pull {PRESET}`)")
    before = llama_server_pids(binary)
    out = tmp_path / "bench.json"
    draftwise = os.path.join(os.path.dirname(sys.executable), "draftwise")
    done = subprocess.run([draftwise, "bench", "--limit", "2", "--weights", "int8", "--modes", "none,auto,llama-server",
                           "--llama-server", "plain,ngram-mod", "--llama-server-binary", binary, "--max-tokens", "24",
                           "--typing-cases", "0", "--cancel-tries", "0", "--json", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(out.read_text())
    assert not data["skipped_modes"].get("llama-server@plain"), data["skipped_modes"]
    for row in ("llama-server@plain", "llama-server@ngram-mod"):
        s = data["modes"][row]
        assert s["errors"] == 0 and s["cases"] == 2, s
        assert s["family_plain"] == "llama-server@plain"
        assert s["identical_rate_vs_family_plain"] is not None
    for r in data["runs"]["llama-server@plain"]:
        # the server's own clock: decode time and tokens after the first; a plain server drafts nothing
        assert r["decode_ms"] > 0 and r["decode_tokens"] >= 1
        assert r["drafted_tokens"] is None and r["target_forwards"] == r["decode_tokens"]
    for row in ("llama-server@plain", "llama-server@ngram-mod"):  # case 0 ran in the warm-up too: erased since
        assert [r["reused_prompt_tokens"] for r in data["runs"][row]] == [0, 0]
    for r in data["runs"]["llama-server@ngram-mod"]:
        assert r["drafted_tokens"] is not None and 0 <= r["accepted_tokens"] <= r["drafted_tokens"]
    assert data["config"]["llama_server"]["variants"]["llama-server@ngram-mod"] == ["--spec-type", "ngram-mod"]
    assert any("over llama-server@plain" in g["goal"] for g in data["goals"])
    rss = data["config"]["llama_server"]["rss_mib"]  # each server's own, read before it was stopped
    assert set(rss) == {"llama-server@plain", "llama-server@ngram-mod"} and all(v > 100 for v in rss.values()), rss
    assert llama_server_pids(binary) <= before, "the bench left llama-server running"
