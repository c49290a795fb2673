"""How `run()` sets up the process: stdout carries only protocol; TCP stays on loopback unless told."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from decoding.errors import DraftwiseError
from lsp_server.server import _check_host

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_stray_prints_go_to_stderr_not_into_the_protocol_stream():
    script = (
        "import os, sys\n"
        "from lsp_server.server import _protocol_stdout\n"
        "protocol = _protocol_stdout()\n"
        "print('stray print')\n"
        "os.write(1, b'stray fd write\\n')\n"  # what a C library writing to fd 1 does
        "protocol.write(b'Content-Length: 2\\r\\n\\r\\n{}')\n"
        "protocol.flush()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, env=env, timeout=60, check=True)
    assert done.stdout == b"Content-Length: 2\r\n\r\n{}"
    assert b"stray print" in done.stderr and b"stray fd write" in done.stderr


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_addresses_are_allowed(host):
    _check_host(host, allow_remote=False)


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "example.com"])
def test_other_addresses_need_allow_remote(host):
    with pytest.raises(DraftwiseError, match="no authentication"):
        _check_host(host, allow_remote=False)
    _check_host(host, allow_remote=True)
