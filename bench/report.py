"""The benchmark's outputs: a Markdown report, a JSON file and a PNG plot."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

MODE_LABELS = {
    "hf-plain": "transformers generate (plain)",
    "hf-assisted": "transformers assisted (draft model)",
    "hf-lookup": "transformers prompt lookup",
    "none": "draftwise none",
    "lookup": "draftwise lookup",
    "model": "draftwise model",
    "auto": "draftwise auto",
    # weight-format rows are `mode@format`: labelled from their mode (see label())
    "llamacpp-plain": "llama.cpp (plain)",
    "llamacpp-lookup": "llama.cpp prompt lookup",
}
REQUIRED_MODE_KEYS = ("decode_tok_s", "speedup_vs_plain", "identical_rate", "acceptance_rate",
                      "tokens_per_forward", "p50_ms", "p95_ms", "min_case_speedup")


def label(key: str) -> str:
    mode, _, fmt = key.partition("@")
    return MODE_LABELS.get(mode, mode) + (f" {fmt}" if fmt else "")


def _fmt(x, spec: str = ".2f", suffix: str = "") -> str:
    if x is None:
        return "–"
    return f"{x:{spec}}{suffix}"


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def quality_markdown(q: dict) -> list[str]:
    """The quality table's lines: per format (or model@format) against the removed code and, paired,
    against fp32 (with the gate's verdict) or the row the models are compared with."""
    versus = q.get("versus", "fp32")
    gate = versus == "fp32"
    models = any("@" in row for row in q["formats"])  # rows MODEL@FORMAT: several models compared
    lines = [f"Completion quality against the removed code ({q['method']})"
             + (f"; a format may be chosen by `auto` unless the 95% interval of its paired difference from fp32 "
                f"lies below -{q['max_drop_points']:g} points:" if gate else ":"), "",
             f"| {'model@weights' if models else 'weights'} | cases | first line exact | similarity | minus {versus} "
             f"(points) | 95% interval | only this right / only {versus} right | McNemar p |" + (" gate |" if gate else ""),
             "|---|---:|---:|---:|---:|---|---:|---:|" + (":---:|" if gate else "")]
    for fmt, v in q["formats"].items():
        paired = v.get("versus_fp32" if gate else "versus") or {}
        interval = f"[{paired['ci95'][0]:+.1f}, {paired['ci95'][1]:+.1f}]" if paired else "–"
        discordant = f"{paired['only_this_right']} / {paired['only_reference_right']}" if paired else "–"
        line = (f"| {fmt} | {v['quality_cases']} | {_fmt(v['first_line_exact'], '.1f', '%')} | "
                f"{_fmt(v['similarity'], '.3f')} | {_fmt(paired.get('difference_points'), '+.1f')} | "
                f"{interval} | {discordant} | {_fmt(paired.get('mcnemar_p'), '.3f')} |")
        if gate:
            line += " " + ("–" if "passes_gate" not in v else ("pass" if v["passes_gate"] else "**fail**")) + " |"
        lines.append(line)
    return lines + _quality_by(q, "by_kind", "cursor kind", versus) + _quality_by(q, "by_language", "language", versus)


def _quality_by(q: dict, key: str, what: str, versus: str) -> list[str]:
    """First line exact per cursor kind (with the paired difference from the `versus` row on that kind's
    cases) or per language, one row per format or model."""
    groups = list(dict.fromkeys(g for v in q["formats"].values() for g in v.get(key, {})))
    if not groups:
        return []
    lines = ["", f"First line exact by {what}" + (f" (points against {versus}, 95% interval)" if key == "by_kind" else "")
             + ":", "", "| row | " + " | ".join(groups) + " |", "|---|" + "---:|" * len(groups)]
    for row, v in q["formats"].items():
        cells = []
        for g in groups:
            part = v.get(key, {}).get(g)
            if not part:
                cells.append("–")
                continue
            cell = f"{_fmt(part['first_line_exact'], '.1f', '%')} of {part['quality_cases']}"
            paired = part.get("versus")
            if paired:
                cell += f", {paired['difference_points']:+.1f} [{paired['ci95'][0]:+.1f}, {paired['ci95'][1]:+.1f}]"
            cells.append(cell)
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return lines


def runs_on(data: Mapping, key: str) -> str:
    """What computed a row: the kernel the engine's rows ran (Engine.info()'s), or the GGUF format
    llama-server read, requantized or as shipped; empty where the run does not say."""
    s = data.get("modes", {}).get(key, {})
    if s.get("kernel"):
        return s["kernel"]
    f = ((data.get("config", {}).get("llama_server") or {}).get("formats") or {}).get(key)
    if not f:
        return ""
    return f"{f.get('type') or '?'} GGUF" + (f", requantized from {f.get('from')}" if f.get("requantized") else "")


def prompt_reading_markdown(data: Mapping) -> list[str]:
    """Prompt reading per row and the engine's fastest row over llama.cpp's (its plain server row, or
    the fastest at reading of the formats it ran on)."""
    pr = data.get("prompt_reading")
    if not pr:
        return []
    peer = pr.get("peer")
    lines = ["Prompt reading, cold: prompt tokens read per second of prefill (median case; each row counts what "
             "it read in its prefill: the engine its prompt less the tail its first verify forward reads, "
             "llama-server the prompt_n of the prompt its /infill built):", "",
             "| row | runs on | prompt tokens read (median) | prefill ms (median) | prompt reading tok/s | "
             f"over {peer or 'llama-server@plain'} |", "|---|---|---:|---:|---:|---:|"]
    for key, row in pr["rows"].items():
        lines.append(f"| {key} | {runs_on(data, key) or '–'} | {_fmt(row.get('prompt_read_tokens_median'), ',.0f')} | "
                     f"{_fmt(row.get('prefill_ms'), ',.0f')} | {_fmt(row['prompt_read_tok_s'], ',.1f')} | "
                     f"{_fmt(row.get('over_peer'), '.2f', '×')} |")
    engine = pr.get("engine_best")
    if engine and peer:
        of = pr.get("peer_of") or [peer]
        lines += ["", f"`{engine}` reads prompts at **{_fmt(pr['engine_over_peer'], '.2f', '×')}** the speed of "
                      f"`{peer}` ({runs_on(data, peer) or 'its GGUF'}"
                      + (f"; llama.cpp's fastest reader here of {', '.join(of)})." if len(of) > 1 else ").")]
    return lines


def peers_markdown(data: Mapping) -> list[str]:
    """Which of llama-server's plain rows (one per GGUF format, --llama-server-quants) won, for decoding
    and for prompt reading: the rows the engine's ratios are over."""
    from bench.metrics import llama_server_peer, llama_server_plain_rows

    modes = data.get("modes", {})
    plains = llama_server_plain_rows(modes)
    if len(plains) < 2:
        return []
    decode, reading = llama_server_peer(modes), llama_server_peer(modes, "prompt_read_tok_s")
    won = [f"{what} `{key}` ({runs_on(data, key) or '?'})" for what, key in
           (("decoding", decode), ("prompt reading", reading)) if key]
    return ["", f"llama.cpp's fastest plain row on this CPU, of {', '.join(plains)}: " + "; ".join(won)
            + ". A requantized file is made from the shipped one, not from 16-bit weights: its speed is its "
              "format's, its text may differ from that format's own."]


def cold_start_markdown(cold: Mapping) -> list[str]:
    """The first suggestion in a just-opened file, per pause between opening and asking."""
    lines = [f"First suggestion in a just-opened file (`{cold['target']}`, {cold.get('weights')} weights; the editor "
             + ("says where its cursor rests" if cold.get("cursor_hint") else "sends no cursor hint") + "):", "",
             "| pause before asking | files | p50 | p95 | prompt tokens (median) | read ahead (median) | "
             "answered by idle work | prompt reading's share (median; where idle work answered, of open to answer) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for pause, v in cold["pauses"].items():
        lines.append(f"| {pause} | {v['runs']} | {_fmt(v['p50_ms'], '.0f', ' ms')} | {_fmt(v['p95_ms'], '.0f', ' ms')} | "
                     f"{_fmt(v['prompt_tokens_median'], '.0f')} | {_fmt(v['read_ahead_median'], '.0f')} | "
                     f"{v.get('answered_by_idle_work', 0)} | {_pct(v['prompt_reading_share'])} |")
    return lines


def markdown(data: Mapping) -> str:
    cfg = data["config"]
    m = cfg.get("machine", {})
    lines = [
        f"## draftwise bench — {cfg.get('date', '')}",
        "",
        f"- machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, {m.get('memory_gib', '?')} GiB; "
        f"torch {m.get('torch', '?')}, transformers {m.get('transformers', '?')}"
        + (f", llama-cpp-python {m['llama_cpp_python']}" if m.get("llama_cpp_python") else ""),
        f"- target `{cfg.get('target')}`" + (f", draft `{cfg['draft']}`" if cfg.get("draft") else ", no draft model")
        + f", {cfg.get('device', '?')} {cfg.get('dtype', '?')}, greedy, up to {cfg.get('max_tokens')} new tokens",
        f"- {cfg.get('cases')} cases ({', '.join(f'{k} {v}' for k, v in cfg.get('languages', {}).items())}), "
        f"seed {cfg.get('seed')}, corpus: {cfg.get('corpus')}",
        f"- command: `{cfg.get('command', '')}`"
        + (f" (1-minute load average {load['before']} before, {load['after']} after; {m.get('cores', '?')} cores)"
           if (load := cfg.get("load_average_1min")) else ""),
        "",
        "| mode | decode tok/s | speedup vs hf-plain (median) | slowest case | vs own plain | first token ms | "
        "p50 ms | p95 ms | acceptance | tokens/forward | identical to own plain | first line exact | similarity |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, s in data["modes"].items():
        own = "" if s.get("family_plain") in (mode, None) else _fmt(s.get("speedup_vs_family_plain"), ".2f", "×")
        lines.append(
            f"| {mode} | {_fmt(s['decode_tok_s'], '.1f')} | {_fmt(s['speedup_vs_plain'], '.2f', '×')} | "
            f"{_fmt(s['min_case_speedup'], '.2f', '×')} | {own} | {_fmt(s.get('ttft_ms'), '.0f')} | "
            f"{_fmt(s['p50_ms'], '.0f')} | {_fmt(s['p95_ms'], '.0f')} | {_pct(s['acceptance_rate'])} | "
            f"{_fmt(s['tokens_per_forward'], '.2f')} | {_pct(s.get('identical_rate_vs_family_plain'))} | "
            f"{_fmt(s.get('first_line_exact'), '.0f', '%')} | {_fmt(s.get('similarity'), '.2f')} |"
        )
    kernels = cfg.get("kernels") or {}
    if any(kernels.values()):
        lines += ["", "The engine's rows ran on: " + ", ".join(f"{fmt} `{k}`" for fmt, k in kernels.items() if k) + "."]
    lines += peers_markdown(data)
    reading = prompt_reading_markdown(data)
    if reading:
        lines += [""] + reading
    if data.get("quality"):
        lines += [""] + quality_markdown(data["quality"])
    if data.get("config", {}).get("cold_start"):
        lines += [""] + cold_start_markdown(data["config"]["cold_start"])
    cfg_w = cfg.get("auto_weights")
    if cfg_w:
        lines += ["", f"`--weights auto` chose **{cfg_w}**: {cfg.get('auto_weights_reason')}"]
    rss = cfg.get("serve_rss_mib")
    if rss:
        lines += ["", "Resident memory of `draftwise serve` after one completion: "
                  + ", ".join(f"{f} {v:.0f} MiB" if isinstance(v, (int, float)) else f"{f}: {v}" for f, v in rss.items())]
    if data.get("skipped_modes"):
        lines.append("")
        for mode, why in data["skipped_modes"].items():
            lines.append(f"- skipped `{mode}`: {why}")
    errors = {mode: s["errors"] for mode, s in data["modes"].items() if s.get("errors")}
    if errors:
        lines.append("- runs that failed: " + ", ".join(f"{k} {v}" for k, v in errors.items()) + " (see the JSON)")
    by_lang = {mode: s.get("speedup_by_language", {}) for mode, s in data["modes"].items() if mode != "hf-plain"}
    langs = sorted({lang for v in by_lang.values() for lang in v})
    if langs:
        lines += ["", "Median decode speedup vs hf-plain, per language:", "",
                  "| mode | " + " | ".join(langs) + " |", "|---|" + "---:|" * len(langs)]
        for mode, v in by_lang.items():
            lines.append(f"| {mode} | " + " | ".join(_fmt(v.get(lang), ".2f", "×") for lang in langs) + " |")
    t = data.get("typing")
    if t and t.get("cold_ms") is not None:
        kv = t.get("kv_reuse_only", {})
        lines += ["", f"Typing simulation ({t.get('keystrokes')} keystrokes into each suggestion, prompts of "
                      f"{', '.join(str(p) for p in t.get('prompt_tokens', []))} tokens, drafter {t.get('drafter')}): "
                      f"cold {_fmt(t['cold_ms'], '.0f')} ms, warm {_fmt(t['warm_ms'], '.0f')} ms, "
                      f"warm/cold {_fmt(t['warm_over_cold'], '.3f')}; with KV reuse only (drafter none): cold "
                      f"{_fmt(kv.get('cold_ms'), '.0f')} ms, warm {_fmt(kv.get('warm_ms'), '.0f')} ms, warm/cold "
                      f"{_fmt(kv.get('warm_over_cold'), '.3f')}; warm suggestion continues the shown one: "
                      f"{_pct(t.get('warm_continues_suggestion_rate'))}."]
    elif t and t.get("note"):
        lines += ["", f"Typing simulation: {t['note']}."]
    c = data.get("cancel")
    if c:
        lines += ["", f"Cancel ({c.get('cancelled_tries')} requests cancelled mid-run): target forwards after "
                      f"cancel p95 {_fmt(c.get('forwards_after_cancel_p95'), '.1f')} (max "
                      f"{c.get('forwards_after_cancel_max')}), cancel-to-result p50 {_fmt(c.get('cancel_to_result_ms_p50'), '.0f')} ms, "
                      f"p95 {_fmt(c.get('cancel_to_result_ms_p95'), '.0f')} ms (one target forward is "
                      f"{_fmt(c.get('per_forward_ms'), '.0f')} ms)."]
    d = data.get("draft_model")
    if d:
        lines += ["", f"Draft model: `model` decodes at {_fmt(d['model_speedup_vs_none'], '.2f', '×')} the speed of "
                      f"plain decoding in the same engine — it {'pays' if d['draft_model_pays'] else 'does not pay'} "
                      f"here; `auto` drafted {_pct(d['auto_drafted_by_model_share'])} of its draft tokens with it "
                      f"(auto: {_fmt(d['auto_speedup_vs_none'], '.2f', '×')} plain)."]
    goals = data.get("goals") or []
    if goals:
        lines += ["", "| goal | measured | target | met |", "|---|---:|---:|:---:|"]
        for g in goals:
            met = "–" if g["met"] is None else ("yes" if g["met"] else "**no**")
            lines.append(f"| {g['goal']} | {g['value']} | {g['target']} | {met} |")
    lines += ["", f"Timing: {cfg.get('timing_method', '')}"]
    if data.get("crossfile"):
        lines += ["", crossfile_markdown(data["crossfile"])]
    if data.get("corpus_context"):
        lines += ["", crossfile_markdown(data["corpus_context"], corpus=True)]
    return "\n".join(lines) + "\n"


def crossfile_markdown(crossfile: Mapping, corpus: bool = False) -> str:
    """The cross-file table (bench/crossfile.py): each row a cold run per case. corpus: the
    ordinary corpus's cases in their packages (--corpus-context)."""
    summary = crossfile["summary"]
    cases = crossfile["cases"]
    shown = sum(bool(c.get("shown")) for c in cases)
    title = (f"### Corpus cases in their packages: {len(cases)}" if corpus else
             f"### Cross-file cases: {len(cases)} (the name's definition shown in {shown})")
    lines = [title, "",
             "| run | first line exact | similarity (median) | prompt tokens (median) | p50 ms | acceptance | "
             "tokens/forward | repository drafts |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for mode in crossfile.get("rows", [k for k in summary if "@" in k]):
        s = summary.get(mode)
        if s:
            lines.append(f"| {mode} | {_pct(s['first_line_exact'])} | {_fmt(s['similarity_median'])} | "
                         f"{_fmt(s['prompt_tokens_median'], '.0f')} | {_fmt(s['total_ms_median'], '.0f')} | "
                         f"{_pct(s['acceptance'])} | {_fmt(s['tokens_per_forward'])} | {s['repo_drafted']} |")
    if "paired" in summary:
        p = summary["paired"]
        diff = p.get("difference")
        gain = (f" (first line exact {diff['difference_points']:+.1f} points, 95% interval "
                f"[{diff['ci95'][0]}, {diff['ci95'][1]}], McNemar p {diff['mcnemar_p']})") if diff else ""
        lines += ["", f"Paired over {p['cases']} cases: the repository context made {p['repo_right_plain_wrong']} "
                      f"first lines right and {p['plain_right_repo_wrong']} wrong{gain}."
                      + (f" Every lookup row wrote its plain row's text: {summary['lookup_identical_text']}."
                         if any(row.startswith("lookup@") for row in summary) else "")]
    return "\n".join(lines) + "\n"


def write_json(data: Mapping, path: str | Path) -> None:
    """The run as JSON. A case's file on disk (`source`) stays out: it names this machine's
    directories; the case's package path, line and the run's seed say which code it was."""
    def public(value):
        if isinstance(value, Mapping):
            return {k: public(v) for k, v in value.items() if k != "source"}
        if isinstance(value, list):
            return [public(v) for v in value]
        return value

    Path(path).write_text(json.dumps(public(data), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def plot(data: Mapping, path: str | Path) -> None:
    """Grouped bars: median decode speedup vs hf-plain, per mode, per language and overall."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt

    modes = [m for m in data["modes"] if m != "hf-plain"]
    langs = sorted({lang for m in modes for lang in data["modes"][m].get("speedup_by_language", {})})
    groups = langs + ["all"]
    width = 0.8 / max(1, len(modes))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups) + 2), 4.5))
    for i, mode in enumerate(modes):
        s = data["modes"][mode]
        vals = [s.get("speedup_by_language", {}).get(g) for g in langs] + [s.get("speedup_vs_plain")]
        xs = [j + (i - (len(modes) - 1) / 2) * width for j in range(len(groups))]
        ax.bar(xs, [v or 0 for v in vals], width, label=label(mode), color=plt.cm.tab20(i % 20))
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups)
    ax.set_ylabel("decode speedup vs transformers generate (median)")
    cfg = data["config"]
    ax.set_title(f"{Path(str(cfg.get('target'))).name} on {cfg.get('machine', {}).get('cores', '?')} CPU cores, "
                 f"{cfg.get('cases')} cases, {cfg.get('date', '')}", fontsize=9)
    ax.legend(fontsize=7, ncol=1, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, never on them
    fig.tight_layout()
    fig.savefig(str(path), dpi=120)
    plt.close(fig)
