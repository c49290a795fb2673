"""Typing along a suggestion: the one rule for whether what was typed since a suggestion was made
still agrees with it, and what of it remains.

Its users: the server's type-ahead and idle work's prediction (lsp_server/typeahead.py,
lsp_server/prediction.py), a job told what the user typed (Job.expect) and the suggestion drafter,
which compares token lists the same way (the target's tokens are what was "typed" along the hint).
Pure functions of strings or sequences of tokens.
"""
from __future__ import annotations

from typing import Sequence, TypeVar

Text = TypeVar("Text", str, Sequence[int])

# Characters an editor inserts by itself while the user types along (auto-closing `(` adds `)`):
# they appear between the cursor and the old suffix without breaking the continuation.
AUTO_INSERTED = frozenset(")]}\"'`")


def agrees(text: Text, typed: Text) -> bool:
    """`text` and `typed` are the same up to the shorter one's length (either may be ahead: a
    suggestion still being generated is given the benefit of the doubt for what it has not written)."""
    n = min(len(text), len(typed))
    return text[:n] == typed[:n]


def remains(suggestion: Text, typed: Text) -> Text | None:
    """The rest of `suggestion` after `typed`, if it begins with `typed` ("" when typed to its end);
    None where the typing went another way or past its end."""
    if suggestion[:len(typed)] != typed:
        return None
    return suggestion[len(typed):]


def typed_since(old_prefix: str, old_suffix: str, prefix: str, suffix: str) -> str | None:
    """What the user typed at a cursor that had `old_prefix` before it and `old_suffix` after, if
    the document now reads `prefix + suffix` because of that typing alone (auto-closed characters
    the editor added after the cursor allowed); None otherwise."""
    if not prefix.startswith(old_prefix) or not suffix.endswith(old_suffix):
        return None
    inserted_right = suffix[: len(suffix) - len(old_suffix)]
    if any(ch not in AUTO_INSERTED for ch in inserted_right):
        return None
    return prefix[len(old_prefix):]
