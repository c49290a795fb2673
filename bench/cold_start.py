"""What the user waits for in a file they just opened: the first suggestion through a real `draftwise
serve`, asked at once after opening, and after pauses of 1 s and 3 s (`draftwise bench --cold-start N`).

One server per model, loaded before anything is timed (its start is `--serve-start`'s row). Each case
is one file of the benchmark corpus opened for the first time, with the cursor at a statement whose
prompt is 1,000-1,600 tokens: the editor opens the document, says where its cursor rests
(`draftwise/cursor`, as the VS Code and Neovim clients do; `--cold-start-hint off` leaves that out, as
a plain LSP client would), waits the pause, and asks for an inline completion. What is timed is the
request, from sending it to its answer. Every pause gets files of its own: a file read for one pause
would be warm for the next. The server's own stats say how much of each request was prompt reading.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

from bench.corpus import Case, sample_cases
from bench.metrics import percentile
from bench.serve_memory import _started

PAUSES_S = (0.0, 1.0, 3.0)
PROMPT_TOKENS = (1000, 1600)  # the prompts timed: long enough that reading them is what the user waits for
CHARS_PER_TOKEN = 3.2  # a first guess of a prefix's tokens from its characters (code, Qwen's tokenizer)


@dataclass
class ColdRun:
    case_id: str
    pause_s: float
    wait_ms: float  # the request, sent to answered
    prompt_tokens: int = 0
    reused_prompt_tokens: int = 0  # found read ahead
    prefill_ms: float = 0.0  # what prompt reading cost the job that answered
    shown: bool = False
    # what answered: "request" (the engine, for the request), "idle work" (the suggestion started where
    # the cursor rested, which the request joined: its prompt was read before the request came)
    answered_by: str = "request"
    error: str | None = None


def cold_cases(n: int, seed: int = 0) -> list[Case]:
    """n cases a pause, each in a file of its own, whose prefix is long enough for a 1,000-1,600-token
    prompt (the server's budget, 1,536 tokens by default, cuts longer ones)."""
    want = n * len(PAUSES_S)
    cases, seen, tries = [], set(), 0
    while len(cases) < want and tries < 6:
        for case in sample_cases(want * 3, seed=seed + tries):
            if case.source not in seen and len(case.prefix) >= PROMPT_TOKENS[0] * CHARS_PER_TOKEN:
                seen.add(case.source)
                cases.append(case)
        tries += 1
    return cases[:want]


def _ask(client, case: Case, uri: str, pause_s: float, hint: bool) -> ColdRun:
    text = case.prefix + case.suffix
    line = case.prefix.count("\n")
    character = len(case.prefix) - (case.prefix.rfind("\n") + 1)
    character = len(case.prefix[len(case.prefix) - character:].encode("utf-16-le")) // 2  # LSP's default units
    position = {"line": line, "character": character}
    client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": case.language, "version": 1,
                                                            "text": text}})
    if hint:
        client.notify("draftwise/cursor", {"textDocument": {"uri": uri}, "position": position})
    time.sleep(pause_s)
    before = client.request("draftwise/stats") or {}
    started = time.perf_counter()
    result = client.request("textDocument/inlineCompletion", {"textDocument": {"uri": uri}, "position": position,
                                                              "context": {"triggerKind": 2}})
    wait_ms = (time.perf_counter() - started) * 1000
    after = client.request("draftwise/stats") or {}
    client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    last = after.get("last") or {}
    idle = _count(after, "idle", "joined") + _count(after, "suggestions", "predicted") > \
        _count(before, "idle", "joined") + _count(before, "suggestions", "predicted")
    items = (result or {}).get("items", []) if isinstance(result, dict) else (result or [])
    return ColdRun(case.id, pause_s, round(wait_ms, 1), last.get("prompt_tokens", 0),
                   last.get("reused_prompt_tokens", 0), last.get("prefill_ms", 0.0), bool(items),
                   "idle work" if idle else "request")


def _count(stats: dict, group: str, key: str) -> int:
    return (stats.get(group) or {}).get(key) or 0


def cold_start(target: str, weights: str, cases: list[Case], hint: bool = True, extra: list[str] | None = None,
               progress=None, timeout_s: float = 900, pauses: tuple[float, ...] = PAUSES_S) -> dict:
    """Per pause (each gets an equal share of `cases`): the runs and their wait's p50 and p95 (ms), prompt
    tokens, and the share of the wait that prompt reading took (its median over the runs)."""
    client, _ = _started(target, weights, list(extra or []), timeout_s)
    runs: list[ColdRun] = []
    try:
        stats = client.request("draftwise/stats") or {}
        per_pause = len(cases) // len(pauses)
        for k, pause in enumerate(pauses):
            for case in cases[k * per_pause:(k + 1) * per_pause]:
                if progress is not None:
                    progress(f"cold start {pause:g} s {case.language}")
                try:
                    runs.append(_ask(client, case, f"file:///cold/{k}/{case.id.replace(':', '_')}", pause, hint))
                except Exception as exc:  # noqa: BLE001 - one case that fails must not lose the rest
                    runs.append(ColdRun(case.id, pause, 0.0, error=f"{type(exc).__name__}: {exc}".splitlines()[0]))
    finally:
        client.close()
    return {"target": target, "weights": stats.get("weights"), "kernel": stats.get("kernel"), "cursor_hint": hint,
            "pauses": summary(runs, pauses), "runs": [asdict(r) for r in runs]}


def summary(runs: list[ColdRun], pauses: tuple[float, ...] = PAUSES_S) -> dict:
    """Per pause: the runs and their wait's p50 and p95 (ms), prompt tokens, how many were read ahead,
    and prompt reading's share of the wait."""
    out = {}
    for pause in pauses:
        ok = [r for r in runs if r.pause_s == pause and r.error is None]
        waits = [r.wait_ms for r in ok]
        asked = [r for r in ok if r.wait_ms > 0]
        out[f"{pause:g}s"] = {
            "runs": len(ok), "p50_ms": _round(percentile(waits, 50)), "p95_ms": _round(percentile(waits, 95)),
            "prompt_tokens_median": statistics.median([r.prompt_tokens for r in ok]) if ok else None,
            "read_ahead_median": statistics.median([r.prompt_tokens if r.answered_by != "request"
                                                    else r.reused_prompt_tokens for r in ok]) if ok else None,
            "answered_by_idle_work": sum(r.answered_by != "request" for r in ok),
            "prompt_reading_share": _round(statistics.median([_reading_share(r) for r in asked]), 3) if asked else None,
            "shown": sum(r.shown for r in ok)}
    return out


def _reading_share(run: ColdRun) -> float:
    """Prompt reading's share of what the user waited for since the file opened: a request that joined
    idle work waited for the rest of a job started at the open (the cursor hint), `pause_s` earlier."""
    waited = run.wait_ms + (run.pause_s * 1000 if run.answered_by != "request" else 0.0)
    return min(1.0, run.prefill_ms / waited)


def _round(x, nd: int = 1):
    return None if x is None else round(x, nd)
