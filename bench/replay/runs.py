"""One replay run (every file, one backend) and the figures it reports."""
from __future__ import annotations

import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from bench.metrics import percentile
from bench.replay.corpus import TypedRegion
from bench.replay.draftwise_backend import DraftwiseBackend
from bench.replay.editor import ClientProfile, Document, FileResult, TypingSession
from bench.replay.keystrokes import Keystroke, plan_keystrokes

SETTLE_S = 1.0  # after the last keystroke: what it started still counts as compute for typing
SHOWN_WITHIN_S = 1.0


@dataclass(frozen=True)
class Replay:
    """The same for every run compared: files, keystrokes and timing, client per file. workspace: the
    folder the server is given, where each file is typed at its own place; None: a scratch folder
    holding nothing but the typed documents."""

    regions: Sequence[TypedRegion]
    plans: Sequence[list[Keystroke]]
    profiles: Sequence[ClientProfile]
    speed: float = 1.0
    workspace: Path | None = None


def make_replay(regions: Sequence[TypedRegion], profiles: Sequence[ClientProfile], seed: int, speed: float,
                workspace: Path | None = None) -> Replay:
    plans = [plan_keystrokes(r.text, random.Random(f"{seed}:{i}"), speed) for i, r in enumerate(regions)]
    return Replay(regions, plans, profiles, speed, workspace)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def summarize(results: Sequence[FileResult], compute_s: float | None) -> dict:
    """The run's figures. Pause percentiles are over the pauses in which a suggestion appeared;
    `shown_within_1s_share` is over all pauses (a pause with nothing shown counts as a miss)."""
    latencies = [x for r in results for x in r.pause_latencies_s]
    seen = [x for x in latencies if x is not None]
    chars = sum(r.chars for r in results)
    total = {k: sum(getattr(r, k) for r in results)
             for k in ("typed_chars", "accepted_chars", "shown", "accepted", "requests", "cancelled")}
    return {
        "pause_to_suggestion_ms_p50": _ms(percentile(seen, 50)),
        "pause_to_suggestion_ms_p95": _ms(percentile(seen, 95)),
        "shown_within_1s_share": _share(sum(x <= SHOWN_WITHIN_S for x in seen), len(latencies)),
        "accepted_share": _share(total["accepted"], total["shown"]),
        "chars_saved_share": _share(total["accepted_chars"], chars),
        "compute_s_per_char": None if compute_s is None or not chars else round(compute_s / chars, 4),
        "pauses": len(latencies), "pauses_with_suggestion": len(seen), "chars": chars, **total,
        "compute_s": None if compute_s is None else round(compute_s, 2),
    }


def prompt_reading(stats: dict, typed_chars: int) -> dict:
    """What the server read of its prompts while the user typed: per request (median, from the
    engine's own record) and in all (requests, idle generations, read-aheads) per typed character."""
    cumulative, idle, per_request = stats.get("cumulative") or {}, stats.get("idle") or {}, stats.get("promptRead") or {}
    read = (cumulative.get("prompt_tokens", 0) - cumulative.get("reused_prompt_tokens", 0)
            + idle.get("prefetch_read_tokens", 0) + idle.get("prepared_tokens", 0))
    return {"prompt_tokens_read_per_request_p50": per_request.get("median"),
            "prompt_tokens_read_per_char": round(read / typed_chars, 1) if typed_chars else None}


def type_files(backend, replay: Replay, workspace: Path) -> list[FileResult]:
    results = []
    for i, (region, plan, profile) in enumerate(zip(replay.regions, replay.plans, replay.profiles)):
        in_place = replay.workspace is not None and region.source is not None
        place = region.source if in_place else workspace / f"{i}-{Path(region.path).name}"
        doc = Document(uri=place.as_uri(), language=region.language,
                       text=region.prefix + region.suffix, cursor=len(region.prefix))
        result = FileResult(region.path, region.language, profile.name, len(region.text))
        results.append(TypingSession(backend, doc, region.text, plan, profile, result, replay.speed).run())
    return results


def by_client(results: Sequence[FileResult]) -> dict:
    names = sorted({r.client for r in results})
    return {n: summarize([r for r in results if r.client == n], None) for n in names}


def run_draftwise(replay: Replay, serve_args: list[str], idle: bool, say=print, logs: Path | None = None,
                  settings: dict | None = None) -> dict:
    """Start a server with idle work on or off, type every file, stop it. logs: a folder to keep the
    server's log in (server-<run>.log); settings: more server settings (maxTimeMs, repoContext)."""
    which = run_name(idle, (settings or {}).get("repoContext", False))
    with tempfile.TemporaryDirectory(prefix="draftwise-replay-") as tmp:
        workspace = replay.workspace or Path(tmp) / "workspace"
        workspace.mkdir(exist_ok=True)
        log_path = (logs or Path(tmp)) / f"server-{which}.log"
        backend = DraftwiseBackend(serve_args, idle, workspace, log_path, settings)
        run, loaded, final, results = _type_with(backend, replay, workspace, f"run {which}", say)
    run.update(prompt_reading(final["stats"], run["typed_chars"]))
    return {**run, "settings": {**(settings or {}), "idleWork": idle,
                                "idle_setting_known_to_server": final["idle_setting_known"],
                                "weights": loaded.get("weights"), "drafter": loaded.get("drafter"),
                                "device": loaded.get("device")},
            "server_suggestions": final["stats"].get("suggestions"),
            # the path the typing ran on, and whether it speculated: the engine's own counts
            "server_engine": _engine_summary(final["stats"]),
            "server_repo_context": _repo_context_summary(final["stats"]), "files": [r.to_dict() for r in results]}


def _repo_context_summary(stats: dict) -> dict | None:
    """How often the context was chosen afresh or kept, and how much of the workspace was indexed."""
    context = stats.get("repoContext")
    if not context:
        return None
    index = context.get("index") or {}
    return {"selections": context.get("selections"),
            "index": {k: index.get(k) for k in ("files", "bytes", "truncated")}}


def shown_latencies_ms(run: dict) -> list[float]:
    """A run's pause -> suggestion latencies (ms) over the pauses in which a suggestion appeared."""
    return [x for f in run.get("files", []) for x in f.get("pause_latencies_ms", []) if x is not None]


def p50_ratio(run: dict, reference: dict, samples: int = 10000, seed: int = 0) -> dict | None:
    """run's pause -> suggestion p50 over reference's, with a 95% bootstrap interval (pauses resampled
    within each run). A replay has some fifty pauses per run, and the runs' pauses are not the same
    ones (an accepted suggestion changes what is typed after it), so one run's p50 against another's
    says little without the interval."""
    a, b = shown_latencies_ms(run), shown_latencies_ms(reference)
    if not a or not b:
        return None
    # a p50 of 0 ms (a suggestion already on screen) makes a ratio meaningless: floor both at 1 ms
    ratio = lambda x, y: max(percentile(x, 50), 1.0) / max(percentile(y, 50), 1.0)  # noqa: E731
    rng = random.Random(seed)
    boot = sorted(ratio(rng.choices(a, k=len(a)), rng.choices(b, k=len(b))) for _ in range(samples))
    # A latency of 0 is a suggestion typed along, already on screen when the pause began: how often that
    # happens depends on what was suggested, not on how fast. The two apart say which one moved the p50.
    computed = lambda xs: percentile([x for x in xs if x > 0], 50)  # noqa: E731
    return {"p50_ms": percentile(a, 50), "reference_p50_ms": percentile(b, 50), "ratio": round(ratio(a, b), 3),
            "interval_95": [round(boot[int(0.025 * samples)], 3), round(boot[int(0.975 * samples) - 1], 3)],
            "pauses": len(a), "reference_pauses": len(b),
            "already_shown": sum(x == 0 for x in a), "reference_already_shown": sum(x == 0 for x in b),
            "computed_p50_ms": computed(a), "reference_computed_p50_ms": computed(b)}


def comparisons(runs: dict) -> dict:
    """Each "+context" run against the same idle setting without it."""
    return {f"{name} vs {name.removesuffix('+context')}": p50_ratio(run, runs[name.removesuffix("+context")])
            for name, run in runs.items() if name.endswith("+context") and name.removesuffix("+context") in runs}


def run_name(idle: bool, repo_context: bool) -> str:
    """"on"/"off" for idle work, "+context" with the repository context."""
    return ("on" if idle else "off") + ("+context" if repo_context else "")


def _engine_summary(stats: dict) -> dict:
    cumulative, idle = stats.get("cumulative") or {}, stats.get("idle") or {}
    return {"verify": stats.get("verify"),
            **{k: cumulative.get(k) for k in ("generated_tokens", "target_forwards", "drafted_tokens",
                                              "accepted_tokens", "drafted_by", "accepted_by")},
            "idle_prefetches": idle.get("prefetches")}


def run_llama_vim(replay: Replay, binary: str, gguf: str, say=print) -> dict:
    """The same keystrokes through llama.vim's logic and llama-server's /infill (every file with
    llama.vim's editor behaviour instead of the file's client)."""
    from bench.replay.llama_vim import LLAMA_VIM, SERVER_FLAGS, LlamaVimBackend

    backend = LlamaVimBackend(binary, gguf)
    as_llama_vim = Replay(replay.regions, replay.plans, [LLAMA_VIM] * len(replay.regions), replay.speed)
    with tempfile.TemporaryDirectory(prefix="draftwise-replay-") as tmp:
        run, _, final, results = _type_with(backend, as_llama_vim, Path(tmp), "llama.vim + llama-server", say)
    return {**run, "settings": {"server": "llama-server /infill", "gguf": Path(gguf).name,
                                "server_flags": SERVER_FLAGS, **final},
            "files": [r.to_dict() for r in results]}


def _type_with(backend, replay: Replay, workspace: Path, name: str, say) -> tuple[dict, dict, dict, list[FileResult]]:
    """Start the backend, type every file, stop it: the run's figures, what start() reported, the
    backend's final report and each file's result."""
    try:
        say(f"{name}: loading the model ...")
        loaded = backend.start()
        cpu0 = backend.cpu_seconds()
        say(f"{name}: typing {len(replay.regions)} files ...")
        results = type_files(backend, replay, workspace)
        time.sleep(SETTLE_S / replay.speed)
        compute_s = backend.cpu_seconds() - cpu0
        final = backend.final_report()
    finally:
        backend.stop()
    return {**summarize(results, compute_s), "by_client": by_client(results)}, loaded, final, results
