"""The `draftwise` command: serve, complete, bench, replay, models."""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # keep library chatter off the user's terminal

from decoding.api import DRAFTERS, SCOPES, SUFFIXES, WEIGHT_FORMATS, EngineConfig  # noqa: E402  (light: no torch)
from decoding.errors import DraftwiseError  # noqa: E402

log = logging.getLogger("draftwise")


def add_model_flags(p: argparse.ArgumentParser, many_weights: bool = False) -> None:
    """many_weights: `--weights` takes a comma-separated list (the benchmark runs each format)."""
    d = EngineConfig()
    g = p.add_argument_group("model")
    g.add_argument("--target", default=d.target, help="target model: preset, HF directory, .gguf file or hub id; auto: "
                   "qwen2.5-coder-1.5b where this machine runs it fast enough, else qwen2.5-coder-0.5b (default: %(default)s)")
    g.add_argument("--draft", default=None, help="draft model spec, or 'none' (default: none)")
    g.add_argument("--drafter", default=d.drafter, choices=DRAFTERS, help="drafting strategy (default: %(default)s)")
    g.add_argument("--max-tokens", type=int, default=d.max_tokens, help="most tokens per completion (default: %(default)s)")
    g.add_argument("--device", default=d.device, help="auto | cpu | cuda | cuda:N | mps (default: %(default)s)")
    g.add_argument("--dtype", default=d.dtype, help="auto | float32 | bfloat16 | float16: the compute dtype when "
                   "--weights is auto and no format is measured (e.g. float16 on Apple MPS)")
    if many_weights:
        g.add_argument("--weights", dest="weights_arg", default="auto", metavar="LIST",
                       help=f"comma-separated target weight formats to run every engine mode at ({', '.join(WEIGHT_FORMATS)}); "
                            "auto: the one `auto` picks here (default: %(default)s)")
    else:
        g.add_argument("--weights", default=d.weights, choices=WEIGHT_FORMATS,
                       help="target weight format; auto: the fastest on this device whose quality passes the "
                            "gate (bf16 on CUDA, measured on a CPU) (default: %(default)s)")
    g.add_argument("--draft-weights", default=d.draft_weights, choices=WEIGHT_FORMATS,
                   help="draft model weight format; auto: the fastest (default: %(default)s)")
    g.add_argument("--context-tokens", type=int, default=d.context_tokens, help="prompt token budget (default: %(default)s)")
    g.add_argument("--suffix", default=d.suffix, choices=SUFFIXES,
                   help="what the prompt shows after the cursor: the rest of its line, or the lines after it too; "
                        "auto: the lines where the quality gate measured that they pay for the model (default: %(default)s)")
    g.add_argument("--trust-remote-code", action="store_true", help="allow model repositories to run their own code (off by default)")
    # the compiled forward was removed; an editor's server command that still passes the flag starts
    g.add_argument("--compile", choices=("on", "off", "auto"), help=argparse.SUPPRESS)


def engine_config(args) -> EngineConfig:
    if args.max_tokens < 1:
        raise DraftwiseError("--max-tokens must be at least 1")
    if getattr(args, "compile", None):
        print("draftwise: --compile is ignored: the compiled forward was removed (the eager one is as fast)",
              file=sys.stderr)
    return EngineConfig(target=args.target, draft=None if args.draft in (None, "none") else args.draft,
                        drafter=args.drafter, max_tokens=args.max_tokens, device=args.device, dtype=args.dtype,
                        weights=args.weights, draft_weights=args.draft_weights,
                        context_tokens=args.context_tokens, suffix=args.suffix,
                        trust_remote_code=args.trust_remote_code)


# The measurement commands live in the top-level `bench` package, outside the product: they are
# reached by name, and imported only when one of them is the command being run.
MEASUREMENT_COMMANDS = {"bench": "bench.cli", "replay": "bench.replay.cli"}


def measurement_module(command: str):
    try:
        return importlib.import_module(MEASUREMENT_COMMANDS[command])
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] in ("bench", "decoding", "lsp_server"):
            raise  # our own code is broken, not an extra missing
        raise DraftwiseError(f"`draftwise {command}` needs extra packages: {exc} (pip install 'draftwise[bench]')") from exc


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """command: the subcommand being run; only its own arguments are loaded (see MEASUREMENT_COMMANDS)."""
    p = argparse.ArgumentParser(prog="draftwise", description="Local inline code completions, made fast with speculative decoding.")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the language server (stdio by default)")
    add_model_flags(s)
    s.add_argument("--tcp", metavar="HOST:PORT", help="listen on TCP instead of stdio (HOST defaults to 127.0.0.1)")
    s.add_argument("--allow-remote", action="store_true", help="allow --tcp on a non-loopback address")
    s.add_argument("--log-file", help="write logs here instead of stderr")
    s.add_argument("--stdio", action="store_true", help="serve over stdio (the default; accepted because LSP clients pass it)")

    c = sub.add_parser("complete", help="complete one position in a file and print the suggestion")
    add_model_flags(c)
    c.add_argument("file")
    c.add_argument("--line", type=int, required=True, help="0-based line (as in LSP)")
    c.add_argument("--character", type=int, required=True, help="0-based column in characters (as in LSP)")
    c.add_argument("--scope", default="auto", choices=SCOPES, help="how much to complete (default: decided from the cursor)")
    c.add_argument("--temperature", type=float, default=0.0)
    c.add_argument("--json", action="store_true", help='print {"text": the engine\'s text, "suggestion": {"text", "replace"} as an editor '
                   'inserts it (null: nothing to show), "stats": {...}} and nothing else')

    b = sub.add_parser("bench", help="benchmark speculative modes against plain decoding and the HF built-ins")
    add_model_flags(b, many_weights=True)
    r = sub.add_parser("replay", help="type real files back through the server and measure time to suggestion")
    add_model_flags(r)
    if command in MEASUREMENT_COMMANDS:
        measurement_module(command).add_arguments({"bench": b, "replay": r}[command])

    m = sub.add_parser("models", help="the offline model pack")
    msub = m.add_subparsers(dest="models_command", required=True)
    pull = msub.add_parser("pull", help="fetch, verify and convert presets (default: all)")
    pull.add_argument("names", nargs="*")
    msub.add_parser("list", help="show presets, whether they are present, size and path")
    clean = msub.add_parser("clean", help="remove what starts keep in $DRAFTWISE_HOME (quantized models, kernels, "
                            "measurements); the models stay")
    clean.add_argument("--dry-run", action="store_true", help="only show what would be removed and its size")
    return p


def setup_logging(debug: bool, log_file: str | None = None, level: int = logging.WARNING) -> None:
    handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else level)


def position_to_offset(text: str, line: int, character: int, path: str) -> int:
    """Offset of a 0-based line and code-point column, with LSP's line breaks; an error outside the file."""
    from lsprotocol import types

    from lsp_server.documents import UTF32, OpenDocument

    doc = OpenDocument(uri=path, language_id="", version=0, text=text)
    if line < 0 or line >= doc.line_count:
        raise DraftwiseError(f"{path}: line {line} is outside the file (it has lines 0..{doc.line_count - 1})")
    length = len(doc.line(line))
    if character < 0 or character > length:
        raise DraftwiseError(f"{path}: character {character} is outside line {line} (length {length})")
    return doc.offset_at(types.Position(line=line, character=character), UTF32)


def editor_edit(text: str, offset: int, completion: str):
    """The edit an editor gets for the engine's text at `offset`, shaped as the server shapes it (one
    line before text right of the cursor, the file's indentation, auto-closed brackets covered):
    `draftwise complete` prints what the editor would insert."""
    from lsp_server.cursor import cursor_line
    from lsp_server.postprocess import detect_indent, shape

    line_before, line_after = cursor_line(text[:offset], text[offset:])
    return shape(completion, line_before, line_after, detect_indent(text))


def cmd_complete(args) -> int:
    from decoding.api import CompletionRequest
    from decoding.engine import Engine
    from decoding.languages import language_from_path

    path = Path(args.file)
    if not path.is_file():
        raise DraftwiseError(f"file not found: {path}")
    try:
        # As an editor sends it: line breaks untouched (read_text would turn CRLF into LF), no BOM.
        text = path.read_bytes().decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise DraftwiseError(f"{path} is not UTF-8 text") from exc
    offset = position_to_offset(text, args.line, args.character, str(path))
    engine = Engine(engine_config(args))
    try:
        engine.load()
        result = engine.complete(CompletionRequest(
            prefix=text[:offset], suffix=text[offset:], path=path.name, document=str(path.resolve()),
            language=language_from_path(str(path)), scope=args.scope, temperature=args.temperature))
        weights = engine.info()["weights"]
    finally:
        engine.close()
    edit = editor_edit(text, offset, result.text)
    if args.json:
        suggestion = None if edit is None else {"text": edit.text, "replace": edit.replace}
        print(json.dumps({**result.to_dict(), "suggestion": suggestion}))
    else:
        s = result.stats
        print("" if edit is None else edit.text)
        print(f"[{s.generated_tokens} tokens in {s.target_forwards} target forwards "
              f"({s.tokens_per_forward:.2f}/forward), drafter {s.drafter}, accepted {s.accepted_tokens}/{s.drafted_tokens} "
              f"drafted, prefill {s.prefill_ms:.0f} ms, decode {s.decode_ms:.0f} ms, stopped: {s.stopped}; "
              f"weights {weights}]", file=sys.stderr)
    # The answer is out. Tearing down the model's tensors and the engine's thread took ~0.9 s of a
    # 5 s run: end the process now (this command runs in its own process, never inside another).
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(0)


def cmd_models(args) -> int:
    from decoding.models import pack
    from decoding.models.specs import PRESETS

    if args.models_command == "list":
        for st in pack.status():
            state = "present" if st.present else "missing"
            size = f"{st.size_bytes / 2**30:.2f} GiB" if st.present else "-"
            print(f"{st.preset.name:22} {state:8} {size:>10}  {st.path}")
        return 0
    if args.models_command == "clean":
        return clean_caches(args.dry_run)
    names = args.names or list(PRESETS)
    unknown = [n for n in names if n not in PRESETS]
    if unknown:
        raise DraftwiseError(f"unknown preset {', '.join(unknown)}; presets: {', '.join(PRESETS)}")
    for name in names:
        pack.pull(PRESETS[name], say=lambda msg: print(msg, file=sys.stderr))
    from decoding.models.weights import build_kernels

    build_kernels(say=lambda msg: print(msg, file=sys.stderr))
    return 0


def clean_caches(dry_run: bool) -> int:
    from decoding.home import cache_files, paths

    found = cache_files.caches() if dry_run else cache_files.clean()
    for path, size, what in found:
        print(f"{size / 2**20:10.1f} MiB  {path}  {what}")
    total = sum(size for _, size, _ in found) / 2**20
    verb = "would free" if dry_run else "freed"
    print(f"{verb} {total:.1f} MiB in {paths.draftwise_home()}; the models stay (`draftwise models list`)")
    return 0


def cmd_serve(args) -> int:
    from lsp_server.server import run

    tcp = None
    if args.tcp:
        host, _, port = args.tcp.rpartition(":")
        host = host or "127.0.0.1"
        if not port.isdigit():
            raise DraftwiseError(f"--tcp wants HOST:PORT, got '{args.tcp}'")
        tcp = (host, int(port))
    code = run(engine_config(args), tcp=tcp, allow_remote=args.allow_remote)
    # The engine's worker thread can still be inside a torch kernel (a client that disconnected
    # mid-generation). Interpreter finalization would then run C++ destructors under it and abort
    # the process; the session is over, so leave without finalization.
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def cmd_measure(args) -> int:
    return measurement_module(args.command).run(args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser(next((a for a in argv if not a.startswith("-")), None)).parse_args(argv)
    except DraftwiseError as exc:  # a measurement command without its extra packages
        print(f"draftwise: error: {exc}", file=sys.stderr)
        return 2
    if args.command == "serve":
        setup_logging(args.debug, args.log_file, logging.INFO)
    else:
        setup_logging(args.debug)
    handlers = {"serve": cmd_serve, "complete": cmd_complete, "bench": cmd_measure, "replay": cmd_measure,
                "models": cmd_models}
    try:
        return handlers[args.command](args)
    except DraftwiseError as exc:
        if args.debug:
            raise
        print(f"draftwise: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - one line for users; --debug shows the traceback
        if args.debug:
            raise
        print(f"draftwise: error: {type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
