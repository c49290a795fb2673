"""llama.cpp's server `/infill` endpoint as a replay backend: can it be run here?

The peer's real path is llama.vim talking to llama.cpp's `llama-server` on `/infill`. The request
body llama.vim sends (autoload/llama.vim, `llama#fim`) is `LLAMA_VIM_REQUEST` below. When the
llama.cpp extra (llama-cpp-python) is installed, its bundled server is started on the same GGUF and
asked for `/infill`; llama-cpp-python's server serves only OpenAI-style routes, so it answers 404,
and the replay reports that instead of substituting another endpoint.
"""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from decoding.bench import llamacpp_baselines

# llama.vim's `llama#fim` request settings (its defaults: n_predict 128, t_max_prompt_ms 500,
# t_max_predict_ms 1000, or 250 for a first request before its speculative follow-up).
LLAMA_VIM_REQUEST = {
    "input_prefix": "", "input_suffix": "", "input_extra": [], "prompt": "",
    "n_predict": 128, "stop": [], "n_indent": 0, "top_k": 40, "top_p": 0.90, "stream": False,
    "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
    "t_max_prompt_ms": 500, "t_max_predict_ms": 250,
}
SERVER_START_S = 180.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, timeout: float) -> int:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status
    except urllib.error.HTTPError as err:
        return err.code


def _wait_until_up(base: str, proc: subprocess.Popen) -> bool:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(base + "/v1/models", timeout=2):
                return True
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    return False


def probe_python_server(gguf: str) -> int | None:
    """Start llama-cpp-python's server on the GGUF and POST llama.vim's body to /infill; the HTTP
    status, or None when the server did not come up."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--host", "127.0.0.1",
                             "--port", str(port), "--n_ctx", "2048"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        if not _wait_until_up(base, proc):
            return None
        body = {**LLAMA_VIM_REQUEST, "input_prefix": "def add(a, b):\n", "prompt": "    return"}
        return _post(base + "/infill", body, timeout=60)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def infill_status(target: str) -> dict:
    """{"run": bool, "reason": str, ...}: whether the replay can drive llama.cpp's /infill here."""
    if not llamacpp_baselines.available():
        return {"run": False, "reason": "the llama.cpp extra (llama-cpp-python) is not installed"}
    gguf = llamacpp_baselines.gguf_for(target)
    version = llamacpp_baselines.version()
    if gguf is None:
        return {"run": False, "reason": f"no GGUF file for {target}", "llama_cpp_python": version}
    if shutil.which("llama-server"):
        return {"run": False, "llama_cpp_python": version,
                "reason": "a llama-server binary is on PATH, but the replay's llama.vim driver for it is not "
                          "written yet"}
    status = probe_python_server(str(gguf))
    if status is None:
        reason = "llama-cpp-python's server did not start on the GGUF"
    elif status == 404:
        reason = (f"llama-cpp-python {version}'s server has no /infill endpoint (POST /infill: HTTP 404; it "
                  "serves OpenAI-style routes only) and no llama-server binary is on PATH")
    else:
        reason = f"llama-cpp-python's server answered POST /infill with HTTP {status}; the replay does not drive it"
    return {"run": False, "reason": reason, "llama_cpp_python": version, "infill_http_status": status,
            "llama_vim_request": LLAMA_VIM_REQUEST}
