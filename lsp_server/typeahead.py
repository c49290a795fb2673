"""Type-ahead: while the user types the characters of the suggestion on screen, the next request is
answered from that suggestion at once instead of waiting for the model.

The engine is still asked (its suggestion drafter verifies the rest of the suggestion in one forward,
and its memory and stats stay right); its answer replaces the remembered suggestion for the keystrokes
after. This module only decides whether a request continues a shown suggestion.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

# Characters an editor inserts by itself while the user types along (auto-closing `(` adds `)`):
# they appear between the cursor and the old suffix without breaking the continuation.
AUTO_INSERTED = frozenset(")]}\"'`")


@dataclass(frozen=True)
class ShownSuggestion:
    prefix: str  # document text before the cursor when the suggestion was shown
    suffix: str  # document text after the cursor then
    text: str  # the inserted text that was shown


class TypeAheadMemory:
    def __init__(self, max_documents: int = 64) -> None:
        self._shown: OrderedDict[str, ShownSuggestion] = OrderedDict()
        self._max = max_documents

    def remember(self, document: str, prefix: str, suffix: str, text: str) -> None:
        self._shown[document] = ShownSuggestion(prefix, suffix, text)
        self._shown.move_to_end(document)
        while len(self._shown) > self._max:
            self._shown.popitem(last=False)

    def forget(self, document: str) -> None:
        self._shown.pop(document, None)

    def shown(self, document: str) -> ShownSuggestion | None:
        return self._shown.get(document)

    def continuation(self, document: str, prefix: str, suffix: str) -> str | None:
        """The rest of the shown suggestion if the document now reads `prefix + suffix` because the
        user typed its first characters (or typed nothing and asks again); None otherwise."""
        shown = self._shown.get(document)
        if shown is None or not prefix.startswith(shown.prefix):
            return None
        typed = prefix[len(shown.prefix):]
        if not shown.text.startswith(typed) or len(typed) >= len(shown.text):
            return None
        if not suffix.endswith(shown.suffix):
            return None
        inserted_right = suffix[: len(suffix) - len(shown.suffix)]
        if any(ch not in AUTO_INSERTED for ch in inserted_right):
            return None
        return shown.text[len(typed):]
