"""`draftwise complete` end to end, and its errors: one clear line on stderr, non-zero exit, no traceback."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from decoding.errors import DraftwiseError
from lsp_server.cli import position_to_offset

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def draftwise(*args, env=None):
    return subprocess.run([sys.executable, "-m", "lsp_server.cli", *args], capture_output=True, text=True,
                          env=env, timeout=600)


def assert_clean_error(out, fragment: str):
    assert out.returncode != 0
    assert fragment in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1


def test_missing_file():
    assert_clean_error(draftwise("complete", "no/such/file.py", "--line", "0", "--character", "0"), "file not found")


def test_position_outside_the_file(tmp_path):
    f = tmp_path / "a.py"
    f.write_text("x = 1\n")
    assert_clean_error(draftwise("complete", str(f), "--line", "9", "--character", "0"), "line 9 is outside")
    assert_clean_error(draftwise("complete", str(f), "--line", "0", "--character", "40"), "character 40 is outside")


@pytest.mark.parametrize("text", ["ab\ncd\n", "ab\r\ncd\r\n", "ab\rcd\r"])
def test_positions_count_lines_as_lsp_does(text):
    """\n, \r\n and \r each end a line, and a column never reaches into the line break."""
    assert text[position_to_offset(text, 1, 1, "a.py")] == "d"
    assert position_to_offset(text, 0, 2, "a.py") == 2
    with pytest.raises(DraftwiseError, match="character 3 is outside line 0"):
        position_to_offset(text, 0, 3, "a.py")
    with pytest.raises(DraftwiseError, match="line 3 is outside"):
        position_to_offset(text, 3, 0, "a.py")


def test_unknown_preset(tmp_path):
    f = tmp_path / "a.py"
    f.write_text("x = 1\n")
    out = draftwise("complete", str(f), "--line", "0", "--character", "0", "--target", "qwen-nonexistent")
    assert_clean_error(out, "unknown model 'qwen-nonexistent'")


def test_missing_model(tmp_path):
    f = tmp_path / "a.py"
    f.write_text("x = 1\n")
    env = dict(os.environ, DRAFTWISE_HOME=str(tmp_path / "empty-home"))
    out = draftwise("complete", str(f), "--line", "0", "--character", "0", env=env)
    assert_clean_error(out, "draftwise models pull qwen2.5-coder-0.5b")


def test_debug_shows_the_traceback():
    out = draftwise("--debug", "complete", "no/such/file.py", "--line", "0", "--character", "0")
    assert out.returncode != 0 and "Traceback" in out.stderr


def stdlib_case(tmp_path: Path) -> tuple[Path, int, int]:
    """textwrap.py from the standard library with one statement of a method body removed."""
    lines = (STDLIB / "textwrap.py").read_text().split("\n")
    line = next(i for i, l in enumerate(lines) if l.strip() == "text = text.expandtabs(self.tabsize)")
    indent = len(lines[line]) - len(lines[line].lstrip())
    lines[line] = " " * indent
    path = tmp_path / "textwrap.py"
    path.write_text("\n".join(lines))
    return path, line, indent


@pytest.mark.real_model
def test_complete_on_a_stdlib_file_with_the_real_model(real_model, tmp_path):
    path, line, col = stdlib_case(tmp_path)
    args = ["complete", str(path), "--line", str(line), "--character", str(col), "--max-tokens", "24",
            "--context-tokens", "768", "--json"]
    plain = draftwise(*args, "--drafter", "none")
    lookup = draftwise(*args, "--drafter", "lookup")
    assert plain.returncode == 0, plain.stderr
    p, l = json.loads(plain.stdout), json.loads(lookup.stdout)  # stdout is exactly one JSON document
    # The missing line expands tabs; the model writes it as expandtabs() or as replace('\t', ...).
    assert p["text"].startswith("text = text.") and ("tab" in p["text"] or "\\t" in p["text"]), p["text"]
    assert l["text"] == p["text"]
    # What an editor inserts: at a line's end, the text without trailing blanks (the file indents with
    # spaces, as the model does).
    assert p["suggestion"] == {"text": p["text"].rstrip(), "replace": 0}
    assert p["stats"]["target_forwards"] == p["stats"]["generated_tokens"]
    if l["stats"]["drafter"] == "lookup":
        assert l["stats"]["target_forwards"] < l["stats"]["generated_tokens"]
    else:  # `auto` weights chose llama.cpp's gguf (the llamacpp extra is installed), whose verify rows
        # differ from decode steps on this build: drafting is off and every request decodes plainly
        assert l["stats"]["drafter"] == "none" and l["stats"]["drafted_tokens"] == 0
    for key in ("prompt_tokens", "reused_prompt_tokens", "drafted_tokens", "accepted_tokens", "prefill_ms",
                "decode_ms", "drafter", "stopped", "accepted_by"):
        assert key in l["stats"]


def test_quality_merge_of_a_file_that_is_not_a_bench_run(tmp_path):
    """`draftwise bench --quality-merge` loads no model: a bad file is one clear line, a good one a table."""
    bad = tmp_path / "notes.json"
    bad.write_text(json.dumps({"config": {}}))
    assert_clean_error(draftwise("bench", "--quality-merge", str(bad)), "has no scored records")
    assert_clean_error(draftwise("bench", "--quality-merge", str(tmp_path / "gone.json")), "No such file")
