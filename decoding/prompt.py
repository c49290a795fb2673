"""Fill-in-the-middle prompts, built as token ids, laid out so that KV caches can be reused.

Layout (why it looks like this):
- Everything that is stable across keystrokes comes first: other files' context, then the current
  file's prefix. A request a few keystrokes later shares the whole token prefix up to the edit point,
  so only the tokens after it are prefilled again.
- The suffix comes after the prefix (prefix-suffix-middle, the layout these models are trained on;
  putting the suffix first lost most exact first lines in a measurement), which means every edit
  reads the suffix section again (~8 ms a token on a 2-core CPU, on every keystroke). So it is
  short, at most 32 tokens: the rest of the cursor's line, or, for a model where the quality gate
  measured that they pay (`whole_suffix`, EngineConfig.suffix), the lines after it as far as whole
  lines fit. On the gate's cases the 0.5B wrote fewer first lines right with the lines after, the
  1.5B a few more, not significantly (decoding/models/quality_gate.py: SUFFIX_LINES).
- The end of the prefix that the cursor cuts (its last blank: a new line's indentation, the space
  after `return `; or its last word: the `s` of `self` being typed) is left out, and the model writes
  it first (decoding/healing.py): a prompt that ends on a blank token made the model indent twice, one
  that ends on a cut word made it start a new line. With that, a new line needs no lines after the cursor either: on 81
  line-start cursors of the benchmark corpus (Q4) the first line was exactly right 15 times, against
  7 with the blanks in the prompt and three lines after as the suffix (the layout before); with a
  first form of healing, one or three lines after gave 11 and none 15.
- The prefix is cut at a line boundary that moves in steps of PREFIX_CUT_STEP lines, so the start of
  the prompt stays put while the user types and the cache keeps matching.
- The prefix is tokenized a line at a time, each line's ids kept by its text (PieceTokens), where the
  tokenizer gives the same ids that way as for the whole text: a keystroke then tokenizes one line,
  not the ~24,000 characters that could fit (18 ms a request on a 2-core CPU: docs/performance.md).
"""
from __future__ import annotations

import bisect
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Sequence

from decoding.api import ContextFile
from decoding.healing import Constraint, Healing, without_healed

PREFIX_CUT_STEP = 32  # lines
# An upper bound, far above what a token of code holds: text past budget × this many characters can
# never fit, so it is cut before tokenizing (which costs time on long files).
MAX_CHARS_PER_TOKEN = 16


@dataclass(frozen=True)
class FimTemplate:
    family: str
    prefix: str | None  # special token strings; None for plain left-to-right prompts
    suffix: str | None
    middle: str | None
    file_sep: str | None = None  # repo-level context separator, when the family has one
    repo_name: str | None = None
    end_tokens: tuple[str, ...] = ()  # tokens that end the middle (besides the tokenizer's EOS)

    @property
    def is_fim(self) -> bool:
        return self.prefix is not None


TEMPLATES = (
    FimTemplate("qwen2.5-coder", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|file_sep|>",
                "<|repo_name|>", ("<|endoftext|>", "<|fim_pad|>", "<|file_sep|>", "<|im_end|>",
                                  "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>")),
    FimTemplate("starcoder", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>", "<repo_name>",
                ("<|endoftext|>", "<file_sep>", "<fim_pad>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>")),
    FimTemplate("deepseek-coder", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", None, None,
                ("<｜end▁of▁sentence｜>", "<|EOT|>")),
    FimTemplate("codellama", "▁<PRE>", "▁<SUF>", "▁<MID>", None, None, ("▁<EOT>", "</s>")),
)
PLAIN = FimTemplate("plain", None, None, None)


def detect_template(tokenizer) -> FimTemplate:
    """Pick the FIM format whose special tokens this tokenizer has; plain left-to-right otherwise."""
    vocab = tokenizer.get_vocab()
    for t in TEMPLATES:
        if all(tok in vocab for tok in (t.prefix, t.suffix, t.middle)):
            return t
    return PLAIN


def valid_text(text: str) -> str:
    """Editors can send lone UTF-16 surrogates; tokenizers and JSON encoders reject them. Replace
    them, keep the rest."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def end_token_ids(tokenizer, template: FimTemplate) -> set[int]:
    vocab = tokenizer.get_vocab()
    ids = {vocab[t] for t in template.end_tokens if t in vocab}
    eos = tokenizer.eos_token_id
    if isinstance(eos, int):
        ids.add(eos)
    for extra in ("<|endoftext|>", "<|im_end|>", "</s>"):
        if extra in vocab:
            ids.add(vocab[extra])
    return ids


# Where a text may be cut into pieces that tokenize on their own to the same ids as the whole. BPE
# tokenizers split text into words by a regular expression first, and no word of Qwen2's expression
# runs from a newline into a line with something on it; GPT-2's joins a newline to the next line's
# indentation, so there only unindented lines start a piece. Which rule holds is checked per tokenizer.
LINE_START_RULES = (re.compile(r"\n(?=[^\S\n]*\S)"), re.compile(r"\n(?=\S)"))
# Text a piece rule must tokenize exactly as the whole: blank lines, lines of blanks, trailing blanks,
# tabs, CRLF, non-ASCII letters, digits, contractions and punctuation at either end of a line.
PIECE_CHECK_TEXT = (
    "import os\n\n\nclass Point:\n    \"\"\"A point.\"\"\"\n    x: int = 0  \n   \n\tdef __init__(self):\n"
    "\t\tself.s = 'it's'\r\n\r\n        return {\"é\": 1_000, '中文': [1, 2]}\n}\n// note: 42\n"
    "  #include <x.h>\n's x\n  \t  \nfunction f() {\n  return a ? b : c;\n};\n    \n\n    end"
)


class PieceTokens:
    """Token ids of pieces of text, kept by the piece's text (bounded, least recently used out)."""

    def __init__(self, tokenizer, max_pieces: int = 8192, max_chars: int = 8 << 20):
        self.tok = tokenizer
        self.max_pieces, self.max_chars = max_pieces, max_chars
        self._ids: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._chars = 0
        self.tokenized = 0  # pieces tokenized so far (the rest came from the kept ones)
        self._lock = threading.Lock()  # the server's worker and its idle work share one builder

    def __call__(self, pieces: Sequence[str]) -> list[tuple[int, ...]]:
        with self._lock:
            found = [self._ids.get(p) for p in pieces]
            for p, ids in zip(pieces, found):
                if ids is not None:
                    self._ids.move_to_end(p)
        missing = list(dict.fromkeys(p for p, ids in zip(pieces, found) if ids is None))
        if not missing:
            return found
        new = dict(zip(missing, (tuple(x) for x in self.tok(missing, add_special_tokens=False)["input_ids"])))
        self.tokenized += len(missing)
        with self._lock:
            for p, ids in new.items():
                if p not in self._ids:
                    self._chars += len(p)
                self._ids[p] = ids
            while len(self._ids) > self.max_pieces or self._chars > self.max_chars:
                self._chars -= len(self._ids.popitem(last=False)[0])
        return [ids if ids is not None else new[p] for p, ids in zip(pieces, found)]


def piece_rule(tokenizer) -> re.Pattern | None:
    """The first of LINE_START_RULES under which PIECE_CHECK_TEXT's pieces tokenize to the whole's ids;
    None when neither does (then prompts are tokenized whole)."""
    whole = tokenizer.encode(PIECE_CHECK_TEXT, add_special_tokens=False)
    for rule in LINE_START_RULES:
        starts = [0] + [m.end() for m in rule.finditer(PIECE_CHECK_TEXT)] + [len(PIECE_CHECK_TEXT)]
        pieces = [PIECE_CHECK_TEXT[a:b] for a, b in zip(starts, starts[1:])]
        if len(pieces) > 3 and [i for p in pieces for i in tokenizer.encode(p, add_special_tokens=False)] == whole:
            return rule
    return None


@dataclass
class PromptParts:
    ids: list[int]
    prefix_chars_dropped: int  # how much of the prefix did not fit
    suffix_chars_kept: int
    context_files: int  # how many other files made it in
    healed: str = ""  # the end of the prefix left out of ids: the completion must write it first

    def constraint(self, healing: Healing) -> Constraint | None:
        """What the first generated tokens must write (the healed text); None where nothing was healed."""
        return Constraint(healing, self.healed) if self.healed else None

    def completion_text(self, generated_text: str, ids: list[int] | None = None, healing: Healing | None = None) -> str:
        """The completion as the user sees it: the generated text without the healed text it begins with.
        Where the decoded text does not begin with it (a SentencePiece decoder drops the first blank:
        healed ` se`, tokens `▁se` `on` decode to `seon`), the healed bytes are taken off the bytes the
        tokens `ids` write."""
        text = without_healed(self.healed, generated_text)
        if generated_text.startswith(self.healed) or self.healed.startswith(generated_text) or ids is None \
                or healing is None or healing.texts is None or (written := healing.texts.written(ids)) is None:
            return text
        healed = self.healed.encode("utf-8")
        if healed.startswith(written):
            return ""  # part of it written so far
        return written[len(healed):].decode("utf-8", errors="replace") if written.startswith(healed) else text


class PromptBuilder:
    def __init__(self, tokenizer, budget: int = 1536, suffix_share: float = 0.125, max_suffix_tokens: int = 32,
                 whole_suffix: bool = False):
        self.tok = tokenizer
        self.template = detect_template(tokenizer)
        self.budget = budget
        self.suffix_share = suffix_share
        self.max_suffix_tokens = max_suffix_tokens
        self.whole_suffix = whole_suffix  # as many lines after the cursor as fit, not only its line's rest
        vocab = tokenizer.get_vocab()
        self._special = {s: vocab[s] for s in (self.template.prefix, self.template.suffix, self.template.middle,
                                               self.template.file_sep, self.template.repo_name) if s and s in vocab}
        self.pieces = PieceTokens(tokenizer)
        self.piece_rule = piece_rule(tokenizer)
        self._healing: Healing | None = None

    @property
    def healing(self) -> Healing:
        """Which end of a prefix the model writes itself, and the tokens that may (read once: ~0.2 s for
        Qwen's 151k tokens)."""
        if self._healing is None:
            self._healing = Healing(self.tok)
        return self._healing

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False) if text else []

    def suffix_budget_for(self, budget: int) -> int:
        return min(self.max_suffix_tokens, int(budget * self.suffix_share))

    @property
    def suffix_budget(self) -> int:
        return self.suffix_budget_for(self.budget)

    def _fit_prefix(self, prefix: str, budget: int) -> tuple[list[int], int]:
        """Tokens of the longest line-aligned tail of prefix that fits; the cut moves in steps."""
        if budget <= 0:
            return [], len(prefix)
        # Only a tail can fit: tokenizing a whole 10 MB file on every keystroke would not do.
        window = max(0, len(prefix) - budget * MAX_CHARS_PER_TOKEN)
        if self.piece_rule is not None:
            fitted = self._fit_prefix_by_pieces(prefix, budget, window)
            if fitted is not None:
                return fitted
        return self._fit_prefix_whole(prefix, budget, window)

    def _fit_prefix_by_pieces(self, prefix: str, budget: int, window: int) -> tuple[list[int], int] | None:
        """_fit_prefix from the ids of the prefix's lines (piece_rule's pieces), nearly all of them kept
        from the last keystroke: the same ids as tokenizing prefix[cut:] whole. None where no step line
        is in reach (the whole tail then decides a cut mid-line)."""
        starts = ([0] if window == 0 else []) + [m.end() for m in self.piece_rule.finditer(prefix, window)]
        if not starts:
            return None
        ids = self.pieces([prefix[a:b] for a, b in zip(starts, starts[1:] + [len(prefix)])])
        k, total = len(ids), 0  # the pieces from k on fit, with piece k - 1 they do not
        while k > 0 and total + len(ids[k - 1]) <= budget:
            k -= 1
            total += len(ids[k])
        if k == 0 and starts[0] == 0:
            return [i for p in ids for i in p], 0
        # The cut: the first line numbered a multiple of PREFIX_CUT_STEP from which the rest fits. It
        # cannot lie before piece k - 1 (all of that piece and the ones after would not fit).
        cut = starts[k - 1] if k > 0 else window
        if cut and prefix[cut - 1] != "\n":
            cut = prefix.find("\n", cut) + 1
            if not cut:
                return None
        line = prefix.count("\n", 0, cut)
        while cut > 0 or line == 0:
            if line % PREFIX_CUT_STEP == 0:
                j = bisect.bisect_left(starts, cut)  # the first piece from the cut on
                end = starts[j] if j < len(starts) else len(prefix)
                out = [i for p in ([self.pieces([prefix[cut:end]])[0]] if cut < end else []) + ids[j:] for i in p]
                if len(out) <= budget:
                    return out, cut
            cut = prefix.find("\n", cut) + 1
            line += 1
        return None

    def _fit_prefix_whole(self, prefix: str, budget: int, window: int) -> tuple[list[int], int]:
        tail = prefix[window:]
        enc = self.tok(tail, add_special_tokens=False, return_offsets_mapping=True)
        if window == 0 and len(enc["input_ids"]) <= budget:
            return list(enc["input_ids"]), 0
        offsets = enc["offset_mapping"]
        min_char = window + offsets[max(0, len(offsets) - budget)][0]
        # Line starts in the tail, numbered from the start of the file, so that the stepped cut
        # stays put while the user types at the end.
        before = prefix.count("\n", 0, window)
        starts = [(0, 0)] if window == 0 else []
        starts += [(window + i + 1, before + k + 1) for k, i in enumerate(j for j, ch in enumerate(tail) if ch == "\n")]
        i = bisect.bisect_left(starts, (min_char, -1))
        while i < len(starts) and starts[i][1] % PREFIX_CUT_STEP:
            i += 1
        cut = starts[i][0] if i < len(starts) else min_char  # no step line in reach: cut mid-line
        ids = self.encode(prefix[cut:])
        while len(ids) > budget:  # rare: re-tokenizing at a boundary changed the count
            nxt = prefix.find("\n", cut) + 1
            cut = nxt if nxt > 0 else len(prefix) - budget
            ids = self.encode(prefix[cut:])
        return ids, cut

    def _fit_suffix(self, suffix: str, budget: int) -> tuple[list[int], int]:
        """Tokens of the longest line-aligned head of suffix that fits (one tokenization)."""
        if budget <= 0 or not suffix:
            return [], 0
        head = suffix[:budget * MAX_CHARS_PER_TOKEN]
        enc = self.tok(head, add_special_tokens=False, return_offsets_mapping=True)
        if len(head) == len(suffix) and len(enc["input_ids"]) <= budget:
            return list(enc["input_ids"]), len(suffix)
        limit = enc["offset_mapping"][min(budget, len(enc["offset_mapping"]) - 1)][0]
        end = head.rfind("\n", 0, limit) + 1
        if end <= 0:
            return [], 0
        ids = self.encode(suffix[:end])
        while len(ids) > budget and end > 0:  # rare: token boundaries moved
            end = suffix.rfind("\n", 0, end - 1) + 1
            ids = self.encode(suffix[:end]) if end else []
        return ids, end

    def _suffix_text(self, suffix: str) -> str:
        """The rest of the cursor's line (see the layout notes), or all of it with whole_suffix."""
        return suffix if self.whole_suffix else suffix.split("\n", 1)[0]

    def build_request(self, request, heal: bool = False) -> PromptParts:
        """A decoding.api.CompletionRequest's prompt (text an editor sent made valid). heal: leave the
        end the cursor cuts out (a local model writes it: decoding/healing.py)."""
        context = [replace(f, text=valid_text(f.text)) for f in request.context]
        return self.build(valid_text(request.prefix), valid_text(request.suffix), request.path, context,
                          budget=request.context_tokens, heal=heal, repo=valid_text(request.repo),
                          reserve=request.context_reserve_tokens)

    def _healed(self, prefix: str, heal: bool) -> tuple[str, str]:
        """The prefix the prompt holds and the end of it the model must write first (decoding/healing.py)."""
        cut = self.healing.split(prefix) if heal else 0
        return (prefix[:len(prefix) - cut], prefix[len(prefix) - cut:]) if cut else (prefix, "")

    def _files_header(self, context: Sequence[ContextFile], path: str, repo: str, room: int) -> tuple[list[int], int]:
        """Other files in the family's repository format (Qwen2.5-Coder: `<|repo_name|>name`, then
        `<|file_sep|>path` and the text of each file, the current file's path last), as many whole
        files as fit in `room` tokens. Returns the ids and how many files made it in."""
        t, sp = self.template, self._special
        header = [sp[t.repo_name]] + self.encode(f"{repo}\n") if repo and t.repo_name in sp else []
        closing = [sp[t.file_sep]] + self.encode(f"{path or 'current'}\n")
        room -= len(header)  # the closing line's few tokens come out of the prompt's margin (build: - 8)
        used = 0
        # kept by text: a selection stays the same over many keystrokes (decoding/repository/selection.py)
        sections = self.pieces([f"{f.path}\n{f.text.rstrip()}\n" for f in context])
        for section in sections:
            ids = [sp[t.file_sep], *section]
            if len(ids) > room:
                continue  # a smaller file later in the list may still fit
            header += ids
            room -= len(ids)
            used += 1
        return (header + closing, used) if used else ([], 0)

    def build(self, prefix: str, suffix: str = "", path: str = "", context: Sequence[ContextFile] = (),
              budget: int | None = None, heal: bool = False, repo: str = "", reserve: int = 0) -> PromptParts:
        """reserve: tokens of the budget the context files get before the prefix (at most half of it)."""
        t, sp = self.template, self._special
        budget = budget or self.budget
        prefix, healed = self._healed(prefix, heal)
        if not t.is_fim:
            pre_ids, dropped = self._fit_prefix(prefix, budget)
            return PromptParts(pre_ids, dropped, 0, 0, healed)
        suf_ids, suf_kept = self._fit_suffix(self._suffix_text(suffix), self.suffix_budget_for(budget))
        prefix_budget = budget - len(suf_ids) - 8
        header, used_files = [], 0
        if t.file_sep and t.file_sep in sp and context:
            header, used_files = self._files_header(context, path, repo, min(reserve, prefix_budget // 2))
        pre_ids, dropped = self._fit_prefix(prefix, prefix_budget - len(header))
        if t.file_sep and t.file_sep in sp and context and not reserve:
            header, used_files = self._files_header(context, path, repo, prefix_budget - len(pre_ids))
        if t.family == "codellama":  # "<PRE> {prefix} <SUF>{suffix} <MID>"
            ids = header + [sp[t.prefix]] + self.encode(" ") + pre_ids + self.encode(" ") + [sp[t.suffix]] + suf_ids + self.encode(" ") + [sp[t.middle]]
        else:
            ids = header + [sp[t.prefix]] + pre_ids + [sp[t.suffix]] + suf_ids + [sp[t.middle]]
        return PromptParts(ids, dropped, suf_kept, used_files, healed)
