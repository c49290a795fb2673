"""The suggestions shown per document — the one memory of them — and what it is used for:

- type-ahead: while the user types the characters of the suggestion on screen, the next request is
  answered from that suggestion at once instead of waiting for the model;
- the draft hint: the rest of a shown suggestion that the user's prefix runs along is passed to the
  engine with the request, and its suggestion drafter proposes it (verified in one forward).

The engine is still asked; its answer replaces the remembered suggestion for the keystrokes after.
Whether the typing agrees with a suggestion, and what of it remains, is decoding/agreement.py's rule.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from decoding.agreement import remains, typed_since


@dataclass(frozen=True)
class ShownSuggestion:
    prefix: str  # document text before the cursor when the suggestion was shown
    suffix: str  # document text after the cursor then
    text: str  # the inserted text that was shown
    prefetched: bool = False  # computed in idle time for after the shown one, not shown itself


class TypeAheadMemory:
    def __init__(self, max_documents: int = 64, per_document: int = 4) -> None:
        self._shown: OrderedDict[str, deque[ShownSuggestion]] = OrderedDict()
        self._max = max_documents
        self._per_document = per_document

    def remember(self, document: str, prefix: str, suffix: str, text: str, prefetched: bool = False) -> None:
        entries = self._shown.setdefault(document, deque(maxlen=self._per_document))
        entries.append(ShownSuggestion(prefix, suffix, text, prefetched))
        self._shown.move_to_end(document)
        while len(self._shown) > self._max:
            self._shown.popitem(last=False)

    def forget(self, document: str) -> None:
        self._shown.pop(document, None)

    def draft_hint(self, document: str, prefix: str) -> str:
        """The rest of a recent suggestion that `prefix` runs part-way along (typed into it, or deleted
        back into it), or ''. Looser than `continuation`: a wrong hint only costs a forward."""
        for entry in reversed(self._shown.get(document, ())):
            whole = entry.prefix + entry.text
            # The new prefix must share everything up to the old cursor's line and lie along `whole`.
            cut = entry.prefix.rfind("\n") + 1
            if len(prefix) >= cut and prefix[:cut] == entry.prefix[:cut]:
                rest = remains(whole, prefix)
                if rest:
                    return rest
        return ""

    def continuation(self, document: str, prefix: str, suffix: str) -> str | None:
        """The rest of the shown suggestion if the document now reads `prefix + suffix` because the
        user typed its first characters (or typed nothing and asks again); None otherwise."""
        # The latest shown suggestion, and prefetches made after it (older suggestions were replaced
        # on screen: typing along one of them is for the draft hint, not for an instant answer).
        for shown in reversed(self._shown.get(document, ())):
            rest = _rest_after_typing(shown, prefix, suffix)
            if rest is not None:
                return rest
            if not shown.prefetched:
                return None
        return None


def _rest_after_typing(shown: ShownSuggestion, prefix: str, suffix: str) -> str | None:
    typed = typed_since(shown.prefix, shown.suffix, prefix, suffix)
    rest = remains(shown.text, typed) if typed is not None else None
    return rest or None  # typed to its end: nothing left to show
