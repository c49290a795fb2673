"""`draftwise bench`: the model flags (--target --draft --drafter --max-tokens --device --dtype
--context-tokens) come from the main CLI; this module adds the benchmark's own and runs it."""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shlex
import sys
from collections import Counter
from pathlib import Path

from bench.corpus import CorpusError, parse_languages, sample_cases
from bench.llama_server import QUANT_TYPES
from bench.metrics import ALL_MODES, LLAMA_SERVER
from decoding.errors import DraftwiseError

log = logging.getLogger("draftwise.bench")


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more: {text}")
    return n


def parse_modes(text: str | None) -> tuple[str, ...]:
    if not text:
        return ALL_MODES
    modes = tuple(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    unknown = [m for m in modes if m not in ALL_MODES]
    if unknown:
        raise DraftwiseError(f"unknown mode {', '.join(unknown)}: use any of {', '.join(ALL_MODES)}")
    if "hf-plain" not in modes:
        modes = ("hf-plain",) + modes  # the reference every speedup is measured against
    return modes


def parse_remote_list(text: str | None) -> tuple[tuple[str, str], ...]:
    """--remote's `[LABEL=]TARGET,...` as (label, target) pairs; one target may go unlabelled."""
    pairs = []
    # a comma starts the next server only before `[LABEL=]openai:` or `llamacpp:` (a URL may hold one)
    parts = re.split(r",(?=\s*(?:[\w.+-]+=)?(?:openai|llamacpp):)", text or "")
    for item in filter(None, (part.strip() for part in parts)):
        labelled = re.fullmatch(r"([\w.+-]+)=(.+)", item)  # a URL's query may hold '=': not a label
        pairs.append(labelled.groups() if labelled else ("", item))
    labels = [label for label, _ in pairs]
    if len(pairs) > 1 and ("" in labels or len(set(labels)) < len(labels)):
        raise DraftwiseError("--remote: give each server its own label (LABEL=TARGET) when there are several")
    return tuple(pairs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("benchmark")
    g.add_argument("--corpus", metavar="PATH",
                   help="benchmark on this repository's files (default: the Python standard library, installed "
                        "packages' sources, C headers and global npm packages on this machine)")
    g.add_argument("--limit", type=_positive, default=8, metavar="N", help="number of cases (default: %(default)s)")
    g.add_argument("--threads", type=_positive, metavar="N",
                   help="the engine's torch threads (default: torch's, one a core); more than the cores "
                        "is slow but computes what such a machine computes")
    g.add_argument("--languages", metavar="LIST",
                   help="comma-separated languages, e.g. python,javascript,c (default: every one found)")
    g.add_argument("--seed", type=int, default=0, help="seed for sampling files and cursor positions (default: 0)")
    g.add_argument("--modes", metavar="LIST",
                   help=f"comma-separated modes to run (default: all that can run here: {','.join(ALL_MODES)})")
    g.add_argument("--repeats", type=_positive, default=1, metavar="N",
                   help="run each case and mode N times and keep the fastest (default: 1)")
    g.add_argument("--lookup-tokens", type=_positive, default=10, metavar="N",
                   help="prompt lookup length for the transformers and llama.cpp built-ins (default: 10)")
    g.add_argument("--typing-cases", type=_positive, default=2, metavar="N",
                   help="cases for the typing simulation; 0 skips it (default: 2)")
    g.add_argument("--keystrokes", type=_positive, default=3, metavar="K",
                   help="characters of each suggestion typed, one request per keystroke (default: 3)")
    g.add_argument("--typing-prompt-tokens", type=_positive, default=1000, metavar="N",
                   help="prompt size of the typing simulation (default: 1000)")
    g.add_argument("--cancel-tries", type=_positive, default=6, metavar="N",
                   help="requests cancelled mid-run to count forwards after cancel; 0 skips it (default: 6)")
    g.add_argument("--remote", metavar="LIST",
                   help="also run the `remote` mode: the same cases served by inference servers, each "
                        "[LABEL=]TARGET, comma-separated, e.g. openai:http://host:8000/v1#model; rows "
                        "`remote@LABEL`, and a row `remote@NAME+X` counts its identical text against "
                        "`remote@NAME` (the same server without X, e.g. vllm and vllm+ngram)")
    g.add_argument("--llama-server", metavar="LIST",
                   help="also run llama.cpp's own server on the target's GGUF, one process per variant: any of "
                        "plain, ngram-simple, ngram-mod, draft (the --draft model's GGUF; draft:N sets "
                        "--spec-draft-n-max N), draft-plain (the --draft model itself, decoded plainly); rows "
                        "llama-server@VARIANT, asked over /infill")
    g.add_argument("--llama-server-binary", metavar="PATH",
                   help="the llama-server to run (default: on PATH, else beside this Python, where "
                        "`make setup-llama-server` puts it; `make setup-llama-server ISA=avx2|avxvnni` builds "
                        ".venv/bin/llama-server-avx2|avxvnni, which must be given here)")
    g.add_argument("--llama-server-quants", metavar="LIST",
                   help="also run --llama-server's plain variant on llama.cpp's other formats, e.g. q4_0,q8_0 (any of "
                        f"{', '.join(QUANT_TYPES)}): the target's GGUF requantized by llama-quantize (`make setup-llama-quantize`), made once into "
                        "$DRAFTWISE_HOME/gguf; rows llama-server@plain:FORMAT, the shipped file's staying "
                        "llama-server@plain. The fastest plain row is then the one auto is held against, for "
                        "decoding and for prompt reading alike")
    g.add_argument("--llama-goal", type=float, metavar="X",
                   help="auto's decode speed over llama.cpp's plain decoding that counts as met "
                        "(default: 1.3; 1.5 with --draft, where the target is the bigger model a draft model speeds "
                        "up); over its fastest speculation: 1.3; over its plain decoding of the draft model "
                        "(draft-plain): 1.0")
    g.add_argument("--llamacpp-threads", type=_positive, default=0, metavar="N",
                   help="llama.cpp threads, llama-server's included (default: one per CPU core)")
    g.add_argument("--quality-cases", type=_positive, default=0, metavar="N",
                   help="score completion quality on N more cases per weight format (and llama.cpp Q4), "
                        "untimed (default: %(default)s; the timed cases are always scored)")
    g.add_argument("--quality-reference", metavar="FILE",
                   help="an earlier bench JSON with fp32 rows: run its cases (timed and quality) instead of "
                        "sampling, and pair each format with its fp32 records for the quality gate, so fp32 (the "
                        "slowest format) need not run again")
    g.add_argument("--quality-merge", metavar="LIST",
                   help="pool the scored records of earlier bench JSONs (comma-separated; the same --max-tokens "
                        "and --context-tokens) into one quality table with the gate's verdicts, and exit (loads no "
                        "model); a case scored in more than one file counts once. Runs of several models on the "
                        "same cases (--quality-reference) compare the models: rows MODEL@FORMAT. FILE=LABEL puts "
                        "a file's records in rows of their own, ROW/LABEL (the same model before and after a change)")
    g.add_argument("--quality-versus", metavar="ROW",
                   help="with --quality-merge: the row every other is paired with (default: fp32, or with several "
                        "models the first file's model at fp32, e.g. qwen2.5-coder-0.5b@fp32)")
    g.add_argument("--cross-file", dest="crossfile", type=_positive, default=0, metavar="N",
                   help="also run N cross-file cases (the removed line uses a name defined in another file of its "
                        "package, the package is the workspace): quality with and without the repository context, "
                        "lookup with and without the repository index; with --limit 0, only these (default: %(default)s)")
    g.add_argument("--corpus-context", dest="corpus_context", type=_positive, default=0, metavar="N",
                   help="also run N cases of the ordinary corpus (not chosen for using another file) with and "
                        "without the repository context, each with its package as the workspace: whether the "
                        "context costs completions in general; with --limit 0, only these (default: %(default)s)")
    g.add_argument("--repo-context", default="off,on", metavar="LIST",
                   help="the cross-file cases' runs without (off) and with (on) the repository context: rows "
                        "MODE@FORMAT and MODE@FORMAT+context (default: %(default)s)")
    g.add_argument("--serve-rss", action="store_true",
                   help="also start `draftwise serve` once per format and measure its resident memory (with --draft, "
                        "also with the draft model loaded). The JSON always holds each llama-server's own "
                        "(config.llama_server.rss_mib)")
    g.add_argument("--serve-start", action="store_true",
                   help="also start `draftwise serve` (the first weights format) and time it to its first "
                        "suggestion; measured first, on a quiet machine; with --limit 0 and no --cross-file, alone")
    g.add_argument("--cold-start", dest="cold_start", type=_positive, default=0, metavar="N",
                   help="also time the first suggestion in a just-opened file through `draftwise serve` (the first "
                        "weights format): N files asked at once, N after a 1 s pause, N after 3 s; 1,000-1,600-token "
                        "prompts; p50 and p95 per pause; measured first; with --limit 0, alone")
    g.add_argument("--cold-start-hint", choices=("on", "off"), default="on",
                   help="--cold-start's editor says where its cursor rests (draftwise/cursor), as the VS Code and "
                        "Neovim clients do; off: a plain LSP client (default: %(default)s)")
    g.add_argument("--list-cases", action="store_true", help="print the sampled cases and exit (loads no model)")
    g.add_argument("--json", dest="json_path", metavar="FILE", help="write every number measured to FILE")
    g.add_argument("--plot", metavar="FILE", help="write a PNG of speedup per mode and language to FILE")


def _llama_server_variants(args, modes: tuple[str, ...]):
    """--llama-server's variants; they run unless --modes leaves `llama-server` out."""
    from bench.llama_server import parse_variants

    try:
        variants = parse_variants(getattr(args, "llama_server", None))
    except ValueError as exc:
        raise DraftwiseError(str(exc)) from exc
    if variants and LLAMA_SERVER not in modes:
        raise DraftwiseError("--llama-server is given but --modes leaves out llama-server")
    if variants:
        import importlib.util

        if importlib.util.find_spec("httpx") is None:
            raise DraftwiseError("--llama-server needs httpx (pip install 'draftwise[bench]')")
    binary = getattr(args, "llama_server_binary", None)
    if binary and not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        raise DraftwiseError(f"--llama-server-binary {binary}: not an executable file")
    return variants


def _llama_server_quants(args, variants) -> tuple[str, ...]:
    """--llama-server-quants's formats; they need the plain variant, whose rows they are."""
    from bench.llama_server import Variant, parse_quants

    try:
        quants = parse_quants(getattr(args, "llama_server_quants", None))
    except ValueError as exc:
        raise DraftwiseError(str(exc)) from exc
    if quants and Variant("plain") not in variants:
        raise DraftwiseError("--llama-server-quants runs llama-server's plain variant: add plain to --llama-server")
    return quants


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # not on every platform
        return None


def _print_cases(cases) -> None:
    print("| # | language | cursor | file:line | prefix chars | suffix chars | removed text |")
    print("|---:|---|---|---|---:|---:|---|")
    for i, c in enumerate(cases, 1):
        removed = c.expected.replace("\n", "⏎")[:40].replace("|", "\\|")
        print(f"| {i} | {c.language} | {c.kind} | {c.path}:{c.line} | {len(c.prefix)} | {len(c.suffix)} | `{removed}` |")


def parse_formats(text: str | None) -> list[str]:
    from decoding.api import WEIGHT_FORMATS

    formats = list(dict.fromkeys(f.strip() for f in (text or "auto").split(",") if f.strip()))
    unknown = [f for f in formats if f not in WEIGHT_FORMATS]
    if unknown or not formats:
        raise DraftwiseError(f"unknown weights {', '.join(unknown)}: use any of {', '.join(WEIGHT_FORMATS)}")
    return formats


def load_engines(config, formats: list[str], say) -> tuple[dict, object, str]:
    """One engine per weight format, `auto` resolved to the format it picks (listed first). Returns
    (format -> engine, the fp32 engine the Hugging Face baselines use, auto's reason)."""
    from dataclasses import replace

    from decoding.engine import Engine

    engines: dict = {}
    reason = ""
    for fmt in sorted(formats, key=lambda f: f != "auto"):
        if fmt != "auto" and fmt in engines:
            continue
        say(f"loading {fmt} weights")
        engine = Engine(replace(config, weights=fmt))
        engine.load()
        chosen = engine.models.target.weights
        if fmt == "auto":
            reason = engine.models.weights.reason
        if chosen in engines:
            engine.close()
            continue
        engines[chosen] = engine
    reference = engines.get("fp32")
    if reference is None:  # hf-plain is always fp32: the reference every speedup is measured against
        say("loading fp32 weights for the transformers baselines")
        reference = Engine(replace(config, weights="fp32"))
        reference.load()
    return engines, reference, reason


def run(args) -> int:
    from decoding.api import EngineConfig

    if getattr(args, "quality_merge", None):
        return _quality_merge(args)
    if args.target == "auto":  # a run names the model it measured
        from decoding.setup.target_choice import choose_target

        choice = choose_target(args.target, getattr(args, "device", "auto"))
        print(f"draftwise bench: target auto: {choice.spec} ({choice.reason})", file=sys.stderr)
        args.target = choice.spec
    if (args.limit < 1 and not getattr(args, "crossfile", 0) and not getattr(args, "corpus_context", 0)
            and not getattr(args, "serve_start", False) and not getattr(args, "cold_start", 0)):
        raise DraftwiseError("--limit must be at least 1 (or 0 with --cross-file N, --corpus-context N, --serve-start "
                             "or --cold-start N)")
    if args.repeats < 1:
        raise DraftwiseError("--repeats must be at least 1")
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)
    for flag in ("plot", "json_path"):
        out = getattr(args, flag)
        if out and not Path(out).expanduser().resolve().parent.is_dir():
            raise DraftwiseError(f"cannot write {out}: its directory does not exist")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError as exc:
            raise DraftwiseError("--plot needs matplotlib (pip install 'draftwise[bench]')") from exc
    modes = parse_modes(args.modes)
    llama_server = _llama_server_variants(args, modes)
    llama_server_quants = _llama_server_quants(args, llama_server)
    formats = parse_formats(getattr(args, "weights_arg", None))
    serve_start = _serve_start(args, formats[0]) if args.serve_start else None
    cold = _cold_start(args, formats[0]) if getattr(args, "cold_start", 0) else None
    if args.limit == 0 and not args.crossfile and not args.corpus_context and (serve_start or cold):
        return _serve_start_only(args, serve_start, cold)
    if args.limit == 0:
        return _crossfile_only(args, formats[0])
    try:
        languages = parse_languages(args.languages)
        cases = sample_cases(args.limit + args.quality_cases, seed=args.seed, languages=languages, corpus=args.corpus)
    except CorpusError as exc:
        raise DraftwiseError(str(exc)) from exc
    if len(cases) < args.limit + args.quality_cases:
        print(f"draftwise bench: only {len(cases)} usable cases found (asked for {args.limit} timed + "
              f"{args.quality_cases} quality cases)", file=sys.stderr)
    cases, quality_cases = cases[:args.limit], cases[args.limit:]
    if args.list_cases:
        _print_cases(cases)
        return 0
    quality_reference = None
    if getattr(args, "quality_reference", None):
        from bench.harness import read_quality_reference
        try:
            cases, quality_cases, quality_reference = read_quality_reference(
                args.quality_reference, args.target, max_tokens=getattr(args, "max_tokens", None) or 48,
                context_tokens=getattr(args, "context_tokens", EngineConfig.context_tokens))
        except (OSError, ValueError) as exc:
            raise DraftwiseError(f"--quality-reference: {exc}") from exc
        if quality_reference is None:
            print("draftwise bench: --quality-reference ran another model: its cases are scored again, its records "
                  "are not this model's fp32 (pool the runs with --quality-merge to compare the models)", file=sys.stderr)

    from tqdm import tqdm

    from bench import report
    from bench.harness import Bench, BenchSettings, build_report_data

    max_tokens = getattr(args, "max_tokens", None) or 48
    if max_tokens < 1:
        raise DraftwiseError("--max-tokens must be at least 1")
    draft = getattr(args, "draft", None)
    draft = None if draft in (None, "", "none") else draft
    config = EngineConfig(
        target=args.target, draft=draft,
        # keep the draft model loaded even where the cost model says it does not pay, so `model`
        # can be measured; `auto` requests still decide per step whether to use it
        drafter="model" if draft else "auto",
        max_tokens=max_tokens, device=getattr(args, "device", "auto"), dtype=getattr(args, "dtype", "auto"),
        draft_weights=getattr(args, "draft_weights", "auto"),
        context_tokens=getattr(args, "context_tokens", EngineConfig.context_tokens),
        suffix=getattr(args, "suffix", EngineConfig.suffix),
        trust_remote_code=getattr(args, "trust_remote_code", False),
    )
    typing_drafter = getattr(args, "drafter", None) or "auto"
    if typing_drafter == "none":
        typing_drafter = "auto"  # the typing simulation compares a drafter against "none" itself
    settings = BenchSettings(
        max_tokens=max_tokens, modes=modes, repeats=args.repeats, lookup_tokens=args.lookup_tokens or 10,
        typing_cases=args.typing_cases, keystrokes=args.keystrokes, typing_prompt_tokens=args.typing_prompt_tokens,
        typing_drafter=typing_drafter, cancel_tries=args.cancel_tries,
        llamacpp_threads=args.llamacpp_threads or None, seed=args.seed,
        llama_goal=(1.5 if draft else 1.3) if getattr(args, "llama_goal", None) is None else args.llama_goal,
        remote_targets=parse_remote_list(getattr(args, "remote", None)),
        llama_server=llama_server, llama_server_binary=getattr(args, "llama_server_binary", None),
        llama_server_quants=llama_server_quants,
    )
    load_before = _load_average()
    with tqdm(total=None, desc="loading models", file=sys.stderr, bar_format="{desc} {elapsed}") as bar:
        engines, reference, auto_reason = load_engines(config, formats, bar.set_description_str)
    engine = next(iter(engines.values()))
    if quality_reference is not None:  # its fp32 records pair with this run's only under the same prompt
        from bench.harness import suffix_lines_of

        shown = engine.info().get("suffix") or {}
        if suffix_lines_of(json.loads(Path(args.quality_reference).read_text()).get("config", {})) != bool(shown.get("lines")):
            quality_reference = None
            print(f"draftwise bench: --quality-reference showed the model another suffix than this run "
                  f"({shown.get('why')}): its cases are scored again, its records are not this run's fp32",
                  file=sys.stderr)
    bench = None
    try:
        bench = Bench(engines, cases, settings, target_spec=args.target, reference=reference,
                      quality_cases=quality_cases, quality_reference=quality_reference)
        planned = bench.plan_modes()
        with tqdm(total=bench.steps(len(planned)), desc="bench", unit="run", file=sys.stderr) as bar:
            def step(label: str) -> None:
                bar.set_postfix_str(label, refresh=False)
                bar.update(1)

            bench.progress = step
            bench.plan_modes = lambda: planned  # already decided (and the llama.cpp probe already run)
            bench.run()
        crossfile = _crossfile(args, engine) if args.crossfile else None
        corpus_context = _crossfile(args, engine, corpus=True) if args.corpus_context else None
    finally:
        if bench is not None:
            bench.close()  # servers it started, even when interrupted while planning
        for e in {id(e): e for e in [*engines.values(), reference]}.values():
            e.close()
    load_after = _load_average()
    serve_rss = None
    if args.serve_rss:
        from bench.serve_memory import serve_rss_mib

        print("measuring draftwise serve memory per format", file=sys.stderr)
        serve_rss = serve_rss_mib(args.target, sorted({"fp32", *engines}, key=["fp32", "bf16", "int8", "int4", "gguf"].index),
                                  draft=draft, draft_weights=getattr(args, "draft_weights", "auto"))
    info = engine.info()
    config_out = {
        "target": args.target, "draft": draft, "device": info.get("device"), "dtype": info.get("dtype"),
        "weights": list(engines),
        "auto_weights": next(iter(engines.values())).models.target.weights if "auto" in formats else None,
        # the format `auto` chose passed the exactness probe at every verify width: drafting cannot change its text
        "auto_exact": next(iter(engines.values())).models.target_runner.verify_exact if "auto" in formats else None,
        "auto_weights_reason": auto_reason or None, "weights_choice": info.get("weights_choice"),
        "draft_weights": info.get("draft_weights"), "kernel": info.get("kernel"),
        "serve_rss_mib": serve_rss, "serve_start": serve_start, "cold_start": cold,
        "quality_cases": len(quality_cases),
        "max_tokens": max_tokens, "context_tokens": config.context_tokens, "suffix": info.get("suffix"),
        "seed": args.seed, "limit": args.limit,
        "cases": len(cases), "languages": dict(Counter(c.language for c in cases)),
        "corpus": args.corpus or "installed code (stdlib, site-packages, C headers, npm globals)",
        "modes": list(planned), "repeats": args.repeats, "lookup_tokens": settings.lookup_tokens,
        "draft_note": info.get("draft_note"), "cost_model": info.get("cost_model"),
        "command": "draftwise " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        # what forces an instruction set: an emulated path's run is told apart by these
        "environment": {name: os.environ[name] for name in ("DRAFTWISE_ISA", "ATEN_CPU_CAPABILITY",
                                                           "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
                        if name in os.environ},
        # other work on the machine slows every mode, llama.cpp's busy-waiting threads most
        "load_average_1min": {"before": load_before, "after": load_after},
    }
    data = build_report_data(bench, list(ALL_MODES), config_out)
    if crossfile is not None:
        data["crossfile"] = crossfile
    if corpus_context is not None:
        data["corpus_context"] = corpus_context
    print(report.markdown(data))
    if args.json_path:
        report.write_json(data, args.json_path)
    if args.plot:
        report.plot(data, args.plot)
    return 0


def _crossfile(args, engine, corpus: bool = False) -> dict:
    """The cross-file cases (--cross-file N), or with corpus the ordinary corpus's cases in their
    packages (--corpus-context N), with and without the repository context."""
    from tqdm import tqdm

    from bench.crossfile import corpus_cases_in_workspaces, crossfile_cases, run_crossfile, run_plan

    contexts = [c.strip() for c in args.repo_context.split(",") if c.strip()]
    if not contexts or set(contexts) - {"off", "on"}:
        raise DraftwiseError(f"--repo-context takes off, on or off,on (got {args.repo_context!r})")
    try:
        build = corpus_cases_in_workspaces if corpus else crossfile_cases
        cases, indexes = build(args.corpus_context if corpus else args.crossfile, seed=args.seed,
                               languages=parse_languages(args.languages), corpus=args.corpus)
    except CorpusError as exc:
        raise DraftwiseError(str(exc)) from exc
    if not cases:
        raise DraftwiseError("no corpus case lies in a package" if corpus else
                             "no cross-file cases found: no package with a line that uses another file's name")
    # --modes none: the plain rows alone; the corpus cases: quality only
    lookup = not corpus and (not args.modes or "lookup" in parse_modes(args.modes))
    rows = len(run_plan("", contexts, lookup))
    with tqdm(total=len(cases) * rows, desc="corpus+context" if corpus else "cross-file", unit="run",
              file=sys.stderr) as bar:
        def step(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)
            bar.update(1)

        result = run_crossfile(engine, cases, indexes, getattr(args, "max_tokens", None) or 48, step, contexts, lookup)
    for index in indexes.values():
        index.close()
    return result


def _quality_merge(args) -> int:
    """`--quality-merge A.json,B.json`: earlier runs' scored records pooled into one gate table."""
    from bench import report
    from bench.harness import merge_quality_runs

    paths = [p.strip() for p in args.quality_merge.split(",") if p.strip()]
    try:
        data = merge_quality_runs(paths, getattr(args, "quality_versus", None))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DraftwiseError(f"--quality-merge: {exc}") from exc
    data["config"]["command"] = "draftwise " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    q = data["quality"]
    print(f"{q['cases']} cases ({', '.join(f'{lang} {n}' for lang, n in q['languages'].items())}) from "
          + "; ".join(f"{r['file']} ({r['records_added']} records)" for r in q["runs"]))
    print("\n".join(report.quality_markdown(q)))
    if args.json_path:
        report.write_json(data, args.json_path)
    return 0


def _serve_start(args, weights: str) -> dict | str:
    from bench.serve_memory import serve_start

    print("timing a draftwise serve start", file=sys.stderr)
    return serve_start(args.target, weights)


def _cold_start(args, weights: str) -> dict:
    from tqdm import tqdm

    from bench.cold_start import cold_cases, cold_start

    cases = cold_cases(args.cold_start, seed=args.seed)
    with tqdm(total=len(cases), desc="cold start", unit="file", file=sys.stderr) as bar:
        def step(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)
            bar.update(1)

        return cold_start(args.target, weights, cases, hint=args.cold_start_hint == "on", progress=step)


def _serve_start_only(args, measured: dict | str | None, cold: dict | None = None) -> int:
    from bench import report

    if measured is not None:
        print("draftwise serve start: " + (measured if isinstance(measured, str)
                                           else ", ".join(f"{k} {v}" for k, v in measured.items())))
    if cold is not None:
        print("\n".join(report.cold_start_markdown(cold)))
    if args.json_path:
        report.write_json({"config": {"target": args.target,
                                      "command": "draftwise " + " ".join(shlex.quote(a) for a in sys.argv[1:])},
                           "serve_start": measured, "cold_start": cold}, args.json_path)
    return 0


def _crossfile_only(args, weights: str) -> int:
    """`--limit 0 --cross-file N` / `--corpus-context N`: those cases alone, on one engine."""
    from decoding.api import EngineConfig
    from bench import report
    from decoding.engine import Engine

    config = EngineConfig(target=args.target, weights=weights, max_tokens=getattr(args, "max_tokens", None) or 48,
                          device=getattr(args, "device", "auto"),
                          context_tokens=getattr(args, "context_tokens", EngineConfig.context_tokens),
                          suffix=getattr(args, "suffix", EngineConfig.suffix))
    engine = Engine(config)
    engine.load()
    try:
        data = {"config": {"target": args.target, "weights": engine.models.target.weights, "seed": args.seed,
                           "context_tokens": config.context_tokens, "max_tokens": config.max_tokens,
                           "suffix": engine.info().get("suffix"),
                           "exact": engine.models.target_runner.verify_exact,
                           "command": "draftwise " + " ".join(shlex.quote(a) for a in sys.argv[1:])},
                **({"crossfile": _crossfile(args, engine)} if args.crossfile else {}),
                **({"corpus_context": _crossfile(args, engine, corpus=True)} if args.corpus_context else {})}
    finally:
        engine.close()
    for key in ("crossfile", "corpus_context"):
        if key in data:
            print(report.crossfile_markdown(data[key], corpus=key == "corpus_context"))
    if args.json_path:
        report.write_json(data, args.json_path)  # without the cases' files on this machine
    return 0
