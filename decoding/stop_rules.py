"""Where a code completion ends.

A completion model does not know when to stop: with fill-in-the-middle it often writes the rest of
the file, repeats what follows the cursor, or carries on into the next function. After every decode
step the engine asks `StopRules.check(all_generated_text)` whether (and where) the completion ends.
The rules, and why each exists:

- Scope. `resolve_scope` decides from the cursor how much the user wants. Mid-line with real text
  to the right, only the rest of this line fits ("line"). At the end of a line that opens a block
  (`def f():`, `if (x) {`, `for i = 1, n do`), on the line after one, or anywhere inside a body,
  the user wants that block ("block"). At top level at the end of the file there is no block to
  finish, so the model may write a whole unit ("full").
- Line scope stops at the first newline after real content: a suggestion inserted mid-line must not
  push the text right of the cursor onto another line.
- Block scope stops before the first generated line indented less than the cursor's block (decided
  at that line's first non-blank character): that line belongs to the enclosing code, which the
  model should not rewrite. When the cursor ends an opener line (or sits on a blank line after
  one), the body is anything deeper than the opener. A closing line at the parent's indentation
  (`}`, `end`, `fi`) also ends the block; it is kept only when the document does not close the
  block itself (no closer at that indentation after the cursor), so the result is balanced either
  way; of `} else {` only the `}` is kept. Trailing blank lines and spaces are dropped.
- Top-level stop strings (`\\ndef `, `\\nfunc `, `\\nexport `, ...) at column 0 end the completion
  in every scope: a new top-level definition is a new unit the user did not ask for. They only fire
  once the completion has content (a decorator or comment typed before the cursor is followed by
  the very definition the user wants), and the cut moves back over the comments and decorators
  directly above the new definition, which belong to it.
- Suffix overlap: models often regenerate the text after the cursor. When a complete generated
  line equals the suffix's first non-blank line (with the same indentation; short lines only when
  they are closing brackets), or the first generated line ends with exactly the rest of the
  cursor's line (`foo(|)` -> `bar(1))`), the completion stops there and the repeated text is trimmed
  so the document does not end up with it twice. The rest-of-line overlap is not trimmed when the
  generated line needs it to close its own bracket (`foo(|)` -> `bar(1)` then a newline).

When the model ends its sequence by itself, `finish(text)` applies the same rules with the last
line taken as complete (a final `bar())` still loses the repeated `)`) and drops trailing blanks.

The one cut that keeps trailing whitespace: with the cursor in the leading blanks of a non-blank
line, a completion that ends by rewriting that line keeps the newline and the line's indentation
before it, because the existing line follows the inserted text.

Monotone by construction: each rule fires at a *trigger* position (after the character that decides
it) with a *cut* at or before it, and both depend only on the text up to the trigger. `check`
returns the cut of the earliest trigger (the smallest cut among triggers at the same position); a
rule decided later never moves an earlier decision back, so for any text T where `check(T) == K`,
every extension T + X gives K as well. Speculative decoding (several tokens per step) therefore
stops exactly where plain decoding (one token per step) does.
`check` keeps its scan state between calls, so a call costs only the text added since the last one.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from decoding.brackets import CLOSERS, OPENERS, only_closers, scan_brackets
from decoding import code_lines
from decoding.languages import LanguageFacts, facts_for, language_from_path, normalize_language

SCOPES = ("line", "block", "full")
TAB_WIDTH = 4

_LEADING_BLANKS = re.compile(r"[ \t]*")
# How much of the prefix is read to find the cursor's block and open strings/comments.
_PREFIX_TAIL_CHARS = 64_000
# The suffix is only read for its first few lines.
_SUFFIX_HEAD_CHARS = 16_000


def _columns(whitespace: str, tab_width: int = TAB_WIDTH) -> int:
    return len(whitespace.expandtabs(tab_width))


def _indent_of(line: str, tab_width: int = TAB_WIDTH) -> int:
    return _columns(_LEADING_BLANKS.match(line).group(), tab_width)


@dataclass(frozen=True)
class _CursorContext:
    line_prefix: str  # the cursor's line, up to the cursor
    line_region: int | None  # multi-line string/comment open at the start of the cursor's line
    rest: str  # the cursor's line, after the cursor
    after_opener: bool
    min_indent: int  # generated lines indented less than this leave the block
    parent_indent: int | None  # indentation of the line that encloses the block


def _cursor_context(
    prefix: str, suffix: str, facts: LanguageFacts, tab_width: int
) -> _CursorContext:
    lines, regions = _prefix_lines(prefix, facts)
    last = len(lines) - 1
    line_prefix, region = lines[last], regions[last]
    rest = suffix.split("\n", 1)[0]
    if line_prefix.strip():
        indent = _indent_of(line_prefix, tab_width)
        if code_lines.opens_block(facts, line_prefix, region):
            return _CursorContext(line_prefix, region, rest, True, indent + 1, indent)
        parent = _enclosing_indent(lines, regions, last, indent, tab_width)
        return _CursorContext(line_prefix, region, rest, False, indent, parent)
    previous = next((i for i in range(last - 1, -1, -1) if lines[i].strip()), None)
    if previous is not None and code_lines.opens_block(facts, lines[previous], regions[previous]):
        indent = _indent_of(lines[previous], tab_width)
        return _CursorContext(line_prefix, region, rest, True, indent + 1, indent)
    min_indent = _blank_line_min_indent(lines, previous, rest, suffix, facts, tab_width)
    parent = _enclosing_indent(lines, regions, last, min_indent, tab_width) if min_indent else None
    return _CursorContext(line_prefix, region, rest, False, min_indent, parent)


def _prefix_lines(prefix: str, facts: LanguageFacts) -> tuple[list[str], list[int | None]]:
    """The prefix's last lines (the cursor's line last), with the multi-line string or comment open
    at the start of each."""
    tail = prefix[-_PREFIX_TAIL_CHARS:]
    lines = tail.split("\n")
    if len(tail) < len(prefix):
        lines = lines[1:] or [""]  # the first piece is a partial line
    lexer = code_lines.lexer(facts)
    regions: list[int | None] = []
    region: int | None = None
    for line in lines:
        regions.append(region)
        region, _ = lexer.scan(line, region)
    return lines, regions


def _enclosing_indent(
    lines: list[str], regions: list[int | None], before: int, below: int, tab_width: int
) -> int | None:
    """Indentation of the nearest code line above line `before` that is indented less than `below`."""
    for index in range(before - 1, -1, -1):
        line = lines[index]
        if line.strip() and regions[index] is None:
            indent = _indent_of(line, tab_width)
            if indent < below:
                return indent
    return None


def _blank_line_min_indent(
    lines: list[str], previous: int | None, rest: str, suffix: str, facts: LanguageFacts,
    tab_width: int,
) -> int:
    """The block's indentation for a cursor on a blank line that does not follow an opener."""
    line_prefix = lines[-1]
    if line_prefix:  # the editor (or the user) put the cursor at this indentation
        return _columns(line_prefix, tab_width)
    if previous is None:
        return 0
    # An empty line at column 0: editors strip whitespace from blank lines, so the cursor is inside
    # the body when the code on both sides of it is (a closing line after it ends the body the
    # cursor is in).
    following = rest if rest.strip() else _first_nonblank_line(suffix.split("\n")[1:])
    if following is None:
        return 0
    min_indent = _indent_of(lines[previous], tab_width)
    if not code_lines.starts_with_closer(facts, following.strip()):
        min_indent = min(min_indent, _indent_of(following, tab_width))
    return min_indent


def _first_nonblank_line(lines: list[str]) -> str | None:
    return next((line for line in lines if line.strip()), None)


def resolve_scope(prefix: str, suffix: str, language: str, requested: str = "auto") -> str:
    """How much to complete at this cursor: "line", "block" or "full" (see the module docstring).
    `requested` other than "auto" is returned as is."""
    if requested != "auto":
        if requested not in SCOPES:
            raise ValueError(f"unknown scope {requested!r}; expected auto, line, block or full")
        return requested
    facts = facts_for(language)
    context = _cursor_context(prefix, suffix[:_SUFFIX_HEAD_CHARS], facts, TAB_WIDTH)
    return _auto_scope(context, suffix)


def _auto_scope(context: _CursorContext, suffix: str) -> str:
    if context.line_prefix.strip() and not only_closers(context.rest):
        return "line"
    if context.after_opener:
        return "block"
    if context.min_indent == 0 and not suffix.strip():
        return "full"
    return "block"


def _document_closes_block(
    context: _CursorContext, rest: str, later_lines: list[str], facts: LanguageFacts, tab_width: int
) -> bool:
    """Whether a closer at the parent's indentation follows the cursor (or starts the rest of its
    line): then a closing line the model writes would close the block twice."""
    if code_lines.starts_with_closer(facts, rest):
        return True
    below = next(
        (line for line in later_lines
         if line.strip() and _indent_of(line, tab_width) < context.min_indent),
        None,
    )
    return (
        below is not None
        and _indent_of(below, tab_width) == context.parent_indent
        and code_lines.starts_with_closer(facts, below.strip())
    )


def _repeat_to_watch(
    rest: str, later_lines: list[str], line_above_rest: bool, facts: LanguageFacts, tab_width: int
) -> tuple[str | None, int | None]:
    """(the suffix's line whose repetition ends the completion, stripped; its indentation when it
    must match too), or (None, None) when no line is worth matching."""
    if not only_closers(rest):
        if len(re.sub(r"\s", "", rest)) >= 3 and not line_above_rest:
            return rest, None
        return None, None
    # Only closers right of the cursor: the repeat to watch for is the next line.
    following = _first_nonblank_line(later_lines)
    if following is None:
        return None, None
    stripped = following.strip()
    if len(re.sub(r"\s", "", stripped)) >= 3 or code_lines.closing_line_status(facts, stripped)[0] == "closer":
        return stripped, _indent_of(following, tab_width)
    return None, None


def _top_level_stop_pattern(facts: LanguageFacts) -> re.Pattern | None:
    stops = [stop[1:] for stop in facts.top_level_stops]
    if not stops:
        return None
    # Shortest first: the trigger is the earliest point where some stop string is complete.
    return re.compile("|".join(re.escape(s) for s in sorted(stops, key=len)))


_Trigger = tuple[int, int, bool]  # (trigger, cut, strip): see StopRules._triggers


@dataclass(frozen=True)
class _ScanState:
    """What the scan knows at the start of a generated line."""

    index: int  # line number within the generated text (0: the rest of the cursor's line)
    start: int  # offset of the line in the generated text
    region: int | None  # multi-line string/comment open at the start of the line
    seen_content: bool  # some earlier generated line has non-blank text
    run_start: int | None  # start of the comments/decorators directly above this line


@dataclass
class StopRules:
    """Stop rules for one request. `check` is called with all the text generated so far."""

    language: str
    scope: str  # "line" | "block" | "full"
    facts: LanguageFacts
    min_indent: int  # block scope: generated lines indented less than this end the block
    parent_indent: int | None  # indentation of the enclosing line (where its closer would sit)
    keep_closing_line: bool  # the document does not close the block: keep a generated closer
    cursor_line_prefix: str
    cursor_line_region: int | None
    rest_of_line: str  # the suffix's text on the cursor's line, stripped ("" if blank)
    rest_line: str | None  # the cursor's whole line when the cursor is in its leading blanks
    suffix_line: str | None  # the suffix's first non-blank line, stripped, if worth matching
    suffix_line_indent: int | None  # its indentation, when it must match too
    tab_width: int = TAB_WIDTH
    _stop_pattern: re.Pattern | None = field(default=None, repr=False)
    _hit: tuple[str, int] | None = field(default=None, repr=False, compare=False)
    _resume: tuple[str, _ScanState] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def for_request(
        cls, prefix: str, suffix: str, language: str, scope: str, tab_width: int = TAB_WIDTH
    ) -> "StopRules":
        """Rules for a completion at the cursor between `prefix` and `suffix`. `scope` may be
        "auto" (resolved here from the cursor's context, as `resolve_scope` does)."""
        if scope != "auto" and scope not in SCOPES:
            raise ValueError(f"unknown scope {scope!r}; expected auto, line, block or full")
        if tab_width < 1:
            raise ValueError(f"tab_width must be at least 1, got {tab_width}")
        facts = facts_for(language)
        suffix_head = suffix[:_SUFFIX_HEAD_CHARS]
        context = _cursor_context(prefix, suffix_head, facts, tab_width)
        if scope == "auto":  # a blank head says nothing of what follows: then the whole suffix decides
            scope = _auto_scope(context, suffix_head if suffix_head.strip() else suffix)
        rest = context.rest.strip()
        later_lines = suffix_head.split("\n")[1:]
        # The cursor sits in the leading blanks of a non-blank line: the completion inserts lines
        # above it, and the model shows that it is done by writing that line again.
        line_above_rest = bool(rest) and not context.line_prefix.strip()
        suffix_line, suffix_line_indent = _repeat_to_watch(
            rest, later_lines, line_above_rest, facts, tab_width
        )
        return cls(
            language=normalize_language(language),
            scope=scope,
            facts=facts,
            min_indent=context.min_indent,
            parent_indent=context.parent_indent,
            keep_closing_line=not _document_closes_block(context, rest, later_lines, facts, tab_width),
            cursor_line_prefix=context.line_prefix,
            cursor_line_region=context.line_region,
            rest_of_line=rest,
            rest_line=context.line_prefix + context.rest.rstrip() if line_above_rest else None,
            suffix_line=suffix_line,
            suffix_line_indent=suffix_line_indent,
            tab_width=tab_width,
            _stop_pattern=_top_level_stop_pattern(facts),
        )

    # -- public -----------------------------------------------------------------------------------

    def check(self, text: str) -> int | None:
        """None to keep generating, or how many characters of `text` the completion keeps.

        Monotone: once this returns K for some text, it returns K for every extension of it."""
        return self._scan(text, remember=True)

    def finish(self, text: str) -> int:
        """How many characters to keep when generation ended by itself (end of sequence): the last
        line counts as complete, so end-of-line rules (suffix overlap, a closing line) apply to it,
        and trailing whitespace goes."""
        if self._hit is not None and text.startswith(self._hit[0]):
            return self._hit[1]
        kept = self._scan(text + "\n", remember=False)
        if kept is None:
            kept = len(text.rstrip())
        return min(kept, len(text))

    # -- scanning ---------------------------------------------------------------------------------

    def _initial_state(self) -> _ScanState:
        return _ScanState(0, 0, self.cursor_line_region, False, None)

    def _scan(self, text: str, remember: bool) -> int | None:
        if self._hit is not None and text.startswith(self._hit[0]):
            return self._hit[1]
        state = self._initial_state()
        if self._resume is not None and text.startswith(self._resume[0]):
            state = self._resume[1]
        size = len(text)
        result = None
        while True:
            start = state.start
            newline = text.find("\n", start)
            complete = newline != -1
            end = newline if complete else size
            triggers = self._triggers(text, start, end, complete, state)
            if triggers:
                trigger, cut = min(
                    (trigger, len(text[:cut].rstrip()) if strip else cut)
                    for trigger, cut, strip in triggers
                )
                result = cut
                if remember:
                    self._hit = (text[:trigger], result)
                break
            if not complete:
                break
            state = self._advance(text, start, end, state)
        if remember and result is None and state.start > 0:
            self._resume = (text[: state.start], state)
        return result

    def _advance(self, text: str, start: int, end: int, state: _ScanState) -> _ScanState:
        line = text[start:end]
        lexer = code_lines.lexer(self.facts)
        if state.index == 0:
            region, _ = lexer.scan(self.cursor_line_prefix + line, state.region)
            run_start = None
        else:
            region, _ = lexer.scan(line, state.region)
            run_start = (state.run_start if state.run_start is not None else start) if (
                self._belongs_to_next_definition(line, state.region)
            ) else None
        return _ScanState(
            state.index + 1, end + 1, region, state.seen_content or bool(line.strip()), run_start
        )

    def _belongs_to_next_definition(self, line: str, region: int | None) -> bool:
        """Comments and decorators at the left margin document the definition below them."""
        if code_lines.lexer(self.facts).region_is_comment(region):
            return True
        if region is not None:
            return False
        stripped = line.lstrip(" \t")
        if not stripped or len(line) - len(stripped) > 1:
            return False
        markers = self.facts.line_comments + self.facts.decorator_prefixes
        if self.facts.brace_delimited:
            markers += ("/*", "*")
        return stripped.startswith(markers)

    def _triggers(
        self, text: str, start: int, end: int, complete: bool, state: _ScanState
    ) -> list[_Trigger]:
        """(trigger, cut, strip) for each rule that fires on one generated line: `trigger` is the
        length of text that decides the stop, `cut` how much text to keep, `strip` whether trailing
        whitespace goes too."""
        triggers: list[_Trigger] = []
        line = text[start:end]
        has_content = bool(line.strip())
        if complete and self.scope == "line" and (state.seen_content or has_content):
            triggers.append((end + 1, end, True))
        if state.index == 0:
            return triggers + self._rest_of_line_repeat(line, start, end, complete)
        if state.region is not None or not has_content:
            return triggers
        stripped = line.lstrip(" \t")
        first = end - len(stripped)  # offset of the first non-blank character
        indent = _columns(text[start:first], self.tab_width)
        if self.scope == "block" and indent < self.min_indent:
            triggers += self._block_end(stripped, start, first, end, indent, complete)
        if self._stop_pattern is not None:
            match = self._stop_pattern.match(text, start)
            if match is not None:
                cut = (state.run_start if state.run_start is not None else start) - 1
                if text[:cut].strip():
                    triggers.append((match.end(), cut, True))
        if complete:
            triggers += self._suffix_repeat(line, stripped, start, end, indent)
        return triggers

    def _rest_of_line_repeat(self, line: str, start: int, end: int, complete: bool) -> list[_Trigger]:
        """The first generated line ends with the rest of the cursor's line: drop the repeat."""
        if not complete or not self.rest_of_line:
            return []
        generated = line.rstrip()
        if not generated.endswith(self.rest_of_line) or self._rest_closes_own_bracket(generated):
            return []
        return [(end + 1, start + len(generated) - len(self.rest_of_line), True)]

    def _block_end(
        self, stripped: str, start: int, first: int, end: int, indent: int, complete: bool
    ) -> list[_Trigger]:
        """A line indented less than the block leaves it; a closing line at the parent's indentation
        is kept when the document does not close the block itself."""
        if indent == 0 and self.facts.column0_exempt_prefixes and stripped.startswith(
            self.facts.column0_exempt_prefixes
        ):
            return []
        if not (self.keep_closing_line and indent == self.parent_indent):
            return [(first + 1, start, True)]
        status, index, closing = code_lines.closing_line_status(self.facts, stripped)
        if status == "no":
            # `} else {`: keep the `}` that balances the block, not what follows it.
            return [(first + index + 1, first + closing if closing else start, True)]
        if complete:
            return [(end + 1, end if status == "closer" else start, True)]
        return []

    def _suffix_repeat(
        self, line: str, stripped: str, start: int, end: int, indent: int
    ) -> list[_Trigger]:
        """A complete generated line that repeats the suffix's first line, or the cursor's line."""
        triggers: list[_Trigger] = []
        if self.suffix_line is not None and stripped.rstrip() == self.suffix_line and (
            self.suffix_line_indent is None or indent == self.suffix_line_indent
        ):
            triggers.append((end + 1, start - 1, True))
        if self.rest_line is not None and line.rstrip() == self.rest_line:
            # Keep the newline and the cursor line's own indentation: the existing line follows.
            triggers.append((end + 1, start + len(self.cursor_line_prefix), False))
        return triggers

    def _rest_closes_own_bracket(self, generated: str) -> bool:
        """Whether the generated first line leaves a bracket open that the rest of the cursor's
        line closes (`foo(` + `bar(1)` with `)` after the cursor): then that `)` is not a repeat."""
        closer = self.rest_of_line[0]
        if closer not in CLOSERS:
            return False
        # Brackets only: these rules serve every language, and `'` opens no string in some of them
        # (a Rust lifetime).
        still_open = scan_brackets(self.cursor_line_prefix + generated, quotes=frozenset())[1]
        return bool(still_open) and OPENERS[still_open[-1]] == closer


def _never(text: str) -> None:
    return None


def whole_lines(text: str) -> str | None:
    """`text` up to its last line end (that line end left out), or None while no line with
    anything on it is whole: where a suggestion past its time cap may end."""
    complete = text[:max(0, text.rfind("\n"))]
    return complete if complete.strip() else None


def kept_past_time_cap(text: str, whole_lines_only: bool) -> str | None:
    """What a suggestion keeps once its time cap has passed, or None: go on until one line is whole.
    One rule for every engine, local or remote, so the cap means the same to a user."""
    return whole_lines(text) if whole_lines_only else text


def completion_rules(prefix: str, suffix: str, language: str, path: str, requested_scope: str
                     ) -> tuple[Callable[[str], int | None], Callable[[str], int | None]]:
    """A request's text rule (checked as text arrives) and final rule (where to end it when the model
    stops on its own). Scope `full` has none: the model's raw output, as benchmarks compare it."""
    if requested_scope == "full":
        return _never, _never
    # the cursor's context is read once, in for_request, which resolves an `auto` scope from it
    rules = StopRules.for_request(prefix, suffix, language or language_from_path(path), requested_scope)
    if rules.scope == "full":
        return _never, _never
    return rules.check, rules.finish
