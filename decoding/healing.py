"""Token healing: the end of the prefix that the next characters could still change is left out of
the prompt, and the model writes it first.

A prompt whose last token the cursor cuts ends on a token the model has hardly seen there:
- **a blank.** The tokenizer writes an indented `        self.x` as `       ` + ` self` (the last blank
  goes with the word), so a prefix that stops after the indentation ends on the token `        `,
  which in training was followed by more blanks or a line end. At a new line's indentation the model
  then indented once more: on 81 benchmark cursors at a line start (Qwen2.5-Coder-0.5B, Q4), 51 first
  lines began with extra blanks and 2 were exactly right.
- **a partial word.** After `        s` the prompt ends on ` s`, a token that in training nearly always
  ended a word. So the model ended it: on 40 statements cut 1-3 letters into their first word, 22
  suggestions began with a line break and indentation (`s` + `        self.data = ...`) and one re-typed
  the letters (`ha` + `hasjabs`).
- **punctuation.** `foo(` ends on `(`, where the tokenizer would write `(self`; `if x:` ends on `:`
  where it would write `:\\n`.

So the prompt leaves out the tokens of the prefix's last pre-tokenizer word (at most
MAX_HEALED_TOKENS of them), and generation is constrained to write exactly those characters first:
each generated token must agree with what remains of them (begin with it, or be a first part of it),
until they are written. A healed blank is the one exception: only the last blank is left out (the blanks
before it tokenize as they do in front of code), and the token that writes it must not go on with
more blanks (a second indentation). Constraining the whole run of blanks instead let greedy decoding
start on a shorter run it then could not finish naturally.

The completion's text leaves the healed characters out again, since the document has them already.
Plain and speculative decoding apply the same constraint to the same positions (every verify row whose
earlier tokens have not yet written them), so they still agree token for token; under sampling the
target's distribution is the constrained one, and rejection sampling preserves it.

What a token writes is read from the tokenizer's vocabulary as bytes (byte-level BPE: Qwen, StarCoder,
DeepSeek; SentencePiece's `▁` and `<0xNN>` byte tokens: Llama, CodeLlama; else each token decoded
alone), checked against the tokenizer's own encoding of a sample of code; a tokenizer none of these
fits is healed nowhere.
"""
from __future__ import annotations

import bisect
import logging
import threading

import torch

log = logging.getLogger(__name__)

BLANKS = " \t"
# Tokens of the last word left out at most: a long identifier's first part stays in the prompt (its
# tokens are canonical there), and the constraint never spends more than this many forwards.
MAX_HEALED_TOKENS = 4
# The end of the prefix that is tokenized to find its last word (a token never spans more).
LINE_TAIL_CHARS = 256
# Code whose encoding every vocabulary reading must reproduce byte for byte (a text the tokenizer
# itself cannot write back, such as characters outside a small vocabulary, is not asked of it).
CHECK_TEXTS = (
    "def f(self, x):\n    return {'a': x.items_list[1:], \"b\": 0x1F}  # note\n",
    "def f(self, x):\n    return {'é': x.items_list[1:], \"漢字\": 0x1F}  # note 🙂\n",
    "\tif (a != b && c) { std::vector<int> v; v.push_back(42); }\r\n",
    "  const x = await fetch(`/api/${id}`);\n\n\n        end\n",
)


def is_blank(text: str) -> bool:
    return bool(text) and not text.strip(BLANKS)


def _gpt2_byte_chars() -> dict[str, int]:
    """Byte-level BPE's alphabet: the printable character that stands for each byte (GPT-2's table)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def _byte_level(vocab: dict[str, int], tokenizer) -> dict[int, bytes]:
    table = str.maketrans({c: chr(b) for c, b in _gpt2_byte_chars().items()})
    out = {}
    for raw, i in vocab.items():
        try:
            out[i] = raw.translate(table).encode("latin-1")
        except UnicodeEncodeError:  # a character outside the byte alphabet: not a byte-level token
            pass
    return out


def _sentencepiece(vocab: dict[str, int], tokenizer) -> dict[int, bytes]:
    out = {}
    for raw, i in vocab.items():
        if len(raw) == 6 and raw.startswith("<0x") and raw.endswith(">"):
            try:
                out[i] = bytes([int(raw[3:5], 16)])
            except ValueError:
                pass
        else:
            out[i] = raw.replace("▁", " ").encode("utf-8")
    return out


def _decoded(vocab: dict[str, int], tokenizer) -> dict[int, bytes]:
    """Each token decoded alone; one that decodes to part of a character writes nothing we can name."""
    ids = sorted(vocab.values())
    texts = tokenizer.batch_decode([[i] for i in ids], clean_up_tokenization_spaces=False)
    return {i: t.encode("utf-8") for i, t in zip(ids, texts) if "\ufffd" not in t}


def _unknown_id(tokenizer) -> int | None:
    unknown = getattr(tokenizer, "unk_token_id", None)
    if unknown is None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        name = getattr(getattr(backend, "model", None), "unk_token", None)
        unknown = backend.token_to_id(name) if name else None
    return unknown


def _writes_the_check_texts(tokenizer, of: dict[int, bytes]) -> bool:
    checked, unknown = 0, _unknown_id(tokenizer)
    for text in CHECK_TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        if unknown is not None and unknown in ids:
            continue
        checked += 1
        if any(i not in of for i in ids):
            return False
        written = b"".join(of[i] for i in ids)
        # SentencePiece puts a blank before the first word of a text (its `▁`)
        if written != text.encode("utf-8") and written != b" " + text.encode("utf-8"):
            return False
    return checked > 0


class TokenBytes:
    """What each token writes, as bytes, and which tokens begin with given bytes."""

    def __init__(self, of: dict[int, bytes]):
        self.of = of
        pairs = sorted((b, i) for i, b in of.items() if b)
        self._keys = [b for b, _ in pairs]
        self._ids = [i for _, i in pairs]

    @classmethod
    def read(cls, tokenizer) -> "TokenBytes | None":
        """The first reading of the vocabulary that reproduces the tokenizer's encoding of CHECK_TEXTS;
        None where none does. Added (special) tokens write nothing here: they never heal."""
        vocab = dict(tokenizer.get_vocab())
        backend = getattr(tokenizer, "backend_tokenizer", None)
        added = backend.get_added_tokens_decoder() if backend is not None else {}
        for i in list(added) + list(getattr(tokenizer, "all_special_ids", ()) or ()):
            vocab.pop(added[i].content if i in added else tokenizer.convert_ids_to_tokens(i), None)
        for reading in (_byte_level, _sentencepiece, _decoded):
            of = reading(vocab, tokenizer)
            if _writes_the_check_texts(tokenizer, of):
                return cls(of)
        return None

    def starting_with(self, head: bytes) -> list[int]:
        out, j = [], bisect.bisect_left(self._keys, head)
        while j < len(self._keys) and self._keys[j].startswith(head):
            out.append(self._ids[j])
            j += 1
        return out

    def extends(self, head: bytes) -> bool:
        """Whether some token writes `head` and more."""
        j = bisect.bisect_left(self._keys, head)
        while j < len(self._keys) and self._keys[j] == head:
            j += 1
        return j < len(self._keys) and self._keys[j].startswith(head)

    def equal_to(self, text: bytes) -> list[int]:
        out, j = [], bisect.bisect_left(self._keys, text)
        while j < len(self._keys) and self._keys[j] == text:
            out.append(self._ids[j])
            j += 1
        return out

    def written(self, ids, limit: int | None = None) -> bytes | None:
        """The bytes `ids` write, stopping once `limit` bytes are written; None at a token that writes
        nothing we can name (a special token)."""
        out = b""
        for i in ids:
            if limit is not None and len(out) >= limit:
                break
            b = self.of.get(i)
            if b is None:
                return None
            out += b
        return out


class Healing:
    """For one tokenizer: which end of a prefix the model writes itself, and the tokens that may."""

    def __init__(self, tokenizer, vocab_size: int | None = None):
        self.tok = tokenizer
        self.vocab_size = vocab_size or len(tokenizer)  # the masks' width (limited() fits other widths)
        self.texts = TokenBytes.read(tokenizer)
        if self.texts is None:
            log.warning("token healing off: no reading of this tokenizer's vocabulary writes its own encoding back")
        self._masks: dict[bytes, torch.Tensor] = {}
        self._lock = threading.Lock()  # the model thread and idle work's prompt building share it

    def split(self, prefix: str) -> int:
        """How many characters at the end of `prefix` the model writes itself (0: none): its last blank,
        or the tokens of its last word (decoding/healing.py explains both)."""
        if not prefix or self.texts is None:
            return 0
        if prefix[-1] in BLANKS:
            return 1
        # The end of the prefix tokenized in its context (a SentencePiece normalizer writes a line's
        # first word differently at the start of a text), the healed word taken from the cursor's line.
        tail = prefix[-LINE_TAIL_CHARS:]
        line_start = max(tail.rfind("\n"), tail.rfind("\r")) + 1
        backend = getattr(self.tok, "backend_tokenizer", None)
        if line_start == len(tail) or backend is None:
            return 0
        enc = backend.encode(tail, add_special_tokens=False)
        ids, words, offsets = enc.ids, enc.word_ids, enc.offsets
        if not ids or words[-1] is None or offsets[-1][0] < line_start:
            return 0
        first = len(ids) - 1
        while first > 0 and len(ids) - first < MAX_HEALED_TOKENS and offsets[first - 1][0] >= line_start \
                and self._same_word(backend, ids, words, first):
            first -= 1
        healed = tail[offsets[first][0]:]
        written = healed.encode("utf-8")
        # Offsets that do not match the text (a normalizer), or a vocabulary reading that does not
        # write these tokens, heal nothing: the constraint must be one the natural tokens satisfy. Nor
        # does one token that no other goes on from (a digit: `2`): the model could only write it
        # back, a forward spent for nothing.
        if not healed.strip(BLANKS) or self.texts.written(ids[first:]) != written or \
                (first == len(ids) - 1 and not self.texts.extends(written)):
            return 0
        return len(healed)

    def _same_word(self, backend, ids: list[int], words: list, i: int) -> bool:
        """Whether token i - 1 belongs to the last word with token i: the pre-tokenizer's words, or where
        there is none (SentencePiece splits nothing before its model), until a token that starts with a
        blank (`▁name`)."""
        if backend.pre_tokenizer is not None:
            return words[i - 1] == words[-1]
        return not self.texts.of.get(ids[i], b" ")[:1].isspace()

    def allowed(self, remaining: bytes) -> torch.Tensor:
        """[vocab] bool: the tokens that may come next while `remaining` is left to write. Blanks: the
        tokens that begin with exactly them (` return`, ` (`, the blank alone), never a longer run.
        Anything else: the tokens that begin with all of it, or write a first part of it (a small
        vocabulary writes ` char` as ` ` + `char`)."""
        with self._lock:
            mask = self._masks.get(remaining)
            if mask is not None:
                return mask
        texts, n = self.texts, len(remaining)
        if not remaining.strip(b" \t"):
            ids = [i for i in texts.starting_with(remaining) if len(texts.of[i]) == n or texts.of[i][n] not in b" \t"]
        else:
            ids = texts.starting_with(remaining)
            ids += [i for k in range(1, n) for i in texts.equal_to(remaining[:k])]
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        mask[[i for i in ids if i < self.vocab_size]] = True
        with self._lock:
            if len(self._masks) > 512:
                self._masks.clear()
            self._masks[remaining] = mask
        return mask


def limited(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """[..., V] logits with the tokens `allowed` rules out at -inf (a draft model's table may be
    padded to another width than the target's: columns past the mask are ruled out)."""
    width = logits.shape[-1]
    mask = allowed[:width] if len(allowed) >= width else torch.cat([allowed, allowed.new_zeros(width - len(allowed))])
    return logits.masked_fill(~mask.to(logits.device), float("-inf"))


def without_healed(healed: str, text: str) -> str:
    """The completion's text: the generated text minus the healed characters it begins with ("" while
    it has written only part of them)."""
    if text.startswith(healed):
        return text[len(healed):]
    return "" if healed.startswith(text) else text


class Constraint:
    """One request's healing: the generated tokens must first write exactly `healed`."""

    def __init__(self, healing: Healing, healed: str, before: tuple[int, ...] = ()):
        self.healing, self.healed = healing, healed
        self._bytes = healed.encode("utf-8")
        self._before = before  # tokens generated ahead of those allowed() is given (after())

    def allowed(self, generated: list[int]) -> torch.Tensor | None:
        """[vocab] bool for the next token after `generated` (the tokens since the prompt); None once
        the healed characters are written, or where `generated` already broke the constraint (a
        rejected draft's later rows, which no one reads)."""
        written = self.healing.texts.written([*self._before, *generated], limit=len(self._bytes))
        if written is None or len(written) >= len(self._bytes) or not self._bytes.startswith(written):
            return None
        return self.healing.allowed(self._bytes[len(written):])

    def after(self, tokens: list[int]) -> "Constraint":
        """The same constraint for generation that continues after `tokens` (an alternative's first)."""
        return Constraint(self.healing, self.healed, (*self._before, *tokens))

    def limit_rows(self, logits: torch.Tensor, generated: list[int], drafted: list[int]) -> None:
        """Rules out, in place, what each row of a verify forward may not be: row i follows `generated`
        and the first i drafted tokens."""
        for i in range(logits.shape[0]):
            allowed = self.allowed(generated + drafted[:i])
            if allowed is None:
                return
            logits[i] = limited(logits[i], allowed)
