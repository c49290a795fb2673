"""FIM templates are picked from the tokenizer's special tokens; budgets hold; the prompt start is stable."""
from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from decoding.api import ContextFile
from decoding.prompt import PREFIX_CUT_STEP, PromptBuilder, detect_template


def tokenizer_with(specials: list[str]) -> PreTrainedTokenizerFast:
    vocab = {chr(c): i for i, c in enumerate(range(32, 127))}
    vocab["\n"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="?"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="?")
    fast.add_special_tokens({"additional_special_tokens": specials})
    return fast


def decode(tok, ids) -> str:
    return "".join(tok.convert_ids_to_tokens(ids))


@pytest.mark.parametrize("specials, family", [
    (["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|file_sep|>"], "qwen2.5-coder"),
    (["<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>"], "starcoder"),
    (["<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"], "deepseek-coder"),
    (["▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"], "codellama"),
    ([], "plain"),
])
def test_template_follows_special_tokens(specials, family):
    assert detect_template(tokenizer_with(specials)).family == family


def test_layout_prefix_suffix_middle_with_context_first():
    tok = tokenizer_with(["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|file_sep|>"])
    b = PromptBuilder(tok, budget=400)
    ids = b.build("abc", "xyz", "m.py", [ContextFile("other.py", "q = 1")]).ids
    text = decode(tok, ids)
    assert text.index("<|file_sep|>other.py") < text.index("<|file_sep|>m.py") < text.index("<|fim_prefix|>abc")
    assert text.endswith("<|fim_prefix|>abc<|fim_suffix|>xyz<|fim_middle|>")


def test_plain_template_uses_only_the_prefix():
    tok = tokenizer_with([])
    parts = PromptBuilder(tok, budget=100).build("abc", "xyz")
    assert decode(tok, parts.ids) == "abc"


def test_budgets_hold_and_the_prefix_keeps_its_end():
    tok = tokenizer_with(["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|file_sep|>"])
    b = PromptBuilder(tok, budget=300)
    prefix = "".join(f"line {i}\n" for i in range(500)) + "cursor"
    suffix = "".join(f"after {i}\n" for i in range(500))
    parts = b.build(prefix, suffix, "m.py", [ContextFile("big.py", "x" * 5000), ContextFile("small.py", "y = 2")])
    assert len(parts.ids) <= 300
    text = decode(tok, parts.ids)
    assert "line 499\ncursor<|fim_suffix|>after 0<|fim_middle|>" in text  # the rest of the cursor's line
    assert "big.py" not in text  # did not fit
    assert parts.suffix_chars_kept < len(suffix) and parts.prefix_chars_dropped > 0
    more = PromptBuilder(tok, budget=300, max_suffix_tokens=30, whole_suffix=True).build(prefix, suffix)
    assert "cursor<|fim_suffix|>after 0\nafter 1\nafter 2\n<|fim_middle|>" in decode(tok, more.ids)  # line-aligned


def test_the_suffix_is_the_rest_of_the_line_and_typing_rereads_only_the_edit():
    """Every edit reads the suffix section again (it follows the prefix), so it holds only the rest of
    the cursor's line: typing at the cursor changes the prompt from the edit on, a few tokens."""
    tok = tokenizer_with(["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"])
    b = PromptBuilder(tok, budget=600)
    prefix, suffix = "def f(a, b):\n    return g(a", ", b)\n\nprint(f(1, 2))\n"
    before = b.build(prefix, suffix).ids
    after = b.build(prefix + "bc", suffix).ids
    assert decode(tok, after).endswith("return g(abc<|fim_suffix|>, b)<|fim_middle|>")
    same = next(i for i, (x, y) in enumerate(zip(before, after)) if x != y)
    assert len(after) - same == len("bc") + 1 + len(", b)") + 1  # one token a character, and the two markers
    assert b.build(prefix, "").ids[-2:] == b.build(prefix, "\nmore\n").ids[-2:]  # at a line end: no suffix text


def test_prefix_start_is_stable_while_typing():
    """Typing at the end must not move the start of the prompt (or every keystroke re-prefills all)."""
    tok = tokenizer_with(["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"])
    b = PromptBuilder(tok, budget=600)
    prefix = "".join(f"value_{i} = {i}\n" for i in range(400))
    starts = set()
    for typed in range(0, 120, 3):
        parts = b.build(prefix + "x" * typed, "")
        starts.add(parts.prefix_chars_dropped)
    assert len(starts) <= 2  # moves at most once, by PREFIX_CUT_STEP lines
    if len(starts) == 2:
        lo, hi = sorted(starts)
        assert prefix[lo:hi].count("\n") == PREFIX_CUT_STEP


def test_at_a_new_lines_indentation_the_prompt_stops_before_it_and_holds_no_suffix():
    """The indentation is healed (the model writes it), and no lines after the cursor are read again
    on every keystroke: with both, the 0.5B wrote more exact first lines at line starts."""
    tok = tokenizer_with(["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"])
    b = PromptBuilder(tok, budget=600)
    suffix = "\n    if x:\n        y()\n    z = 1\n    return z\n"
    parts = b.build("def f(x):\n    ", suffix, heal=True)
    assert decode(tok, parts.ids).endswith("def f(x):\n   <|fim_suffix|><|fim_middle|>") and parts.healed == " "
    typed = decode(tok, b.build("def f(x):\n    w", "(1)" + suffix, heal=True).ids)
    assert typed.endswith("    w<|fim_suffix|>(1)<|fim_middle|>")  # code before the cursor: the rest of the line


def _tokenizers_to_check() -> dict:
    """The tiny model's BPE (GPT-2's word rule) and, where pulled, the real Qwen2.5-Coder tokenizer."""
    from tests.tiny_models import build_tokenizer

    out = {"tiny": build_tokenizer()}
    from decoding.models import pack
    from decoding.models.specs import PRESETS

    preset = PRESETS["qwen2.5-coder-0.5b"]
    if pack.is_pulled(preset):
        from transformers import AutoTokenizer

        out["qwen"] = AutoTokenizer.from_pretrained(str(pack.preset_dir(preset)))
    return out


def test_the_prefix_tokenized_line_by_line_is_the_whole_prefix_tokenized():
    """Each line's ids are kept by its text (a keystroke tokenizes one line, not the ~24,000 characters
    that could fit); the prompt must hold exactly the ids of tokenizing the kept prefix whole, within
    the budget, cut at a step line, where tokenizing the tail whole cuts it too."""
    import random
    from pathlib import Path

    import decoding

    texts = [t for p in sorted(Path(decoding.__file__).parent.rglob("*.py")) if len(t := p.read_text()) > 2000][:25]
    texts.append("int f(void)\r\n{\r\n\treturn 0;  \r\n}\r\n\r\n\r\n  \t\n" * 300 + "/* é 中文 */\n" * 50)
    rng = random.Random(0)
    assert len(texts) > 20  # (the package's larger modules and the text above)
    for name, tok in _tokenizers_to_check().items():
        b = PromptBuilder(tok)
        assert b.piece_rule is not None, name
        for text in texts:
            for _ in range(4):
                prefix = text[:rng.randrange(1, len(text))]
                for budget in (1000, 200, 40):
                    ids, cut = b._fit_prefix(prefix, budget)
                    window = max(0, len(prefix) - budget * 16)
                    assert ids == b.encode(prefix[cut:]) and len(ids) <= budget, (name, budget)
                    assert (ids, cut) == b._fit_prefix_whole(prefix, budget, window), (name, budget)


def test_a_keystroke_tokenizes_only_the_line_it_changed():
    from tests.tiny_models import build_tokenizer

    b = PromptBuilder(build_tokenizer(), budget=600)
    prefix = "".join(f"value_{i} = compute({i})\n" for i in range(300)) + "result = comp"
    first = b.build(prefix, ")\n")
    tokenized = b.pieces.tokenized
    second = b.build(prefix + "u", ")\n")
    assert b.pieces.tokenized - tokenized == 1  # the cursor's line; the others are kept
    fresh = PromptBuilder(build_tokenizer(), budget=600)  # nothing kept: every line tokenized now
    assert second.ids == fresh.build(prefix + "u", ")\n").ids != first.ids


def test_a_tokenizer_whose_pieces_tokenize_differently_is_tokenized_whole():
    """A tokenizer that puts a space before every text (sentencepiece's style) gives other ids for a
    line tokenized alone: the prompt is then tokenized whole."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.train_from_iterator(["def f(x):\n    return x\n" * 20], trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|fim_prefix|>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    b = PromptBuilder(fast, budget=100)
    assert b.piece_rule is None
    prefix = "def f(x):\n    return x\n" * 30
    ids, cut = b._fit_prefix(prefix, 100)
    assert ids == b.encode(prefix[cut:]) and len(ids) <= 100



def test_the_lines_after_the_cursor_end_at_a_line_within_the_suffix_budget():
    """whole_suffix (`suffix: "lines"`): the lines after the cursor as far as the suffix budget holds
    whole lines; without it, the rest of the cursor's line."""
    tok = tokenizer_with(["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"])
    suffix = "a)\n" + "".join(f"y{i} = {i}\n" for i in range(40))  # far over 32 tokens
    lines = PromptBuilder(tok, budget=400, whole_suffix=True).build("x = f(", suffix)
    text = decode(tok, lines.ids)
    shown = text[text.index("<|fim_suffix|>") + len("<|fim_suffix|>"):text.index("<|fim_middle|>")]
    assert shown.startswith("a)\ny0 = 0\n") and shown.endswith("\n") and suffix.startswith(shown)
    assert len(tok.encode(shown, add_special_tokens=False)) <= 32 < len(tok.encode(shown + "y9 = 9\n", add_special_tokens=False))
    assert lines.suffix_chars_kept == len(shown)
    line = decode(tok, PromptBuilder(tok, budget=400).build("x = f(", suffix).ids)
    assert line.endswith("x = f(<|fim_suffix|>a)<|fim_middle|>")
