"""How a line of code reads, with its language's facts (decoding/languages.py): where a trailing comment
starts, whether a string or comment spanning lines is still open at its end, whether the line opens a
block or only closes one. Shallow by design: code being completed is incomplete, and these answers
decide only where a completion ends (decoding/stop_rules.py)."""
from __future__ import annotations

import functools
import re

from decoding.languages import LanguageFacts


def lexer(facts: LanguageFacts) -> "LineLexer":
    """The language's line lexer (built once per language)."""
    return _lexer_for(facts)


def code_part(facts: LanguageFacts, line: str, region: int | None = None) -> str:
    """The line without its trailing comment, right-stripped; `region` is the open multi-line
    region (index into `regions`) the line starts in, if any."""
    _, comment_at = lexer(facts).scan(line, region)
    return (line if comment_at is None else line[:comment_at]).rstrip()


def opens_block(facts: LanguageFacts, line: str, region: int | None = None) -> bool:
    """Whether the lines after this one form its body (deeper indentation)."""
    code = code_part(facts, line, region)
    if not code:
        return False
    if code[-1] in "{([":
        return True
    pattern = _compiled(facts.opener_pattern)
    return bool(pattern and pattern.search(code))


def closing_line_status(facts: LanguageFacts, stripped: str) -> tuple[str, int, int]:
    """Whether a line (from its first non-blank character, without the newline) is a line that
    only closes blocks: `}`, `});`, `end)`, `fi`, `until x > 3`.

    Returns (status, index, closing): status "closer" when it is one as written, "maybe" when
    what is there can still become one (e.g. "en"), "no" otherwise, with `index` the first
    character that rules it out (-1 unless "no") and `closing` the length of the closing tokens
    before it (`} else {` -> 2). Deciding at the earliest character keeps the stop rules
    monotone.
    """
    n = len(stripped)
    p = 0
    while p < n:
        c = stripped[p]
        if c in ")]}":
            p += 1
            continue
        if p > 0 and c in " \t;,\r":
            p += 1
            continue
        divergences = []
        for keyword in facts.close_keywords + facts.close_keywords_with_tail:
            common = _common_prefix_length(stripped, p, keyword)
            if common == len(keyword):
                end = p + common
                if end == n:
                    return "closer", -1, n
                if stripped[end].isalnum() or stripped[end] == "_":
                    divergences.append(end)
                    continue
                if keyword in facts.close_keywords_with_tail:
                    return "closer", -1, n  # the rest of the line is the keyword's argument
                p = end
                break
            if p + common == n:
                return "maybe", -1, p
            divergences.append(p + common)
        else:
            return "no", max(divergences, default=p), p
    return ("closer", -1, n) if n else ("maybe", -1, 0)


def starts_with_closer(facts: LanguageFacts, stripped: str) -> bool:
    """Whether a line (left-stripped) begins by closing a block: `}`, `) {`, `end`, `fi;`."""
    if not stripped:
        return False
    if stripped[0] in ")]}":
        return True
    for keyword in facts.close_keywords + facts.close_keywords_with_tail:
        if stripped.startswith(keyword):
            rest = stripped[len(keyword):]
            if not rest or not (rest[0].isalnum() or rest[0] == "_"):
                return True
    return False


def _common_prefix_length(text: str, start: int, word: str) -> int:
    limit = min(len(word), len(text) - start)
    i = 0
    while i < limit and text[start + i] == word[i]:
        i += 1
    return i


@functools.lru_cache(maxsize=None)
def _compiled(pattern: str) -> re.Pattern | None:
    return re.compile(pattern) if pattern else None


class LineLexer:
    """Finds, per line, where a trailing comment starts and whether a multi-line string or comment
    is still open at the end of the line. It skips single-line strings so that `"#"` or `"/*"`
    inside them are not taken for comments; it does not try to be a full tokenizer."""

    def __init__(self, facts: LanguageFacts) -> None:
        self.facts = facts
        tokens: dict[str, tuple[str, int | str | None]] = {}
        for index, region in enumerate(facts.regions):
            tokens[region.open] = ("region", index)
        for prefix in facts.line_comments:
            tokens.setdefault(prefix, ("comment", None))
        for quote in facts.quotes:
            tokens.setdefault(quote, ("quote", quote))
        self._tokens = tokens
        alternatives = []
        for token in sorted(tokens, key=len, reverse=True):  # longest first: `"""` before `"`
            fragment = re.escape(token)
            if tokens[token][0] == "comment" and facts.comment_needs_space:
                fragment = r"(?:(?<=\s)|^)" + fragment
            alternatives.append(fragment)
        self._open = re.compile("|".join(alternatives)) if alternatives else None
        self._close = [
            re.compile(
                (r"(?:\\.|[^\\])*?" if region.escapes else r".*?") + re.escape(region.close),
                re.DOTALL,
            )
            for region in facts.regions
        ]
        self._quote_end = {
            quote: re.compile(r"(?:\\.|[^\\%s])*%s" % (re.escape(quote), re.escape(quote)))
            for quote in facts.quotes
        }

    def scan(self, line: str, region: int | None = None) -> tuple[int | None, int | None]:
        """Lex one line (no newline) starting inside `region` (or in code when None).

        Returns (region still open at the end of the line or None, index where a line comment
        starts or None)."""
        pos = 0
        if region is not None:
            match = self._close[region].match(line, 0)
            if match is None:
                return region, None
            pos = match.end()
        if self._open is None:
            return None, None
        while True:
            match = self._open.search(line, pos)
            if match is None:
                return None, None
            kind, value = self._tokens[match.group()]
            if kind == "comment":
                return None, match.start()
            if kind == "quote":
                end = self._quote_end[value].match(line, match.end())
                if end is None:  # unterminated: a single-line string ends with its line
                    return None, None
                pos = end.end()
            else:
                end = self._close[value].match(line, match.end())
                if end is None:
                    return value, None
                pos = end.end()

    def region_is_comment(self, region: int | None) -> bool:
        return region is not None and self.facts.regions[region].comment


_LEXERS: dict[int, tuple[LanguageFacts, LineLexer]] = {}


def _lexer_for(facts: LanguageFacts) -> LineLexer:
    """Keyed by the facts' identity, which the entry keeps alive: hashing a frozen LanguageFacts
    hashes every field, on every line of a request's plan."""
    kept = _LEXERS.get(id(facts))
    if kept is None or kept[0] is not facts:
        kept = _LEXERS[id(facts)] = (facts, LineLexer(facts))
    return kept[1]
