"""How `run()` sets up the process: stdout carries only protocol; TCP stays on loopback unless told."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from decoding.errors import DraftwiseError
from lsp_server.transport import check_listen_host, is_loopback

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


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "LocalHost", "::1", "127.0.0.2", "127.255.255.254"])
def test_all_of_127_0_0_0_8_and_ipv6_loopback_are_loopback(host):
    assert is_loopback(host)
    check_listen_host(host, allow_remote=False)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "128.0.0.1", "192.168.1.20", "::2", "example.com",
                                  "localhost.example.com"])
def test_other_addresses_need_allow_remote(host):
    assert not is_loopback(host)
    with pytest.raises(DraftwiseError, match="no authentication.*--allow-remote"):
        check_listen_host(host, allow_remote=False)
    check_listen_host(host, allow_remote=True)
