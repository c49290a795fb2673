"""The suggestion drafter: the user is typing what we suggested a moment ago.

The engine remembers recent completions per document. When a new request's prefix runs along an
earlier suggestion (the user typed some of it, or deleted back into it), the rest of that suggestion
is proposed as a draft. The target verifies it like any other draft, so a stale or wrong memory costs
one forward and never changes the output.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from decoding.drafters.base import Draft, DraftContext, Drafter


@dataclass
class Remembered:
    prefix: str
    suffix: str
    text: str


class SuggestionMemory:
    def __init__(self, per_document: int = 4, documents: int = 64):
        self._docs: OrderedDict[str, deque[Remembered]] = OrderedDict()
        self.per_document = per_document
        self.documents = documents

    def remember(self, document: str, prefix: str, suffix: str, text: str) -> None:
        if not text.strip():
            return
        entries = self._docs.setdefault(document, deque(maxlen=self.per_document))
        entries.append(Remembered(prefix, suffix, text))
        self._docs.move_to_end(document)
        while len(self._docs) > self.documents:
            self._docs.popitem(last=False)

    def continuation(self, document: str, prefix: str) -> str:
        """The rest of a remembered suggestion that this prefix is part-way along, or ''."""
        for entry in reversed(self._docs.get(document, ())):
            whole = entry.prefix + entry.text
            # The new prefix must share everything up to the old cursor's line and lie along `whole`.
            cut = entry.prefix.rfind("\n") + 1
            if len(prefix) >= cut and whole.startswith(prefix) and prefix[:cut] == entry.prefix[:cut]:
                rest = whole[len(prefix):]
                if rest:
                    return rest
        return ""


class SuggestionDrafter(Drafter):
    name = "suggestion"

    def __init__(self, memory: SuggestionMemory, tokenizer):
        self.memory = memory
        self.tok = tokenizer
        self._draft: list[int] = []
        self._prompt_len = 0

    def begin(self, ctx: DraftContext) -> None:
        rest = self.memory.continuation(ctx.document, ctx.prefix)
        self._draft = self.tok.encode(rest, add_special_tokens=False) if rest else []
        self._prompt_len = len(ctx.prompt_ids)

    def _remaining(self, seq: list[int]) -> list[int]:
        generated = seq[self._prompt_len:]
        if self._draft[:len(generated)] != generated:
            return []  # the target went another way; the memory no longer applies
        return self._draft[len(generated):]

    def available(self, seq: list[int]) -> int:
        return len(self._remaining(seq)) if self._draft else 0

    def propose(self, seq: list[int], k: int) -> Draft | None:
        rest = self._remaining(seq)[:k] if self._draft else []
        return Draft(rest, self.name, key="suggestion") if rest else None

    def end(self, failed: bool = False) -> None:
        self._draft = []
