"""Security, against real server processes: TCP only on loopback unless explicitly allowed; pickle
weights and model repositories' own code refused unless opted in; no context from outside the
workspace (nor any file read there); the offline pack trusted only with the SHA-256 it was verified
against; no document text in the logs unless debugging asks for it.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from decoding.models import pack
from decoding.models.specs import PRESETS
from raw_lsp import REPO_ROOT, SERVE, encode, frame
from reliability_support import tiny_args

SECRET = "SECRET-4f1c9a2e"
WATCHED_TEXT = "OUTSIDE-7d3e"


def serve_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- TCP -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "::", "example.com"])
def test_tcp_refuses_non_loopback_without_allow_remote(host, tiny_model_dir):
    done = subprocess.run([*SERVE, *tiny_args(tiny_model_dir), "--tcp", f"{host}:{free_port()}"],
                          capture_output=True, text=True, env=serve_env(), timeout=120)
    assert done.returncode == 2
    assert "refusing to listen" in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""


def listening_addresses(pid: int, timeout: float = 120.0) -> set[str]:
    deadline = time.monotonic() + timeout
    process = psutil.Process(pid)
    while time.monotonic() < deadline:
        if process.status() == psutil.STATUS_ZOMBIE:
            raise AssertionError("the server exited without listening")
        found = {c.laddr.ip for c in process.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError("the server never listened")


class TcpClient:
    def __init__(self, port: int) -> None:
        self.conn = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.data = b""

    def send(self, message: dict) -> None:
        self.conn.sendall(frame(encode(message)))

    def receive(self) -> dict | None:
        """The next message; None when the server closed the connection."""
        while b"\r\n\r\n" not in self.data:
            chunk = self.conn.recv(65536)
            if not chunk:
                return None
            self.data += chunk
        header, _, rest = self.data.partition(b"\r\n\r\n")
        length = int(header.split(b"Content-Length:")[1].split(b"\r\n")[0])
        while len(rest) < length:
            rest += self.conn.recv(65536)
        self.data = rest[length:]
        return json.loads(rest[:length])

    def call(self, msg_id: int, method: str, params) -> dict:
        self.send({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
        while (message := self.receive()) is not None:
            if message.get("id") == msg_id and "method" not in message:
                return message
        raise AssertionError(f"the connection closed before the answer to {method}")


def lsp_over_tcp(port: int) -> dict:
    """initialize over a TCP connection; returns the answer."""
    client = TcpClient(port)
    try:
        return client.call(1, "initialize", {"processId": None, "rootUri": None, "capabilities": {}})
    finally:
        client.conn.close()


def test_a_tcp_session_runs_from_initialize_to_exit(tiny_model_dir):
    port = free_port()
    server = subprocess.Popen([*SERVE, *tiny_args(tiny_model_dir), "--tcp", f"127.0.0.1:{port}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=serve_env())
    try:
        listening_addresses(server.pid)
        client = TcpClient(port)
        assert "result" in client.call(1, "initialize", {"processId": None, "rootUri": None, "capabilities": {}})
        client.send({"jsonrpc": "2.0", "method": "initialized", "params": {}})
        second = TcpClient(port)  # one session per server, as over stdio
        assert second.receive() is None
        assert client.call(2, "draftwise/stats", {})["result"]["openDocuments"] == 0
        assert "result" in client.call(3, "shutdown", None)
        client.send({"jsonrpc": "2.0", "method": "exit"})
        assert server.wait(timeout=60) == 0
        assert server.stdout.read() == b""
    finally:
        server.kill()
        server.wait(timeout=30)


@pytest.mark.parametrize("where", ["127.0.0.1:{port}", ":{port}"])
def test_tcp_listens_on_loopback_only(where, tiny_model_dir):
    port = free_port()
    server = subprocess.Popen([*SERVE, *tiny_args(tiny_model_dir), "--tcp", where.format(port=port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=serve_env())
    try:
        assert listening_addresses(server.pid) == {"127.0.0.1"}
        answer = lsp_over_tcp(port)
        assert answer["id"] == 1 and answer["result"]["serverInfo"]["name"] == "draftwise"
    finally:
        server.kill()
        server.wait(timeout=30)


def test_the_command_line_serves_on_any_loopback_address(tiny_model_dir):
    """All of 127.0.0.0/8 is loopback: `serve` accepts 127.0.0.2 without --allow-remote, as run() does."""
    port = free_port()
    server = subprocess.Popen([*SERVE, *tiny_args(tiny_model_dir), "--tcp", f"127.0.0.2:{port}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=serve_env())
    try:
        assert listening_addresses(server.pid) == {"127.0.0.2"}
    finally:
        server.kill()
        server.wait(timeout=30)


def test_tcp_on_another_address_only_when_explicitly_allowed(tiny_model_dir):
    port = free_port()
    server = subprocess.Popen([*SERVE, *tiny_args(tiny_model_dir), "--tcp", f"0.0.0.0:{port}", "--allow-remote"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=serve_env())
    try:
        assert listening_addresses(server.pid) == {"0.0.0.0"}
    finally:
        server.kill()
        server.wait(timeout=30)


# ---- model files ---------------------------------------------------------------------------------

class _OpensAFile:
    """Unpickling this creates a file: proof that pickle data ran code."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def model_without_safetensors(tiny_model_dir: Path, where: Path) -> Path:
    model = where / "pickled-model"
    shutil.copytree(tiny_model_dir, model)
    (model / "model.safetensors").unlink()
    return model


def test_pickle_weights_are_refused(start_server, places, tiny_model_dir, tmp_path):
    workspace, _ = places
    model = model_without_safetensors(tiny_model_dir, tmp_path)
    ran = tmp_path / "pickle-ran"
    (model / "pytorch_model.bin").write_bytes(pickle.dumps({"weights": _OpensAFile(ran)}))
    server = start_server(["--target", str(model)])
    server.initialize(workspace)
    stats = server.wait_for_state()
    assert stats["state"] == "failed" and "never loads pickle" in stats["error"]
    assert not ran.exists(), "the pickle was unpickled"
    assert server.shutdown_and_exit() == 0


REMOTE_CODE = '''
from pathlib import Path
Path({marker!r}).write_text("remote code ran")
from transformers import PretrainedConfig


class ProbeConfig(PretrainedConfig):
    model_type = "draftwise_probe"
'''


def model_with_own_code(tiny_model_dir: Path, where: Path, marker: Path) -> Path:
    """A model directory (safetensors weights, so the pickle check passes) whose config names its own
    Python code, as hub repositories with custom architectures do."""
    model = where / "model-with-code"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    config["model_type"] = "draftwise_probe"
    config["auto_map"] = {"AutoConfig": "configuration_probe.ProbeConfig",
                          "AutoModelForCausalLM": "modeling_probe.ProbeModel"}
    (model / "config.json").write_text(json.dumps(config))
    (model / "configuration_probe.py").write_text(REMOTE_CODE.format(marker=str(marker)))
    (model / "modeling_probe.py").write_text("from configuration_probe import ProbeConfig\n")
    return model


@pytest.mark.parametrize("opt_in", [False, True], ids=["default", "trust-remote-code"])
def test_model_code_runs_only_when_opted_in(opt_in, start_server, places, tiny_model_dir, tmp_path):
    workspace, _ = places
    marker = tmp_path / "remote-code-ran"
    model = model_with_own_code(tiny_model_dir, tmp_path, marker)
    args = ["--target", str(model)] + (["--trust-remote-code"] if opt_in else [])
    server = start_server(args, env={"HF_HOME": str(tmp_path / "hf"), "HF_MODULES_CACHE": str(tmp_path / "modules")})
    # A client cannot opt in through settings: these keys are unknown, and ignored.
    server.initialize(workspace, options={"trustRemoteCode": True, "trust_remote_code": True})
    stats = server.wait_for_state()
    if opt_in:
        assert marker.exists(), "the switch did not let the model's code run: this test proves nothing"
    else:
        assert stats["state"] == "failed" and "--trust-remote-code" in stats["error"], stats["error"]
        assert not marker.exists(), "the model's own code ran without --trust-remote-code"
        assert "ignoring unknown draftwise settings" in server.log_text()
    assert server.shutdown_and_exit() == 0


def test_pack_is_trusted_only_with_the_verified_sha256(start_server, places, tiny_model_dir, tmp_path):
    """A preset directory is loaded only when its marker carries the preset's SHA-256 (written after
    verification). The tiny model stands in for the preset's files."""
    workspace, _ = places
    preset = PRESETS["qwen2.5-coder-0.5b"]
    home = tmp_path / "home"
    target = pack.preset_dir(preset, home / "models")
    shutil.copytree(tiny_model_dir, target)
    marker = target / pack.MARKER
    marker.write_text(json.dumps({"preset": preset.name, "gguf_sha256": "0" * 64}))
    server = start_server(["--target", preset.name], env={"DRAFTWISE_HOME": str(home)})
    server.initialize(workspace)
    stats = server.wait_for_state()
    assert stats["state"] == "failed" and "not pulled" in stats["error"]
    # With the verified digest the same files load: the digest was the only thing missing.
    marker.write_text(json.dumps({"preset": preset.name, "gguf_sha256": preset.sha256}))
    server.notify("workspace/didChangeConfiguration", {"settings": {"draftwise": {"dtype": "float32"}}})
    server.wait_for_state(("loading", "ready"), timeout=30)
    assert server.wait_for_state()["state"] == "ready"
    assert server.shutdown_and_exit() == 0


# ---- workspace boundary --------------------------------------------------------------------------

def test_context_never_comes_from_outside_the_workspace(start_server, places, tiny_model_dir):
    workspace, outside = places
    sibling = workspace.parent / (workspace.name + "-sibling")  # same prefix, another folder
    sibling.mkdir(exist_ok=True)
    for folder in (outside, sibling):
        (folder / "secret.py").write_text(f"API_KEY = '{WATCHED_TEXT}'\n")
    (outside / "never_opened.py").write_text(f"# {WATCHED_TEXT}\n")
    server = start_server(tiny_args(tiny_model_dir), instrumented=True,
                          env={"DRAFTWISE_TEST_WATCH_DIR": str(outside), "DRAFTWISE_TEST_WATCH_TEXT": WATCHED_TEXT})
    server.initialize(workspace, options={"maxTokens": 4})
    assert server.wait_for_state()["state"] == "ready"

    current = (workspace / "app.py").as_uri()
    server.open((workspace / "helpers.py").as_uri(), "def helper():\n    return 42\n")
    # Open in the editor but outside the workspace: as a file, through `..`, and in a sibling folder.
    server.open((outside / "secret.py").as_uri(), f"API_KEY = '{WATCHED_TEXT}'\n")
    server.open(workspace.as_uri() + "/../" + outside.name + "/climb.py", f"TOKEN = '{WATCHED_TEXT}'\n")
    server.open((sibling / "secret.py").as_uri(), f"API_KEY = '{WATCHED_TEXT}'\n")
    server.open(current, "from helpers import helper\n\nprint(helper(")
    assert "result" in server.response(server.inline(current, 2, 13), 60)
    # A completion in the outside file itself: the model sees its name, not where it lives.
    assert "result" in server.response(server.inline((outside / "secret.py").as_uri(), 1, 0), 60)

    seen = server.call("draftwiseTest/introspect", {})["result"]
    by_document = {r["document"]: r for r in seen["engineRequests"]}
    app = by_document[current]
    # the mechanism works: the workspace file is there (the repository context: it defines `helper`)
    assert app["context"] == ["helpers.py"], app
    assert not any(r["watchedTextInContext"] for r in seen["engineRequests"]), seen["engineRequests"]
    assert by_document[(outside / "secret.py").as_uri()]["path"] == "secret.py"
    assert seen["touchedWatchedPaths"] == [], "the server opened or listed files outside the workspace"
    assert server.shutdown_and_exit() == 0


# ---- logs ----------------------------------------------------------------------------------------

def traffic_with_secrets(server, workspace: Path) -> None:
    """Normal editing and every error path that handles document text, with SECRET in the text."""
    uri = (workspace / "secrets.py").as_uri()
    server.open(uri, f"token = '{SECRET}-open'\ndef f(x):\n    return ")
    server.response(server.inline(uri, 2, 11), 60)
    change = {"range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 0}},
              "text": f"# {SECRET}-typed\n"}
    server.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 2}, "contentChanges": [change]})
    server.response(server.inline(uri, 3, 11), 60)
    bad_range = {"range": {"start": {"line": 3, "character": 0}, "end": {"line": 0, "character": 0}},
                 "text": f"{SECRET}-badrange"}
    server.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": 3}, "contentChanges": [bad_range]})
    server.notify("textDocument/didChange", {"textDocument": {"uri": (workspace / "never.py").as_uri(), "version": 2},
                                             "contentChanges": [{"text": f"{SECRET}-unopened"}]})
    server.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": "one",
                                                            "text": f"{SECRET}-badversion"}})
    server.response(server.request("textDocument/inlineCompletion", {
        "textDocument": {"uri": uri}, "position": {"line": 0, "character": 0},
        "context": {"triggerKind": 1, "selectedCompletionInfo": {
            "range": {"start": {"line": 0, "character": 4}, "end": {"line": 0, "character": 1}},
            "text": f"{SECRET}-selected"}}}), 60)
    # A document the tokenizer cannot read (a lone surrogate): the engine's error path.
    odd = (workspace / "odd.py").as_uri()
    server.send_bytes(frame(json.dumps({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {
        "textDocument": {"uri": odd, "languageId": "python", "version": 1,
                         "text": f"x = '\ud800 {SECRET}-surrogate'\nprint("}}}).encode()))
    server.response(server.inline(odd, 1, 6), 60)
    server.notify("workspace/didChangeConfiguration", {"settings": {"draftwise": {"mystery": f"{SECRET}-setting"}}})
    server.response(server.request("draftwise/documentText", {"textDocument": {"uri": uri}}), 60)
    server.stats()


def test_logs_hold_no_document_text(start_server, places, tiny_model_dir, tmp_path):
    workspace, _ = places
    log_file = tmp_path / "draftwise.log"
    server = start_server([*tiny_args(tiny_model_dir), "--log-file", str(log_file)])
    server.initialize(workspace, options={"maxTokens": 4, "apiKey": f"{SECRET}-option"})
    assert server.wait_for_state()["state"] == "ready"
    traffic_with_secrets(server, workspace)
    assert server.shutdown_and_exit() == 0
    logged = log_file.read_text(errors="replace") + server.log_text()
    assert "models ready" in logged  # the log is being written (this is not an empty file passing)
    assert SECRET not in logged, [line for line in logged.splitlines() if SECRET in line][:5]


def test_debug_logs_do_show_document_text(start_server, places, tiny_model_dir):
    """The control for the test above: with --debug, the same traffic does reach the log."""
    workspace, _ = places
    server = start_server(tiny_args(tiny_model_dir), debug=True)
    server.initialize(workspace, options={"maxTokens": 4})
    assert server.wait_for_state()["state"] == "ready"
    traffic_with_secrets(server, workspace)
    assert server.shutdown_and_exit() == 0
    assert f"{SECRET}-open" in server.log_text()
