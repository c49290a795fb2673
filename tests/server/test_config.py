"""Settings from initializationOptions / didChangeConfiguration."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from decoding.api import EngineConfig
from decoding.errors import DraftwiseError
from lsp_server.config import KNOWN_KEYS, Settings, apply_settings

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_every_documented_key_is_applied():
    update = apply_settings(Settings(), {
        "target": "/models/x", "draft": "qwen2.5-coder-0.5b", "drafter": "lookup", "maxTokens": 32,
        "device": "cuda:1", "dtype": "bfloat16", "temperature": 0.2, "contextTokens": 2048,
        "languages": ["python", "rust"], "scope": "line", "weights": "int8", "draftWeights": "int4",
        "idleWork": False, "maxTimeMs": 750, "repoContext": True, "repoContextTokens": 256, "suffix": "lines",
    })
    assert update.problems == [] and update.ignored == []
    s = update.settings
    assert (s.engine.target, s.engine.draft, s.engine.drafter, s.engine.max_tokens) == \
        ("/models/x", "qwen2.5-coder-0.5b", "lookup", 32)
    assert (s.engine.device, s.engine.dtype, s.engine.context_tokens) == ("cuda:1", "bfloat16", 2048)
    assert (s.temperature, s.languages, s.scope) == (0.2, ("python", "rust"), "line")
    assert (s.engine.weights, s.engine.draft_weights) == ("int8", "int4")
    assert (s.idle_work, s.max_time_ms) == (False, 750)
    assert (s.repo_context, s.repo_context_tokens) == (True, 256)
    assert s.engine.suffix == "lines"
    assert Settings().needs_reload(s)  # other weights are other models
    assert s.serves_language("rust") and not s.serves_language("go")


def test_settings_under_a_draftwise_section_are_read():
    update = apply_settings(Settings(), {"draftwise": {"maxTokens": 12}, "editor": {"tabSize": 2}})
    assert update.settings.engine.max_tokens == 12 and update.ignored == []


def test_unknown_keys_are_reported_and_ignored():
    update = apply_settings(Settings(), {"maxTokens": 10, "colour": "blue"})
    assert update.ignored == ["colour"] and update.settings.engine.max_tokens == 10


@pytest.mark.parametrize("value", ["on", "off", "auto", "sometimes"])
def test_the_removed_compile_setting_from_an_old_editor_config_is_ignored(value):
    """The compiled forward is gone; an editor that still sends `compile` gets the server as it was,
    whatever value it sends: no problem for the user, nothing to reload."""
    update = apply_settings(Settings(), {"draftwise": {"compile": value, "maxTokens": 10}})
    assert update.problems == [] and update.ignored == ["compile"]
    assert update.settings == apply_settings(Settings(), {"maxTokens": 10}).settings
    assert not Settings().needs_reload(update.settings)


def _value_of(settings: Settings, key: str):
    return {"maxTokens": settings.engine.max_tokens, "temperature": settings.temperature,
            "drafter": settings.engine.drafter, "dtype": settings.engine.dtype, "device": settings.engine.device,
            "target": settings.engine.target, "languages": settings.languages,
            "contextTokens": settings.engine.context_tokens, "scope": settings.scope,
            "weights": settings.engine.weights, "draftWeights": settings.engine.draft_weights,
            "idleWork": settings.idle_work, "maxTimeMs": settings.max_time_ms,
            "repoContext": settings.repo_context, "repoContextTokens": settings.repo_context_tokens,
            "suffix": settings.engine.suffix}[key]


@pytest.mark.parametrize("key,value,words", [
    ("maxTokens", "many", "whole number from 1"),
    ("maxTokens", 0, "whole number from 1"),
    ("maxTokens", True, "whole number"),
    ("maxTokens", 2.5, "whole number"),
    ("maxTokens", float("inf"), "whole number"),
    ("temperature", -1, "number from 0 to 2"),
    ("temperature", float("nan"), "number from 0 to 2"),
    ("drafter", "magic", "one of none, lookup, model, suggestion, auto"),
    ("dtype", "int4", "one of auto, float32"),
    ("weights", "int3", "one of auto, fp32, bf16, int8, int4"),
    ("draftWeights", "float32", "one of auto, fp32, bf16, int8, int4"),
    ("device", "tpu", "auto, cpu, mps, cuda or cuda:N"),
    ("target", "", "non-empty string"),
    ("languages", "python", "list of language ids"),
    ("contextTokens", 10, "whole number from 64"),
    ("suffix", "file", "one of auto, line, lines"),
    ("scope", "paragraph", "one of auto, line, block, full"),
    ("idleWork", "yes", "true or false"),
    ("maxTimeMs", -5, "whole number from 0"),
])
def test_bad_values_keep_the_previous_value_with_a_clear_message(key, value, words):
    before = Settings(engine=EngineConfig(max_tokens=48))
    raw = {key: value}
    if key != "drafter":
        raw["drafter"] = "lookup"
    update = apply_settings(before, raw)
    assert len(update.problems) == 1
    message = update.problems[0]
    assert f"'{key}'" in message and words in message and repr(value) in message
    assert "keeping the previous value" in message
    assert _value_of(update.settings, key) == _value_of(before, key)
    if key != "drafter":
        assert update.settings.engine.drafter == "lookup"  # good keys next to a bad one still apply


def test_a_whole_number_written_as_a_float_is_accepted():
    assert apply_settings(Settings(), {"maxTokens": 64.0}).settings.engine.max_tokens == 64


def test_draft_none_and_languages_wildcard():
    s = apply_settings(Settings(), {"draft": "none", "languages": ["*"]}).settings
    assert s.engine.draft is None and s.languages is None
    assert apply_settings(Settings(), {"draft": None}).settings.engine.draft is None


def test_settings_that_are_not_an_object_are_a_problem_not_a_crash():
    update = apply_settings(Settings(), ["maxTokens", 3])
    assert update.problems == ["draftwise settings must be an object, got list"]
    assert update.settings == Settings()
    assert apply_settings(Settings(), None).settings == Settings()


def test_only_model_changes_need_a_reload():
    base = Settings()
    for key, value in [("target", "/other"), ("draft", "qwen2.5-coder-0.5b"), ("device", "cpu"),
                       ("dtype", "float32")]:
        assert base.needs_reload(apply_settings(base, {key: value}).settings), key
    for key, value in [("maxTokens", 8), ("drafter", "none"), ("temperature", 0.5), ("languages", ["go"]),
                       ("scope", "line"), ("contextTokens", 512)]:
        assert not base.needs_reload(apply_settings(base, {key: value}).settings), key


def documented_settings(path: Path, heading: str) -> dict[str, list[str]]:
    """key -> the other cells of its row, from the first table after `heading` in a Markdown file."""
    text = path.read_text(encoding="utf-8")
    rows: dict[str, list[str]] = {}
    for line in text[text.index(heading):].splitlines()[1:]:
        if rows and not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        for key in re.findall(r"`(\w+)`", cells[0]) if line.startswith("|") else ():
            rows[key] = cells[1:]
    return rows


@pytest.mark.parametrize("doc, heading", [("README.md", "### Server settings"),
                                          ("lsp_server/PROTOCOL.md", "## Settings")])
def test_the_settings_tables_list_every_key(doc, heading):
    assert set(documented_settings(REPO_ROOT / doc, heading)) == set(KNOWN_KEYS)


def test_the_protocol_says_which_settings_reload_the_models():
    values = {"target": "/other", "draft": "/other-draft", "device": "cpu", "dtype": "float32",
              "weights": "int8", "draftWeights": "int4", "contextTokens": 512, "drafter": "none",
              "maxTokens": 8, "temperature": 0.5, "languages": ["go"], "scope": "line", "alternatives": 5,
              "idleWork": False, "maxTimeMs": 800, "repoContext": True, "repoContextTokens": 128,
              "suffix": "lines"}
    assert set(values) == set(KNOWN_KEYS)
    table = documented_settings(REPO_ROOT / "lsp_server/PROTOCOL.md", "## Settings")
    for key, value in values.items():
        reloads = Settings().needs_reload(apply_settings(Settings(), {key: value}).settings)
        assert table[key][-1] == ("yes" if reloads else "no"), key


def test_repo_context_auto_follows_the_models_measured_verdict():
    """`repoContext: "auto"` (the default) is on exactly where the engine says the repository pays for the
    loaded model; true and false are the user's word."""
    from decoding.models.quality_gate import repo_context_verdict

    assert Settings().repo_context is None
    assert Settings().repo_context_on(True) and not Settings().repo_context_on(False)
    for value, expected in [(True, True), (False, False), ("auto", None), (None, None)]:
        update = apply_settings(Settings(repo_context=True), {"repoContext": value})
        assert update.problems == [] and update.settings.repo_context is expected
    assert apply_settings(Settings(), {"repoContext": "yes"}).problems
    measured = {"m": {"crossfile": {"difference_points": 6.4, "ci95": [1.8, 11.8]},
                      "ordinary": {"difference_points": -0.5, "ci95": [-3.0, 2.0]}},
                "weak": {"crossfile": {"difference_points": 2.7, "ci95": [-2.7, 8.2]},
                         "ordinary": {"difference_points": 0.0, "ci95": [-3.0, 3.0]}},
                "costly": {"crossfile": {"difference_points": 6.4, "ci95": [1.8, 11.8]},
                           "ordinary": {"difference_points": -4.0, "ci95": [-7.0, -1.0]}}}
    assert repo_context_verdict("m", measured)[0] is True
    assert repo_context_verdict("weak", measured)[0] is False  # no significant gain
    assert repo_context_verdict("costly", measured)[0] is False  # a significant loss on ordinary cases
    assert repo_context_verdict("never-measured", measured) == (False, "not measured for never-measured: off")


def test_suffix_auto_follows_the_models_measured_verdict():
    """`suffix: "auto"` (the default) shows the lines after the cursor exactly where the gate measured a
    significant gain for the model; "line" and "lines" are the user's word, whatever was measured."""
    from decoding.models.quality_gate import suffix_choice, suffix_lines_verdict

    assert EngineConfig().suffix == "auto"
    measured = {"gains": {"cases": 400, "difference_points": 3.4, "ci95": [0.7, 6.1]},
                "unsure": {"cases": 161, "difference_points": 3.1, "ci95": [-1.2, 7.5]},
                "loses": {"cases": 161, "difference_points": -14.3, "ci95": [-19.9, -8.7]}}
    assert suffix_lines_verdict("gains", measured)[0] is True
    assert suffix_lines_verdict("unsure", measured)[0] is False  # no significant gain
    assert suffix_lines_verdict("loses", measured)[0] is False
    on, why = suffix_lines_verdict("never-measured", measured)
    assert not on and "not measured" in why
    presets = {"qwen2.5-coder-1.5b": measured["gains"], "qwen2.5-coder-0.5b": measured["loses"]}
    assert suffix_choice("auto", "qwen2.5-coder-1.5b", presets)[0] is True
    assert suffix_choice("auto", "qwen2.5-coder-0.5b", presets)[0] is False
    assert suffix_choice("lines", "qwen2.5-coder-0.5b", presets)[0] is True  # the user's word wins
    assert suffix_choice("line", "qwen2.5-coder-1.5b", presets)[0] is False
    with pytest.raises(DraftwiseError, match="suffix must be one of"):
        suffix_choice("Lines", "qwen2.5-coder-1.5b")
    # the committed measurements: the 0.5B loses with the lines after the cursor; the 1.5B's gain is
    # not significant. Both keep the line, and say why.
    on, why = suffix_choice("auto", "qwen2.5-coder-0.5b")
    assert not on and why.startswith("the rest of the cursor's line: -11.8 points")
    on, why = suffix_choice("auto", "qwen2.5-coder-1.5b")
    assert not on and "[-0.7, +4.7] on 404 gate cases" in why
    assert Settings().needs_reload(apply_settings(Settings(), {"suffix": "lines"}).settings)
