"""The replay's report: a table on stdout (rich) and the JSON file."""
from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping

from rich.console import Console
from rich.table import Table

COLUMNS = (  # (key, header, format)
    ("pause_to_suggestion_ms_p50", "pause→shown p50", "{:.0f} ms"),
    ("pause_to_suggestion_ms_p95", "p95", "{:.0f} ms"),
    ("shown_within_1s_share", "shown ≤1 s", "{:.0%}"),
    ("accepted_share", "accepted", "{:.0%}"),
    ("chars_saved_share", "chars saved", "{:.0%}"),
    ("compute_s_per_char", "CPU s/char", "{:.3f}"),
    ("prompt_tokens_read_per_request_p50", "prompt read p50", "{:.0f}"),
    ("pauses", "pauses", "{}"),
    ("shown", "shown", "{}"),
)


def _cell(value, spec: str) -> str:
    return "-" if value is None else spec.format(value)


def print_table(data: Mapping, console: Console | None = None) -> None:
    console = console or Console(width=max(Console().width, 130))  # a pipe is 80 wide: keep rows whole
    table = Table(title="draftwise replay: typing back real files through the server")
    table.add_column("run", no_wrap=True)
    for _, header, _ in COLUMNS:
        table.add_column(header, justify="right")
    for name, run in data["runs"].items():
        table.add_row(name, *[_cell(run.get(key), spec) for key, _, spec in COLUMNS])
    console.print(table)
    ignored = [name for name, run in data["runs"].items()
               if not run.get("settings", {}).get("idle_setting_known_to_server", True)]
    if ignored:
        console.print(f"runs {', '.join(ignored)}: the server ignored the idleWork setting (logged as unknown), "
                      "so they ran the same server and differ only by chance")
    for name, c in (data.get("comparisons") or {}).items():
        if c:
            console.print(f"{name}: p50 {c['p50_ms']:.0f} against {c['reference_p50_ms']:.0f} ms, ×{c['ratio']:.2f} "
                          f"(95% interval ×{c['interval_95'][0]:.2f}–×{c['interval_95'][1]:.2f}; "
                          f"{c['pauses']} and {c['reference_pauses']} pauses); already on screen at "
                          f"{c['already_shown']} and {c['reference_already_shown']} of them; where a suggestion "
                          f"had to be made, p50 {_cell(c['computed_p50_ms'], '{:.0f}')} against "
                          f"{_cell(c['reference_computed_p50_ms'], '{:.0f}')} ms")
    for name, status in data.get("not_run", {}).items():
        console.print(f"{name}: not run: {status['reason']}")
    s = data["settings"]
    console.print(f"{len(data['files'])} files, {s['chars_per_file']} characters each, clients {s['client']}, "
                  f"speed ×{s['speed']}; pause percentiles are over pauses in which a suggestion appeared")


def machine_info() -> dict:
    """The benchmark's machine description, plus how busy the machine was when the replay began."""
    from bench.harness import machine_info as bench_machine_info

    info = bench_machine_info()
    try:
        info["load_average_1min_at_start"] = round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # not on every platform
        info["load_average_1min_at_start"] = None
    return info


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("draftwise", "pygls", "lsprotocol", "torch", "transformers", "llama-cpp-python"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def write_json(data: Mapping, path: str | Path) -> None:
    Path(path).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
