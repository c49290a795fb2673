"""Fixtures of the reliability tests, and the figures they report.

Every server these tests start goes through `start_server`, which counts crashes: a process that
ended without being asked to (no shutdown/exit, no closed pipe). The figures (messages tried,
crashes, hangs, memory over the cancellation storm, faults injected and survived) are printed as a
block at the end of the run, which `make test-reliability` shows.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Callable

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from raw_lsp import SERVE, RawServer  # noqa: E402
from reliability_support import FIGURES, INTROSPECT_SERVE  # noqa: E402


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not FIGURES.counts and not FIGURES.values and not FIGURES.faults:
        return
    terminalreporter.section("draftwise reliability figures")
    for line in FIGURES.lines():
        terminalreporter.write_line(line)
    target = os.environ.get("DRAFTWISE_RELIABILITY_FIGURES")
    if target:  # for the README: the same figures as JSON
        Path(target).write_text(json.dumps(FIGURES.as_dict(), indent=2, default=str))


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    """A workspace folder and a folder outside it."""
    root = tmp_path_factory.mktemp("places")
    (root / "workspace").mkdir()
    (root / "outside").mkdir()
    return root / "workspace", root / "outside"


@pytest.fixture(scope="module")
def start_server(tmp_path_factory) -> Callable[..., RawServer]:
    """start_server(args, env=..., instrumented=False, debug=False) -> RawServer; closed (and
    crash-counted) at the end of the module. instrumented: through introspect_server.py."""
    started: list[RawServer] = []
    logs = tmp_path_factory.mktemp("server-logs")

    def start(args, *, env: dict[str, str] | None = None, instrumented: bool = False, debug: bool = False,
              **kwargs) -> RawServer:
        command = list(INTROSPECT_SERVE if instrumented else SERVE)
        if debug:  # a flag of the `draftwise` command itself, before the subcommand
            command.insert(-1, "--debug")
        server = RawServer(args, log_path=logs / f"server-{len(started)}.log", env=env, command=command, **kwargs)
        started.append(server)
        FIGURES.add("servers")
        return server

    yield start
    for server in started:
        server.close()
        if server.crashed:
            FIGURES.add("crashes")
            print(f"server {server.pid} crashed; its log:\n{server.log_text()[-4000:]}", file=sys.stderr)
        FIGURES.add("violations", len(server.books.violations))


