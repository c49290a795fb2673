"""`draftwise replay FILE... [--idle on|off|both] [--chars N] [--json OUT]`"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.replay import corpus, report
from bench.replay.editor import CLIENTS
from bench.replay.runs import comparisons, make_replay, run_draftwise, run_llama_vim, run_name

IDLE_RUNS = {"on": (True,), "off": (False,), "both": (False, True)}
CONTEXT_RUNS = {"on": (True,), "off": (False,), "both": (False, True)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="*", metavar="FILE", help=f"source files to type back (default: "
                   f"{corpus.DEFAULT_FILES} installed files, several languages)")
    p.add_argument("--idle", choices=tuple(IDLE_RUNS), default="both",
                   help="idle work (the idleWork setting: suggestions started at pauses, read-ahead, "
                        "prefetch) on, off, or both side by side (default: %(default)s)")
    p.add_argument("--repo-context", choices=tuple(CONTEXT_RUNS), default="off",
                   help="the repository context (the repoContext setting: definitions and similar code from "
                        "other files of the workspace) off, on, or both side by side; it needs --workspace "
                        "(default: %(default)s)")
    p.add_argument("--workspace", metavar="DIR", type=Path,
                   help="the server's workspace folder: files are typed at their own place in it (default "
                        "FILEs: some of its source files); without it, a scratch folder holds only the typed files")
    p.add_argument("--chars", type=int, default=300, metavar="N",
                   help="characters typed per file (default: %(default)s)")
    p.add_argument("--client", choices=(*CLIENTS, "mixed"), default="mixed",
                   help="whose debounce and display rules: vscode, neovim, or mixed (files alternate) "
                        "(default: %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the file choice, regions and timing (default: %(default)s)")
    p.add_argument("--speed", type=float, default=1.0,
                   help="divide every typing delay by this (tests type fast; default: %(default)s)")
    p.add_argument("--llamacpp", choices=("auto", "off"), default="auto",
                   help="also type the files through llama.vim's logic and llama.cpp's llama-server /infill "
                        "on the same GGUF, when a llama-server binary is found (default: %(default)s)")
    p.add_argument("--llama-server", metavar="PATH",
                   help="the llama-server binary (default: on PATH, or next to this Python; "
                        "`make setup-llama-server` builds one)")
    p.add_argument("--max-time-ms", type=int, metavar="MS",
                   help="the server's maxTimeMs setting, the cap on one suggestion's generation "
                        "(default: the server's own)")
    p.add_argument("--json", dest="json_path", metavar="OUT", help="write every figure to OUT")
    p.add_argument("--server-logs", metavar="DIR", type=Path,
                   help="keep each run's server log in DIR (server-on.log, server-off.log)")


def serve_args(args) -> list[str]:
    """The model flags of `draftwise serve`, from the same flags given to `replay`."""
    out = ["--target", args.target, "--drafter", args.drafter, "--max-tokens", str(args.max_tokens),
           "--device", args.device, "--dtype", args.dtype, "--weights", args.weights,
           "--draft-weights", args.draft_weights, "--context-tokens", str(args.context_tokens),
           "--suffix", args.suffix]
    if args.draft:
        out += ["--draft", args.draft]
    if args.trust_remote_code:
        out.append("--trust-remote-code")
    return out


def _profiles(name: str, count: int) -> list:
    order = list(CLIENTS.values())
    return [CLIENTS[name] if name in CLIENTS else order[i % len(order)] for i in range(count)]


def _llama_vim_setup(args) -> dict:
    """{"binary", "gguf"} for the llama.vim run, or {"reason"} why it cannot run here."""
    from decoding.models.checkpoint import gguf_file
    from bench.llama_server import find_llama_server

    binary = find_llama_server(args.llama_server)
    if binary is None:
        where = args.llama_server or "on PATH or next to this Python"
        return {"reason": f"no llama-server binary ({where}); `make setup-llama-server` builds one from "
                          "llama-cpp-python's source"}
    gguf = gguf_file(args.target)
    if gguf is None:
        return {"reason": f"no GGUF file for {args.target}"}
    return {"binary": binary, "gguf": str(gguf)}


def run(args) -> int:
    if args.chars < 1 or args.speed <= 0 or (args.max_time_ms is not None and args.max_time_ms < 0):
        raise corpus.CorpusError("--chars must be at least 1, --speed positive and --max-time-ms not negative")
    if args.target == "auto":  # the model `draftwise serve` would choose here: the replay names it
        from decoding.setup.target_choice import choose_target

        choice = choose_target(args.target, args.device)
        print(f"draftwise replay: target auto: {choice.spec} ({choice.reason})", file=sys.stderr)
        args.target = choice.spec
    workspace = args.workspace.resolve() if args.workspace else None
    if workspace is not None and not workspace.is_dir():
        raise corpus.CorpusError(f"--workspace {args.workspace}: not a folder")
    if args.repo_context != "off" and workspace is None:
        raise corpus.CorpusError("--repo-context on|both needs --workspace DIR: the context comes from its other files")
    files = [Path(f).resolve() for f in args.files]
    outside = [str(f) for f in files if workspace is not None and not f.is_relative_to(workspace)]
    if outside:
        raise corpus.CorpusError(f"not inside --workspace {args.workspace}: {', '.join(outside)}")
    regions = (corpus.regions_of(files, args.chars, args.seed) if files
               else corpus.default_regions(args.chars, args.seed, workspace=workspace))
    if args.server_logs:
        args.server_logs.mkdir(parents=True, exist_ok=True)
    replay = make_replay(regions, _profiles(args.client, len(regions)), args.seed, args.speed, workspace)
    say = lambda msg: print(msg, file=sys.stderr)  # noqa: E731 - progress on stderr; the table owns stdout
    data = {"settings": {"target": args.target, "chars_per_file": args.chars, "client": args.client,
                         "seed": args.seed, "speed": args.speed, "idle": args.idle,
                         "repo_context": args.repo_context, "suffix": args.suffix,
                         "workspace": corpus.shown_path(workspace) if workspace is not None else None,
                         "debounce_ms": {c.name: round(c.debounce_s * 1000) for c in CLIENTS.values()}},
            "machine": report.machine_info(), "versions": report.versions(), "date": report.stamp(),
            "files": [{"path": r.path, "language": r.language, "line": r.line, "chars": len(r.text)} for r in regions],
            "runs": {}, "not_run": {}}
    for idle in IDLE_RUNS[args.idle]:
        for context in CONTEXT_RUNS[args.repo_context]:
            settings = {} if args.max_time_ms is None else {"maxTimeMs": args.max_time_ms}
            if workspace is not None:
                settings["repoContext"] = context
            data["runs"][run_name(idle, context)] = run_draftwise(replay, serve_args(args), idle, say,
                                                                  args.server_logs, settings)
    if args.llamacpp == "auto":
        peer = _llama_vim_setup(args)
        if "reason" in peer:
            data["not_run"]["llamacpp"] = peer
        else:
            data["runs"]["llamacpp"] = run_llama_vim(replay, peer["binary"], peer["gguf"], say)
    data["comparisons"] = comparisons(data["runs"])
    report.print_table(data)
    if args.json_path:
        report.write_json(data, args.json_path)
    return 0
