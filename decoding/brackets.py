"""Brackets, quotes and what editors auto-close, for both ends of a completion: the stop rules
(where the model's text ends) and the shaping of that text into an editor's edit (lsp_server).
"""
from __future__ import annotations

import re

OPENERS = {"(": ")", "[": "]", "{": "}"}
CLOSERS = frozenset(OPENERS.values())
QUOTES = frozenset("\"'`")
# What editors auto-close, plus punctuation that commonly follows it (`foo(|);`, `["|"],`): with only
# these right of the cursor, the cursor is not "mid-line" and a multi-line completion still fits.
_ONLY_CLOSERS = re.compile(r"^[\s)\]}\"'`;,:]*$")


def only_closers(text: str) -> bool:
    """Whether text (right of the cursor) holds nothing but auto-closed characters and blanks."""
    return _ONLY_CLOSERS.match(text) is not None


def scan_brackets(text: str, quote_at_start: str | None = None,
                  quotes: frozenset[str] = QUOTES) -> tuple[list[str], list[str]]:
    """(closers in text of brackets and quotes opened before it, in order; openers of text's own
    brackets still open at its end). A closer that does not match the innermost open bracket is
    ignored. Inside a quote (`quote_at_start`: one open before text) brackets do not count; pass
    `quotes=frozenset()` to count them everywhere."""
    closes: list[str] = []
    stack: list[str] = []
    quote = quote_at_start
    inside_outer_string = quote_at_start is not None
    escaped = False
    for ch in text:
        if quote is not None:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                if inside_outer_string:
                    closes.append(ch)
                    inside_outer_string = False
                quote = None
            continue
        if ch in quotes:
            quote = ch
        elif ch in OPENERS:
            stack.append(ch)
        elif ch in CLOSERS:
            if stack and OPENERS[stack[-1]] == ch:
                stack.pop()
            elif not stack:
                closes.append(ch)
    return closes, stack
