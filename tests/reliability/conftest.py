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
from collections import Counter
from pathlib import Path
from typing import Callable

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from raw_lsp import REPO_ROOT, SERVE, RawServer  # noqa: E402

INTROSPECT_SERVE = [sys.executable, str(Path(__file__).resolve().parent / "introspect_server.py"), "serve"]


class Figures:
    """Counts and measurements collected across the reliability tests of one run."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.values: dict[str, object] = {}
        self.faults: dict[str, str] = {}  # fault -> "survived" | what went wrong

    def add(self, key: str, n: int = 1) -> None:
        self.counts[key] += n

    def set(self, key: str, value: object) -> None:
        self.values[key] = value

    def fault(self, name: str, outcome: str) -> None:
        self.faults[name] = outcome

    def lines(self) -> list[str]:
        c, v = self.counts, self.values
        out = []
        if c["fuzz_messages"]:
            out.append(f"fuzz: {c['fuzz_messages']} messages tried ({c['fuzz_requests']} requests, "
                       f"{c['fuzz_notifications']} notifications, {c['fuzz_garbage']} malformed bodies, "
                       f"{c['fuzz_odd_envelopes']} broken envelopes) in {c['fuzz_batches']} batches")
            out.append(f"      requests answered exactly once: {c['fuzz_answered_once']}/{c['fuzz_requests']}; "
                       f"answers: {c['fuzz_results']} results, {c['fuzz_errors']} errors "
                       f"({', '.join(f'{k}: {n}' for k, n in sorted(v.get('fuzz_error_codes', {}).items()))}); "
                       f"completions the engine ran: {c['fuzz_engine_requests']}")
        out.append(f"crashes: {c['crashes']}   hangs: {c['hangs']}   protocol violations on stdout: {c['violations']}"
                   f"   (servers started: {c['servers']})")
        if "storm_requests" in v:
            out.append(f"storm: {v['storm_requests']} completion requests, {v['storm_cancels']} cancels, "
                       f"{v['storm_edits']} edits in {v['storm_seconds']:.0f} s; answers: {v['storm_answers']}")
            out.append(f"      RSS start {v['storm_rss_start_mib']:.0f} MiB, end {v['storm_rss_end_mib']:.0f} MiB "
                       f"(peak {v['storm_rss_peak_mib']:.0f} MiB, bound: start + {v['storm_rss_bound_mib']} MiB); "
                       f"threads {v['storm_threads_start']} -> {v['storm_threads_end']}; "
                       f"asyncio tasks {v['storm_tasks_start']} -> {v['storm_tasks_end']}")
            out.append(f"      last request answered right: {v['storm_last_right']}")
        if self.faults:
            survived = sum(o == "survived" for o in self.faults.values())
            out.append(f"faults injected: {len(self.faults)}, survived: {survived}")
            for name, outcome in sorted(self.faults.items()):
                out.append(f"      {name}: {outcome}")
        return out

    def as_dict(self) -> dict:
        return {"counts": dict(self.counts), "values": self.values, "faults": self.faults}


FIGURES = Figures()


@pytest.fixture(scope="session")
def figures() -> Figures:
    return FIGURES


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


def tiny_args(model_dir) -> list[str]:
    return ["--target", str(model_dir)]


__all__ = ["FIGURES", "Figures", "REPO_ROOT", "tiny_args"]
