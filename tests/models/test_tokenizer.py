"""The kept tokenizer (decoding/models/tokenizer.py) against transformers' own, on the tiny model's
(whose tokenizer.json transformers' Qwen2 class rebuilds: reading that file alone would differ) and
the real preset's: the same ids, offsets, texts, vocabulary and end token, so a start that skips
transformers writes the same prompts and completions."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from decoding.api import CompletionRequest
from decoding.healing import Healing
from decoding.models.checkpoint import _tokenizer, model_source, parse_model_spec
from decoding.models.tokenizer import FileTokenizer
from decoding.prompt import PromptBuilder

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [
    "", " ", "\n", "\r\n\r\n", "\t\tx", "    return a + b\n", "def f(x):\n\treturn x  # ünïcödé ✓ 🐍 中文\n",
    "<|fim_prefix|>def f(<|fim_suffix|>)<|fim_middle|>", "<|endoftext|>tail", "a" * 300, "x\u00a0y\u200bz",
    *(ROOT / "decoding" / "speculative.py").read_text().split("\n\n"),
    (ROOT / "editor-clients" / "neovim" / "lua" / "draftwise" / "init.lua").read_text()[:3000],
]


def both(directory, home, monkeypatch) -> tuple[FileTokenizer, object]:
    monkeypatch.setenv("DRAFTWISE_HOME", str(home))
    first = _tokenizer(str(directory), {}, False)  # a first start: transformers builds it, and it is kept
    assert not isinstance(first, FileTokenizer)
    kept = _tokenizer(str(directory), {}, False)
    assert isinstance(kept, FileTokenizer), "a later start fell back to transformers' tokenizer"
    return kept, AutoTokenizer.from_pretrained(str(directory))


def assert_same(fast, hf):
    assert len(fast) == len(hf) and fast.get_vocab() == hf.get_vocab() and fast.eos_token_id == hf.eos_token_id
    assert fast.convert_ids_to_tokens(list(range(len(hf)))) == hf.convert_ids_to_tokens(list(range(len(hf))))
    for text in TEXTS:
        for special in (False, True):
            assert fast.encode(text, add_special_tokens=special) == hf.encode(text, add_special_tokens=special), text
        one, theirs = fast(text, add_special_tokens=False, return_offsets_mapping=True), \
            hf(text, add_special_tokens=False, return_offsets_mapping=True)
        assert one["input_ids"] == theirs["input_ids"] and [tuple(o) for o in one["offset_mapping"]] == \
            [tuple(o) for o in theirs["offset_mapping"]], text
    assert fast(TEXTS[:5], add_special_tokens=False)["input_ids"] == hf(TEXTS[:5], add_special_tokens=False)["input_ids"]
    rng = random.Random(0)
    special = sorted(hf.all_special_ids)
    for _ in range(200):
        ids = [rng.randrange(len(hf)) for _ in range(rng.randrange(1, 12))] + rng.sample(special, min(2, len(special)))
        rng.shuffle(ids)
        for skip in (False, True):
            assert fast.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False) == \
                hf.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False), ids
    assert fast.batch_decode([[i] for i in range(50)], clean_up_tokenization_spaces=False) == \
        hf.batch_decode([[i] for i in range(50)], clean_up_tokenization_spaces=False)
    # what the engine builds from them: prompts (with offsets and healing) and healing's tables
    request = CompletionRequest(prefix="".join(TEXTS[11:14]) + "\n    ", suffix=TEXTS[12], path="a.py")
    assert PromptBuilder(fast, 256).build_request(request, heal=True) == PromptBuilder(hf, 256).build_request(request, heal=True)
    ours, theirs = Healing(fast, len(hf)), Healing(hf, len(hf))
    assert ours.texts.of == theirs.texts.of
    assert all(ours.split(text[:cut]) == theirs.split(text[:cut]) for text in TEXTS for cut in range(0, len(text), 7))


def test_the_tiny_models_kept_tokenizer_is_transformers_own(tiny_model_dir, tmp_path, monkeypatch):
    assert_same(*both(tiny_model_dir, tmp_path, monkeypatch))


@pytest.mark.real_model
def test_the_presets_kept_tokenizer_is_transformers_own(real_model, tmp_path, monkeypatch):
    assert_same(*both(model_source(parse_model_spec(real_model))[0], tmp_path, monkeypatch))


def test_a_changed_tokenizer_file_is_built_again_and_an_unknown_class_never_kept(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path / "home"))
    model = tmp_path / "model"
    model.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        (model / name).write_bytes((Path(tiny_model_dir) / name).read_bytes())
    hf = AutoTokenizer.from_pretrained(str(model))
    FileTokenizer.keep(model, hf)
    assert FileTokenizer.read(model) is not None
    config = model / "tokenizer_config.json"
    config.write_text(config.read_text().replace("<|endoftext|>", "<|im_end|>"))  # another end token
    assert FileTokenizer.read(model) is None
    FileTokenizer.keep(model, AutoTokenizer.from_pretrained(str(model)))
    assert FileTokenizer.read(model).eos_token_id == hf.get_vocab()["<|im_end|>"]

    class SentencePieceLike:  # a class that may do more than its pipeline: never kept
        backend_tokenizer, eos_token = hf.backend_tokenizer, hf.eos_token

    config.write_text(config.read_text() + " ")
    FileTokenizer.keep(model, SentencePieceLike())
    assert FileTokenizer.read(model) is None


def test_a_second_start_loads_nothing_of_transformers(tiny_model_dir, tmp_path):
    """What the kept tokenizer, the kept quantized model and config.json buy: the second start of an
    engine on the same model never imports transformers (~0.5 s import, ~0.5 s building its tokenizer)."""
    import subprocess
    import sys

    code = ("import sys\nfrom decoding.api import EngineConfig\nfrom decoding.engine import Engine\n"
            f"e = Engine(EngineConfig(target={str(tiny_model_dir)!r}, weights='int8'))\ne.load()\n"
            "print(type(e.models.tokenizer).__name__, 'transformers' in sys.modules)")
    from decoding.home import paths

    (paths.draftwise_home() / "extensions").mkdir(parents=True, exist_ok=True)  # the kernels as built already
    (tmp_path / "extensions").symlink_to(paths.draftwise_home() / "extensions")
    env = {**__import__("os").environ, "DRAFTWISE_HOME": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                           check=True, timeout=600).stdout.split() for _ in range(2)]
    assert runs == [["Qwen2Tokenizer", "True"], ["FileTokenizer", "False"]], runs


def test_a_pipeline_that_truncates_or_pads_is_read_back_as_transformers_calls_it(tiny_model_dir, tmp_path, monkeypatch):
    """A tokenizer.json may carry truncation and padding; transformers turns both off on every call,
    and so must the kept tokenizer (a prompt cut to 8 tokens, or texts padded, would pass unnoticed)."""
    import json

    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path / "home"))
    model = tmp_path / "model"
    model.mkdir()
    for name in ("tokenizer_config.json", "config.json"):
        (model / name).write_bytes((Path(tiny_model_dir) / name).read_bytes())
    pipeline = json.loads((Path(tiny_model_dir) / "tokenizer.json").read_text())
    pipeline["truncation"] = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
    pipeline["padding"] = {"strategy": "BatchLongest", "direction": "Right", "pad_to_multiple_of": None,
                           "pad_id": 0, "pad_type_id": 0, "pad_token": "<|endoftext|>"}
    (model / "tokenizer.json").write_text(json.dumps(pipeline))
    first, kept = _tokenizer(str(model), {}, False), _tokenizer(str(model), {}, False)
    assert isinstance(kept, FileTokenizer) and not isinstance(first, FileTokenizer)
    text = TEXTS[12]
    assert len(first.encode(text, add_special_tokens=False)) > 8
    assert kept.encode(text, add_special_tokens=False) == first.encode(text, add_special_tokens=False)
    texts = ["a", text]
    assert kept(texts, add_special_tokens=False)["input_ids"] == first(texts, add_special_tokens=False)["input_ids"]
