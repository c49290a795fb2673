"""Case sampling: deterministic for a seed, cursors where the kind says, text split losslessly."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from bench import cli as bench_cli, report
from bench.corpus import (
    CURSOR_KINDS, MIN_PREFIX_CHARS, CorpusError, language_of, list_files, parse_languages, sample_cases,
)
from decoding.errors import DraftwiseError


def _python_module(n: int) -> str:
    parts = [f'"""Module {n}: helpers for the inventory service."""\nimport os\nimport sys\n\n']
    for i in range(14):
        parts.append(
            f"class Record{i}:\n"
            f"    def __init__(self, name, quantity):\n"
            f"        self.name = name\n"
            f"        self.quantity = quantity\n\n"
            f"    def restock(self, amount):\n"
            f"        if amount <= 0:\n"
            f"            raise ValueError('amount must be positive')\n"
            f"        self.quantity += amount\n"
            f"        return self.quantity\n\n"
        )
    return "".join(parts)


def _js_module(n: int) -> str:
    parts = [f"// Module {n}\n'use strict'\n\n"]
    for i in range(16):
        parts.append(
            f"function updateTotals{i}(items, options) {{\n"
            f"  const result = items.map((item) => item.price * item.count)\n"
            f"  if (options.verbose) {{\n"
            f"    console.log(result.length)\n"
            f"  }}\n"
            f"  return result.reduce((a, b) => a + b, 0)\n"
            f"}}\n\n"
        )
    return "".join(parts)


def _c_header(n: int) -> str:
    parts = [f"/* header {n} */\n#ifndef H{n}\n#define H{n}\n\n"]
    for i in range(18):
        parts.append(
            f"static int compute_total{i}(const int *values, int count) {{\n"
            f"    int total = 0;\n"
            f"    for (int i = 0; i < count; i++) {{\n"
            f"        total += values[i];\n"
            f"    }}\n"
            f"    return total;\n"
            f"}}\n\n"
        )
    return "".join(parts) + "#endif\n"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "web").mkdir()
    (tmp_path / "include").mkdir()
    (tmp_path / "node_modules" / "dep").mkdir(parents=True)  # a dependency, not the repo's code
    for n in range(3):
        (tmp_path / "pkg" / f"mod{n}.py").write_text(_python_module(n))
        (tmp_path / "web" / f"app{n}.js").write_text(_js_module(n))
        (tmp_path / "include" / f"calc{n}.h").write_text(_c_header(n))
    (tmp_path / "node_modules" / "dep" / "index.js").write_text(_js_module(99))
    (tmp_path / "pkg" / "tiny.py").write_text("x = 1\n")  # too small to be a case
    return tmp_path


def _file_text(case) -> str:
    return Path(case.source).read_text()


def test_same_seed_gives_the_same_cases(repo):
    a = sample_cases(9, seed=3, corpus=repo)
    b = sample_cases(9, seed=3, corpus=repo)
    assert [c.to_dict(with_text=True) for c in a] == [c.to_dict(with_text=True) for c in b]


def test_another_seed_gives_other_cases(repo):
    a = sample_cases(9, seed=3, corpus=repo)
    b = sample_cases(9, seed=4, corpus=repo)
    assert [c.id for c in a] != [c.id for c in b]


def test_cases_spread_over_languages_and_kinds(repo):
    cases = sample_cases(12, seed=0, corpus=repo)
    assert len(cases) == 12
    langs = [c.language for c in cases]
    assert {langs.count(x) for x in ("python", "javascript", "c")} == {4}
    assert {c.kind for c in cases} == set(CURSOR_KINDS)
    assert len({c.id for c in cases}) == 12
    assert not any("node_modules" in c.source for c in cases)
    assert not any(c.path.endswith("tiny.py") for c in cases)


def test_prefix_removed_text_and_suffix_are_a_contiguous_slice_of_the_file(repo):
    for case in sample_cases(12, seed=1, corpus=repo):
        text = _file_text(case)
        whole = case.prefix + case.expected + case.suffix
        assert whole in text
        assert case.expected.strip()
        cursor = text.index(whole) + len(case.prefix)
        assert cursor >= MIN_PREFIX_CHARS
        assert text[:cursor].count("\n") + 1 == case.line


def test_cursor_positions_match_their_kind(repo):
    cases = sample_cases(24, seed=2, corpus=repo)
    for c in cases:
        before = c.prefix
        if c.kind == "line_start":
            line = before.rsplit("\n", 1)[-1]
            assert line and not line.strip(), c.id  # only indentation typed on this line
        elif c.kind == "after_opener":
            assert before[-1] in "([{:", c.id
        elif c.kind == "mid_identifier":
            assert re.search(r"[A-Za-z_][A-Za-z0-9_]+$", before), c.id
            assert re.match(r"[A-Za-z0-9_]", c.expected), c.id
        elif c.kind == "end_of_line":
            assert c.expected.startswith("\n"), c.id
            assert before.rsplit("\n", 1)[-1].strip(), c.id


def test_languages_filter_and_aliases(repo):
    cases = sample_cases(4, seed=0, corpus=repo, languages=parse_languages("js"))
    assert {c.language for c in cases} == {"javascript"}
    assert parse_languages("py, c++ ,sh") == ("python", "cpp", "shellscript")
    assert parse_languages("") is None


def test_unknown_language_and_missing_corpus_are_clear_errors(repo, tmp_path):
    with pytest.raises(CorpusError, match="unknown language 'cobol'"):
        parse_languages("python,cobol")
    with pytest.raises(CorpusError, match="not a directory"):
        sample_cases(2, corpus=tmp_path / "nope")
    with pytest.raises(CorpusError, match="no source files for rust"):
        sample_cases(2, corpus=repo, languages=("rust",))
    with pytest.raises(CorpusError, match="at least 1"):
        sample_cases(0, corpus=repo)


def test_header_language_is_decided_by_content(tmp_path):
    assert language_of("x.h", "int add(int a, int b);\n") == "c"
    assert language_of("x.h", "namespace fmt {\ntemplate <typename T> class buffer;\n}\n") == "cpp"
    assert language_of("x.hpp") == "cpp"
    (tmp_path / "a.h").write_text("int x;\n")
    files = list_files([tmp_path])
    assert [p.name for p, _ in files["c"]] == [p.name for p, _ in files["cpp"]] == ["a.h"]


def test_list_cases_runs_without_a_model(repo, capsys):
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="qwen2.5-coder-0.5b")
    bench_cli.add_arguments(parser)
    args = parser.parse_args(["--corpus", str(repo), "--limit", "3", "--list-cases"])
    assert bench_cli.run(args) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 2 + 3  # header, rule, one row per case
    assert "mod" in out or "app" in out or "calc" in out


def test_bad_modes_are_rejected():
    with pytest.raises(DraftwiseError, match="unknown mode fast"):
        bench_cli.parse_modes("auto,fast")
    assert bench_cli.parse_modes("auto")[0] == "hf-plain"  # the reference is always measured


def test_a_listed_case_is_read_again_from_its_file_as_it_was_made(repo):
    """What --quality-reference runs: an earlier run's cases from its JSON (which keeps the package
    path, not the file on disk), with the same prefix, removed text and suffix."""
    from bench.corpus import case_from_dict

    where = {shown: source for files in list_files([repo]).values() for source, shown in files}
    for case in sample_cases(12, seed=5, corpus=repo):
        listed = case.to_dict()
        listed.pop("source")
        assert case_from_dict(listed, where) == case
    listed["expected"] = "text the file never held"
    with pytest.raises(CorpusError, match="no longer holds"):
        case_from_dict(listed, where)


def test_quality_reference_pairs_a_new_run_with_an_earlier_runs_fp32_records(repo, tmp_path):
    import json

    from bench.harness import read_quality_reference

    cases = sample_cases(3, seed=0, corpus=repo)
    with_source = [c.to_dict() for c in cases]  # (a file the run kept the paths of)
    # scored by an "older rule" the other way round: the records are scored again against the removed code
    fp32 = [{"mode": "auto@fp32", "case_id": c.id, "language": c.language, "text": c.expected if i == 0 else "x",
             "first_line_exact": i != 0, "similarity": 0.5, "decode_tok_s": 1.0} for i, c in enumerate(cases)]
    earlier = {"config": {"max_tokens": 24, "context_tokens": 512}, "cases": with_source[:1],
               "quality_cases": with_source[1:], "runs": {"none@fp32": fp32[:1]}, "quality_runs": {"fp32": fp32[1:]}}
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(earlier))
    timed, quality, records = read_quality_reference(str(path), max_tokens=24, context_tokens=512)
    assert [c.id for c in timed + quality] == [c.id for c in cases] and timed[0] == cases[0]
    assert [records[c.id].first_line_exact for c in cases] == [True, False, False]
    with pytest.raises(ValueError, match="max_tokens 24, this run with 48"):
        read_quality_reference(str(path), max_tokens=48, context_tokens=512)
    earlier["quality_runs"]["fp32"] = fp32[1:2]
    path.write_text(json.dumps(earlier))
    with pytest.raises(ValueError, match="no fp32 record of 1"):
        read_quality_reference(str(path), max_tokens=24, context_tokens=512)
    # a case whose file this machine lacks is left out; the rest still pair (the timed one moves up if need be)
    gone = dict(with_source[0], source=str(tmp_path / "not-here.py"), id="python:not-here.py:1:x")
    earlier["cases"], earlier["quality_runs"]["fp32"] = [gone], fp32[1:]
    path.write_text(json.dumps(earlier))
    timed, quality, records = read_quality_reference(str(path), max_tokens=24, context_tokens=512)
    assert [c.id for c in timed] == [cases[1].id] and [c.id for c in quality] == [cases[2].id] and len(records) == 2
    earlier["cases"], earlier["quality_cases"] = [gone], []
    path.write_text(json.dumps(earlier))
    with pytest.raises(ValueError, match="none of its 1 cases"):
        read_quality_reference(str(path), max_tokens=24, context_tokens=512)
    earlier["cases"], earlier["quality_cases"], earlier["quality_runs"]["fp32"] = with_source[:1], with_source[1:], fp32[1:2]
    # another model's run (a bigger target scored on the same cases): its cases, never its records
    earlier["config"]["target"] = "small"
    path.write_text(json.dumps(earlier))
    timed, quality, records = read_quality_reference(str(path), "big", max_tokens=24, context_tokens=512)
    assert [c.id for c in timed + quality] == [c.id for c in cases] and records is None
    with pytest.raises(ValueError, match="no fp32 record of 1"):  # the same model's run is held to its fp32
        read_quality_reference(str(path), "small", max_tokens=24, context_tokens=512)


def test_quality_merge_pools_runs_counts_a_case_once_and_refuses_other_settings(tmp_path):
    import json

    from bench.harness import merge_quality_runs

    def record(fmt, case_id, right):
        return {"mode": f"auto@{fmt}", "case_id": case_id, "language": case_id.split(":")[0], "text": "x",
                "first_line_exact": right, "similarity": 0.5 + 0.5 * right}

    def run(path, ids, fp32_right, int4_right, **config):
        cases = [{"id": i, "language": i.split(":")[0]} for i in ids]
        data = {"config": {"target": "m", "max_tokens": 24, "context_tokens": 512, "command": "draftwise bench",
                           **config},
                "cases": cases[:1], "quality_cases": cases[1:],
                "runs": {"none@fp32": [record("fp32", ids[0], fp32_right[0])],
                         "none@int4": [record("int4", ids[0], int4_right[0])],
                         "auto@int4": [record("int4", ids[0], False)]},  # a drafting row is not a plain one
                "quality_runs": {"fp32": [record("fp32", i, r) for i, r in zip(ids[1:], fp32_right[1:])],
                                 "int4": [record("int4", i, r) for i, r in zip(ids[1:], int4_right[1:])]}}
        path.write_text(json.dumps(data))
        return str(path)

    a = run(tmp_path / "a.json", ["c:a:1", "py:b:2", "py:c:3"], [True, True, False], [True, False, False])
    # the second run scored c:a:1 again (a different record: the first file's counts) and two more cases
    b = run(tmp_path / "b.json", ["c:a:1", "js:d:4", "js:e:5"], [False, True, True], [False, True, False])
    merged = merge_quality_runs([a, b])
    q = merged["quality"]
    assert q["cases"] == 5 and q["languages"] == {"py": 2, "js": 2, "c": 1}
    assert q["formats"]["fp32"]["first_line_exact"] == 80.0  # c:a:1 True (from a), b True, c False, d True, e True
    assert q["formats"]["int4"]["first_line_exact"] == 40.0
    paired = q["formats"]["int4"]["versus_fp32"]
    assert paired["cases"] == 5 and paired["only_reference_right"] == 2 and paired["only_this_right"] == 0
    assert "passes_gate" in q["formats"]["int4"] and "versus" not in q["formats"]["int4"]  # one model: the gate's table
    assert report.quality_markdown(q)[2].startswith("| weights |") and report.quality_markdown(q)[2].endswith(" gate |")
    assert [r["records_added"] for r in q["runs"]] == [6, 4]
    c = run(tmp_path / "c.json", ["py:f:6"], [True], [True], max_tokens=48)
    with pytest.raises(ValueError, match="max_tokens 24 against 48"):
        merge_quality_runs([a, c])
    # a run that showed the lines after the cursor pools only under a label of its own
    lines = run(tmp_path / "lines.json", ["py:f:6"], [True], [True], suffix={"lines": True, "why": "as asked"})
    with pytest.raises(ValueError, match="label them apart"):
        merge_quality_runs([a, lines])
    assert "int4/lines" in merge_quality_runs([a, f"{lines}=lines"])["quality"]["formats"]
    from bench.harness import suffix_lines_of  # a replay records the setting as text

    assert suffix_lines_of({"suffix": "lines"}) and not suffix_lines_of({"suffix": "auto"}) and not suffix_lines_of({})

    # another model scored on a's cases: rows MODEL@FORMAT, each paired with the row asked for
    bigger = run(tmp_path / "d.json", ["c:a:1", "py:b:2", "py:c:3"], [True, True, True], [True, True, False],
                 target="big")
    models = merge_quality_runs([a, bigger], versus="m@int4")
    q = models["quality"]
    assert list(q["formats"]) == ["m@fp32", "m@int4", "big@fp32", "big@int4"] and q["versus"] == "m@int4"
    paired = q["formats"]["big@int4"]["versus"]  # big@int4 right on a:1, b:2; m@int4 only on a:1
    assert (paired["cases"], paired["only_this_right"], paired["only_reference_right"]) == (3, 1, 0)
    assert "passes_gate" not in q["formats"]["big@int4"] and models["config"]["target"] == ["m", "big"]
    default = merge_quality_runs([a, bigger])["quality"]
    assert default["versus"] == "m@fp32" and default["formats"]["big@int4"]["versus"]["cases"] == 3  # same 3 right and wrong
    assert not any("versus_fp32" in v or "passes_gate" in v for v in default["formats"].values())  # no gate across models
    header = report.quality_markdown(default)[2]
    assert header.startswith("| model@weights |") and "minus m@fp32" in header and "gate" not in header
    with pytest.raises(ValueError, match="no row 'm@int8'"):
        merge_quality_runs([a, bigger], versus="m@int8")
    with pytest.raises(ValueError, match="no files"):
        merge_quality_runs([])


def test_quality_merge_labels_runs_scores_them_again_and_breaks_them_down_by_cursor_kind(tmp_path):
    """The same model before and after a change: `FILE=LABEL` rows of their own, paired with the row asked
    for, overall and per cursor kind; every record scored again against its case's removed code (a run
    scored by an older rule compares with today's)."""
    import json

    from bench.harness import merge_quality_runs

    ids = ["py:a:1:mid_identifier", "py:b:2:mid_identifier", "js:c:3:end_of_line", "js:d:4:line_start"]
    expected = {ids[0]: "tems()", ids[1]: "ng = 1", ids[2]: "\n  return x", ids[3]: "y = 2"}

    def run(path, texts):
        cases = [{"id": i, "language": i.split(":")[0], "expected": expected[i]} for i in ids]
        records = [{"mode": "auto@int8", "case_id": i, "language": i.split(":")[0], "text": t,
                    "first_line_exact": False, "similarity": 0.0} for i, t in zip(ids, texts)]  # stale scores
        path.write_text(json.dumps({"config": {"target": "m", "max_tokens": 24, "context_tokens": 512},
                                    "cases": cases[:1], "quality_cases": cases[1:], "quality_runs": {"int8": records}}))
        return str(path)

    before = run(tmp_path / "before.json", [" items()", "\nng = 1", "\n  return x", "y = 3"])
    after = run(tmp_path / "after.json", ["tems()", "ng = 1", "\n  return x", "y = 3"])
    q = merge_quality_runs([before, f"{after}=healing"], versus="int8")["quality"]
    assert list(q["formats"]) == ["int8", "int8/healing"]
    assert q["formats"]["int8"]["first_line_exact"] == 25.0  # scored again: the end-of-line case is right
    assert q["formats"]["int8/healing"]["first_line_exact"] == 75.0
    kinds = q["formats"]["int8/healing"]["by_kind"]
    assert kinds["mid_identifier"]["first_line_exact"] == 100.0 and kinds["mid_identifier"]["versus"]["only_this_right"] == 2
    assert kinds["line_start"]["versus"]["difference_points"] == 0.0
    assert q["formats"]["int8/healing"]["by_language"]["py"]["quality_cases"] == 2
    text = "\n".join(report.quality_markdown(q))
    assert "First line exact by cursor kind" in text and "| 100.0% of 2, +100.0 [" in text
