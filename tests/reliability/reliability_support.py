"""What the reliability tests share besides fixtures: the figures they collect, and how to start a server.

(Not in conftest.py: test modules import these, and `conftest` is not a unique module name.)
"""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

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
        out.append(f"crashes: {c['crashes']}   hangs (fuzz, storm): {c['hangs']}   "
                   f"protocol violations on stdout: {c['violations']}   servers started: {c['servers']}")
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




def tiny_args(model_dir) -> list[str]:
    return ["--target", str(model_dir)]
