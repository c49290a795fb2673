"""Token healing (decoding/healing.py): the end of the prefix the cursor cuts (its last blank, or the
tokens of its last word) is left out of the prompt, the first generated tokens must write it, and the
completion's text leaves it out again. Checked on every kind of tokenizer the presets and local model
directories use: byte-level BPE (Qwen, StarCoder, DeepSeek), SentencePiece with byte fallback (Llama,
CodeLlama), and a plain character vocabulary."""
from __future__ import annotations

import functools
import json
import random
from dataclasses import replace

import pytest
import torch

from decoding import CompletionRequest, EngineConfig
from decoding.api import CancelToken
from decoding.drafters.base import Draft, Drafter, Offer
from decoding.engine import Engine
from decoding.healing import MAX_HEALED_TOKENS, Constraint, Healing, limited, without_healed
from decoding.prompt import PromptBuilder
from tests.engine.healed import HealedPrompt, last_logits
from tests.engine.test_prompt import decode, tokenizer_with
from tests.tiny_models import _CORPUS, SPECIAL_TOKENS, build_tokenizer

CODE_LINES = [
    "    return self.items.append(item)", "        self.data = struct.unpack_from(fmt, buf)",
    "def fibonacci(n):", "    if n < 2:", "const values = [1, 2, 3].map((x) => x * 2);",
    "int main(int argc, char **argv) { printf(\"%d\\n\", argc); return 0; }",
    "local function greet(name) return \"hello \" .. name end", "\tfor key, value in sorted(data.items()):",
    "        default=default,", "x = é_var + 漢字_count  # 🙂",
]


def sentencepiece_tokenizer():
    """A Llama-style tokenizer: BPE over `▁`-joined text with no pre-tokenizer (merges learned word by word,
    `▁` at a word's start, as SentencePiece's are), `<0xNN>` byte tokens in the vocabulary for what the
    merges do not cover, a decoder that strips the first blank."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>"],
                                                                        show_progress=False))
    spec = json.loads(tok.to_str())
    spec["pre_tokenizer"] = None
    for b in range(256):
        spec["model"]["vocab"].setdefault(f"<0x{b:02X}>", len(spec["model"]["vocab"]))
    spec["model"]["byte_fallback"] = True
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", unk_token="<unk>")


@functools.lru_cache(maxsize=1)
def tokenizers_to_check() -> dict:
    from tests.engine.test_prompt import _tokenizers_to_check

    return {**_tokenizers_to_check(), "sentencepiece": sentencepiece_tokenizer(),
            "characters": tokenizer_with(["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"])}


@pytest.fixture(scope="module", params=list(tokenizers_to_check()))
def tokenizer(request):
    return tokenizers_to_check()[request.param]


def written(healing: Healing, ids) -> bytes:
    return b"".join(healing.texts.of[i] for i in ids)


def test_the_vocabulary_is_read_as_the_tokenizer_writes_it(tokenizer):
    healing = Healing(tokenizer)
    assert healing.texts is not None
    for line in CODE_LINES:
        ids = tokenizer.encode(line, add_special_tokens=False)
        if tokenizer.decode(ids, clean_up_tokenization_spaces=False).lstrip(" ") == line:  # a small vocabulary
            assert written(healing, ids).lstrip(b" ") == line.encode().lstrip(b" "), line
    specials = [tokenizer.convert_tokens_to_ids(t) for t in ("<|fim_prefix|>", "<|fim_suffix|>")]
    assert not any(i in healing.texts.of for i in specials)  # special tokens never write healed text


def test_the_healed_text_is_the_last_word_and_the_natural_tokens_write_it(tokenizer):
    """For cursors all along real code lines: the healed text ends the prefix, has no line break, is at
    most MAX_HEALED_TOKENS of the line's tokens, and the tokens the tokenizer gives the whole line after
    the prompt's text are allowed by the constraint one by one (so the model can write the line)."""
    healing, rng = Healing(tokenizer), random.Random(0)
    checked = words = 0
    for line in CODE_LINES:
        backend = tokenizer.backend_tokenizer
        for cut in sorted(rng.sample(range(1, len(line) + 1), min(12, len(line)))):
            prefix = "x = 1\n" + line[:cut]
            k = healing.split(prefix)
            healed = prefix[len(prefix) - k:]
            assert "\n" not in healed and len(backend.encode(healed, add_special_tokens=False).ids) <= MAX_HEALED_TOKENS + 1
            if not k or (not healed.strip() and line[cut:cut + 1].isspace()):
                continue  # inside a run of blanks a healed blank rules out more of them, by design
            words += healed.strip() != ""
            head = len(prefix) - k  # where the prompt's text ends
            enc = backend.encode("x = 1\n" + line, add_special_tokens=False)
            starts = [o[0] for o in enc.offsets]
            if head not in starts:
                continue  # the whole line's tokens do not start where the prompt ends (a word ahead of it merges)
            natural = enc.ids[starts.index(head):]
            constraint, j = Constraint(healing, healed), 0
            while (allowed := constraint.allowed(natural[:j])) is not None:
                assert j < len(natural) and allowed[natural[j]], (line, cut, healed, j)
                j += 1
            assert written(healing, natural[:j]).startswith(healed.encode()), (line, cut, healed)
            checked += 1
    if max(len(b) for b in healing.texts.of.values()) == 1:  # one character a token: nothing to heal but blanks
        assert checked >= 10 and words == 0
    else:
        assert checked >= 40 and words >= 30


def test_after_a_partial_word_no_line_break_and_no_second_indentation_is_allowed():
    bpe = build_tokenizer()
    healing = Healing(bpe)
    texts = {i: bpe.decode([i], clean_up_tokenization_spaces=False) for i in range(len(bpe))}
    for prefix, healed in [("def f(x):\n    return self.ite", "ite"), ("        se", " se"), ("    ", " ")]:
        assert prefix.endswith(healed) and healing.split(prefix) >= len(healed.strip()) > 0 or healed == " "
        allowed = Constraint(healing, prefix[len(prefix) - healing.split(prefix):]).allowed([])
        for i in allowed.nonzero().flatten().tolist():
            assert not texts[i].startswith("\n") and not texts[i].startswith((" " * 2, " \t")), (prefix, texts[i])


def test_the_allowed_tokens_are_those_that_agree_with_what_remains():
    """Brute force over the whole vocabulary: a token is allowed exactly when it writes all that
    remains and perhaps more, or a first part of it; after blanks, never more blanks."""
    bpe = build_tokenizer()
    healing = Healing(bpe, vocab_size=len(bpe) + 5)  # logits may be wider than the vocabulary
    of = healing.texts.of
    for remaining in [b" ", b"\t", b" se", b"(", b"ite", b".items", b"\xc3\xa9_var", b"fibonacci"]:
        mask = healing.allowed(remaining)
        if not remaining.strip():
            want = {i for i, b in of.items() if b.startswith(remaining) and b[len(remaining):][:1] not in (b" ", b"\t")}
        else:
            want = {i for i, b in of.items() if b.startswith(remaining) or
                    (remaining.startswith(b) and b and b != remaining)}
        assert want and set(mask.nonzero().flatten().tolist()) == want, remaining
        assert len(mask) == len(bpe) + 5 and not mask[len(bpe):].any()


def test_the_constraint_ends_once_the_healed_text_is_written_and_when_it_is_broken():
    bpe = build_tokenizer()
    healing = Healing(bpe)
    ids = {bpe.decode([i]): i for i in range(len(bpe))}
    constraint = Constraint(healing, " self.ite")
    one = bpe.encode(" self", add_special_tokens=False)
    assert len(one) == 1 and constraint.allowed([])[one[0]]
    assert constraint.allowed(one) is not None and not constraint.allowed(one)[one[0]]  # ".ite" remains
    assert constraint.allowed(bpe.encode(" self.items", add_special_tokens=False)) is None  # written, and more
    assert constraint.allowed([ids["\n"]]) is None  # broken: a rejected draft's later rows, read by no one
    later = constraint.after(one)  # an alternative whose first token wrote " self"
    assert torch.equal(later.allowed([]), constraint.allowed(one))


def test_the_prompt_leaves_out_the_healed_text_and_the_completion_leaves_it_out_again():
    tok = tokenizer_with(["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"])  # one token a character
    b = PromptBuilder(tok, budget=600)
    for prefix, healed in [("def f(x):\n    ", " "), ("    return ", " "), ("x = [\n  ", " "), ("    return n", "")]:
        parts = b.build(prefix, "", heal=True)
        assert parts.healed == healed, prefix  # one character a token: a word's last token is never cut
        assert decode(tok, parts.ids).startswith("<|fim_prefix|>" + prefix[:len(prefix) - len(healed)] + "<|fim_suffix|>")
        assert b.build(prefix, "").healed == "" and decode(tok, b.build(prefix, "").ids).startswith(
            "<|fim_prefix|>" + prefix + "<|fim_suffix|>")  # remote engines send the prefix as it is
    bpe = build_tokenizer()
    b = PromptBuilder(bpe, budget=600)
    fim = [b._special[t] for t in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")]
    for prefix, healed in [("    return fib", " fib"), ("    return self.ite", "ite"), ("for key in sorted(data.items(", "("),
                           ("        se", " se")]:
        parts = b.build(prefix, "", heal=True)
        assert parts.healed == healed, prefix
        assert parts.ids == [fim[0], *bpe.encode(prefix[:-len(healed)], add_special_tokens=False), fim[1], fim[2]]
    assert without_healed(" ", " x = 1") == "x = 1" and without_healed("", "x") == "x"
    assert without_healed(" sel", " se") == ""  # part of it written so far: nothing of the completion yet


def test_where_the_decoder_drops_the_first_blank_the_healed_text_is_taken_off_by_its_bytes():
    from decoding.prompt import PromptParts

    tok = sentencepiece_tokenizer()
    healing = Healing(tok)
    pieces = tok.tokenize("x = fibonacci(n)")
    ids = tok.convert_tokens_to_ids(pieces[1:])  # what a model writes after a healed ` =`
    assert written(healing, ids) == b" = fibonacci(n)" and not tok.decode(ids).startswith(" ")
    parts = PromptParts(ids=[], prefix_chars_dropped=0, suffix_chars_kept=0, context_files=0, healed=" =")
    assert parts.completion_text(tok.decode(ids), ids, healing) == " fibonacci(n)"
    assert parts.completion_text(tok.decode(ids[:1]), ids[:1], healing) == ""  # just the healed text
    # a decoder that writes the text as the tokens do: the same answer by the text alone
    bpe = build_tokenizer()
    ids = bpe.encode(" = fibonacci(n)", add_special_tokens=False)
    assert parts.completion_text(bpe.decode(ids), ids, Healing(bpe)) == " fibonacci(n)"


def test_limited_rules_out_the_rest_at_any_table_width():
    allowed = torch.tensor([False, True, False, True])
    logits = torch.arange(12.0).reshape(2, 6)  # a wider table (a draft model's, padded): extra columns out
    out = limited(logits, allowed)
    assert out[:, [1, 3]].tolist() == logits[:, [1, 3]].tolist()
    assert torch.isinf(out[:, [0, 2, 4, 5]]).all()
    assert limited(logits[:, :3], allowed)[0].tolist() == [float("-inf"), 1.0, float("-inf")]


# ---- in the engine: lossless across the healed position ----------------------------------------------

@pytest.fixture(scope="module")
def engine(tiny_model_dir, tiny_draft_dir):
    e = Engine(EngineConfig(target=str(tiny_model_dir), draft=str(tiny_draft_dir), drafter="auto", max_tokens=24,
                            weights="int8", draft_weights="int8"))
    e.load()
    yield e
    e.close()


def reference(engine: Engine, request: CompletionRequest) -> tuple[list[int], HealedPrompt]:
    """Plain greedy decoding under the constraint, one whole-sequence forward a token, no engine code."""
    prompt, out = HealedPrompt(engine, request), []
    with torch.inference_mode():
        for _ in range(request.max_tokens):
            tok = int(prompt.limit(last_logits(engine.models.target.model, prompt.ids + out), out).argmax())
            if tok in engine.models.end_ids:
                break
            out.append(tok)
    return out, prompt


class ScriptedDrafter(Drafter):
    """Drafts the reference continuation with one token changed `wrong_at` tokens after the position it
    drafts from, so a draft is accepted up to there; at the first position a token that breaks the
    healing constraint (a line break) when `wrong_at` is 0."""

    name = "lookup"

    def __init__(self, expected: list[int], prompt_len: int, wrong_at: int, line_break: int):
        self.expected, self.prompt_len, self.wrong_at, self.line_break = expected, prompt_len, wrong_at, line_break

    def offer(self, seq, room):
        return Offer(min(room, 6), "scripted")

    def propose(self, seq, k):
        done = len(seq) - self.prompt_len
        tokens = list(self.expected[done:done + k]) or [self.line_break]
        if self.wrong_at < len(tokens):
            tokens[self.wrong_at] = self.line_break if tokens[self.wrong_at] != self.line_break else tokens[0] + 1
        return Draft(tokens, self.name, key="scripted")


WORD_PREFIXES = ["class Stack:\n    def push(self, item):\n        self.ite", "def fibonacci(n):\n    if n < 2:\n        ret",
                 "for key, value in sorted(data.ite", "function add(a, b) { retu", "with open(path, \"r\", encod",
                 "import os, sys, js", "local function gre", "with open(path) as f:\n    data = json.loa",
                 "fn main() { let v: Vec<i32> = Vec::ne", "    def push(self, it"]


def test_drafts_across_the_healed_position_keep_plain_decodings_tokens(engine):
    """Drafts wrong at every offset from the first generated token on (0: a first token that breaks the
    constraint), so that steps accept part of a draft inside the healed text, at its end and after it:
    every text is plain constrained greedy decoding's."""
    models = engine.models
    line_break = models.tokenizer.encode("\n", add_special_tokens=False)[0]
    partial = healed_words = 0
    for i, prefix in enumerate(WORD_PREFIXES):
        request = CompletionRequest(prefix=prefix, scope="full", max_tokens=16, drafter="lookup")
        expected, prompt = reference(engine, request)
        assert prompt.healed and prompt.healed.strip(), prefix  # a word, not a blank
        healed_words += len(models.tokenizer.encode(prompt.healed, add_special_tokens=False)) > 1
        for wrong_at in range(4):
            scripted = ScriptedDrafter(expected, len(prompt.ids), wrong_at, line_break)
            original = models.drafters["lookup"]
            models.drafters["lookup"] = scripted
            try:
                result = engine.complete(replace(request, document=f"scripted-{i}-{wrong_at}"))
            finally:
                models.drafters["lookup"] = original
            assert result.text == prompt.text(expected), (prefix, wrong_at)
            partial += 0 < result.stats.accepted_tokens < result.stats.drafted_tokens
    assert partial >= 12 and healed_words >= 2


def test_every_drafter_keeps_plain_decodings_tokens_after_a_partial_word(engine):
    """The real drafters (the perturbed draft model, lookup, the remembered suggestion given a hint that
    is right across the healed text and then wrong) after partial words."""
    for i, prefix in enumerate(WORD_PREFIXES):
        base = CompletionRequest(prefix=prefix, scope="full", max_tokens=16)
        expected, prompt = reference(engine, base)
        text = prompt.text(expected)
        hint = text[:len(text) // 2] + " # wrong" + text[len(text) // 2:]
        for mode in ("none", "lookup", "model", "suggestion", "auto"):
            result = engine.complete(replace(base, drafter=mode, document=f"word-{i}-{mode}", draft_hint=hint))
            assert result.text == text, (prefix, mode)


def test_sampling_samples_within_the_constraint(engine):
    from decoding.request import plan_request, run_request

    models = engine.models
    for seed in range(12):
        request = CompletionRequest(prefix=WORD_PREFIXES[seed % len(WORD_PREFIXES)], scope="full", max_tokens=6,
                                    temperature=1.5, seed=seed, drafter="auto", document=f"sampled-{seed}")

        def raw_text():
            plan = plan_request(models, engine.config, request)
            plan.end = replace(plan.end, decode=models.decode)  # the text as generated, the healed part in it
            return run_request(models, plan, CancelToken())[0].text, plan.healing.healed

        text, healed = engine.on_model_thread(raw_text)
        assert text.startswith(healed) or (healed.startswith(text) and text), (seed, text, healed)
