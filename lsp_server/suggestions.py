"""What the editor is sent and what it reports back: a request's suggestions as LSP items
(`textDocument/inlineCompletion` ghost text or one `textDocument/completion` popup item), the items
sent until the user takes (part of) one, and the counts the stats request shows."""
from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams

ACCEPTED_COMMAND = "draftwise.accepted"
PARTIALLY_ACCEPTED_COMMAND = "draftwise.partiallyAccepted"
PARTIAL_KINDS = ("word", "line", "other")
ITEMS_REMEMBERED = 256  # sent items whose acceptance the server can still use


class Superseded:
    def __repr__(self) -> str:
        return "SUPERSEDED"


SUPERSEDED = Superseded()  # the answer would be stale: reply null


@dataclass(frozen=True)
class Suggestion:
    id: str
    uri: str
    text: str  # replaces `range`
    range: types.Range  # on one line: from the cursor (or the selected popup item) to the end of
    # the auto-closed characters the text replaces
    instant: bool  # answered from the suggestion already on screen (type-ahead)
    alternative: bool = False  # not the greedy suggestion but one of the alternatives after it
    alternatives: tuple["Suggestion", ...] = ()  # further items for the same request, in order


@dataclass(frozen=True)
class ItemRecord:
    """What the server needs to know about a sent item when the client reports taking (part of) it."""

    uri: str
    prefix: str  # document text before the item's range
    suffix: str
    text: str  # what the item inserts
    alternative: bool


@dataclass
class SuggestionCounts:
    shown: int = 0
    instant: int = 0
    accepted: int = 0
    partially_accepted: int = 0
    accepted_chars: int = 0
    alternatives_shown: int = 0
    alternatives_accepted: int = 0  # whole or in part
    partial_by_kind: dict[str, int] = field(default_factory=dict)  # "word" / "line" / "other"
    prefetched: int = 0  # next suggestions computed in idle time after one was shown
    predicted: int = 0  # answered from the suggestion idle work started before the user typed on along it
    skipped_mid_word: int = 0  # automatic requests answered with nothing: the cursor was inside a word
    broken_words: int = 0  # texts not shown: they would break the word before the cursor (postprocess)

    def to_dict(self) -> dict:
        return {"shown": self.shown, "instant": self.instant, "accepted": self.accepted,
                "partiallyAccepted": self.partially_accepted, "acceptedChars": self.accepted_chars,
                "alternativesShown": self.alternatives_shown,
                "alternativesAccepted": self.alternatives_accepted,
                "partiallyAcceptedBy": dict(self.partial_by_kind), "prefetched": self.prefetched,
                "predicted": self.predicted,
                "skippedMidWord": self.skipped_mid_word, "brokenWords": self.broken_words}


class SentItems:
    """The items sent to the editor, by id, until the client reports the user took (part of) one:
    counted, and what they took is handed back (TypingAlong.taken: what type-ahead and the suggestion
    drafter build on)."""

    def __init__(self, counts: SuggestionCounts) -> None:
        self.counts = counts
        self._ids = itertools.count(1)
        self._items: OrderedDict[str, ItemRecord] = OrderedDict()

    def send(self, record: ItemRecord, replaced: types.Range, instant: bool) -> Suggestion:
        """A new item for `record`, replacing `replaced`: counted as shown, remembered under a fresh id."""
        self.counts.shown += 1
        self.counts.instant += instant
        self.counts.alternatives_shown += record.alternative
        suggestion = Suggestion(id=str(next(self._ids)), uri=record.uri, text=record.text, range=replaced,
                                instant=instant, alternative=record.alternative)
        self._items[suggestion.id] = record
        while len(self._items) > ITEMS_REMEMBERED:
            self._items.popitem(last=False)
        return suggestion

    def accepted(self, arguments: Sequence[object]) -> ItemRecord | None:
        """Counted; the item taken, where it was an alternative (type-ahead remembered the greedy one
        when it was shown), else None."""
        info = _command_argument(arguments, ACCEPTED_COMMAND)
        self.counts.accepted += 1
        length = info.get("length")
        if isinstance(length, int) and not isinstance(length, bool) and length >= 0:
            self.counts.accepted_chars += length
        record = self._items.pop(info["id"], None)
        if record is None or not record.alternative:
            return None
        self.counts.alternatives_accepted += 1
        return record  # what the user took is what they build on: the suggestion drafter drafts along it

    def partially_accepted(self, arguments: Sequence[object]) -> ItemRecord | None:
        """The user took the first `acceptedLength` characters of an item (a word, a line). The rest
        is what they are likely to type next: the item is handed back, to become the type-ahead answer
        for the next keystroke and the suggestion drafter's draft, even when it was an alternative
        (None: an item no longer known)."""
        info = _command_argument(arguments, PARTIALLY_ACCEPTED_COMMAND)
        length = info.get("acceptedLength")
        if not isinstance(length, int) or isinstance(length, bool) or length < 0:
            raise JsonRpcInvalidParams(f"{PARTIALLY_ACCEPTED_COMMAND} needs a non-negative "
                                       f"'acceptedLength', got {length!r}")
        kind = info.get("kind", "other")
        if kind not in PARTIAL_KINDS:
            raise JsonRpcInvalidParams(f"{PARTIALLY_ACCEPTED_COMMAND}: 'kind' must be one of "
                                       f"{', '.join(PARTIAL_KINDS)}, got {kind!r}")
        record = self._items.get(info["id"])
        if record is not None and length > len(record.text):
            raise JsonRpcInvalidParams(f"{PARTIALLY_ACCEPTED_COMMAND}: acceptedLength {length} is longer than "
                                       f"item {info['id']} ({len(record.text)} characters)")
        self.counts.partially_accepted += 1
        self.counts.accepted_chars += length
        self.counts.partial_by_kind[kind] = self.counts.partial_by_kind.get(kind, 0) + 1
        if record is None:
            return None  # an item from before a restart, or long gone: counted, nothing to remember
        if record.alternative:
            self.counts.alternatives_accepted += 1
        return record


def _command_argument(arguments: Sequence[object], command: str) -> dict:
    if len(arguments) != 1 or not isinstance(arguments[0], dict) or not isinstance(arguments[0].get("id"), str):
        raise JsonRpcInvalidParams(f"{command} takes one argument {{\"id\": string, ...}}, got {list(arguments)!r}")
    return arguments[0]


# ---- LSP items ---------------------------------------------------------------------------------

def _accept_command(s: Suggestion) -> types.Command:
    return types.Command(title="draftwise: suggestion accepted", command=ACCEPTED_COMMAND,
                         arguments=[{"id": s.id, "uri": s.uri, "length": len(s.text)}])


def inline_result(s: Suggestion | Superseded | None) -> types.InlineCompletionList | None:
    if s is SUPERSEDED:
        return None
    if s is None:
        return types.InlineCompletionList(items=[])
    return types.InlineCompletionList(items=[
        types.InlineCompletionItem(insert_text=item.text, range=item.range, command=_accept_command(item))
        for item in (s, *s.alternatives)])


def completion_label(text: str, limit: int = 60) -> str:
    first = next((line.strip() for line in text.splitlines() if line.strip()), text.strip())
    more = "…" if len(first) > limit or text.strip().count("\n") else ""
    return first[:limit] + more


def completion_result(s: Suggestion | Superseded | None, language_id: str = "",
                      markdown: bool = False) -> types.CompletionList | None:
    if s is SUPERSEDED:
        return None
    # Incomplete: the suggestion depends on the exact prefix, so the client must ask again as the
    # user types rather than filter this list.
    if s is None:
        return types.CompletionList(is_incomplete=True, items=[])
    item = types.CompletionItem(
        label=completion_label(s.text),
        kind=types.CompletionItemKind.Text,
        detail="draftwise",
        documentation=types.MarkupContent(kind=types.MarkupKind.Markdown,
                                          value=f"```{language_id}\n{s.text}\n```")
        if markdown else s.text,
        text_edit=types.TextEdit(range=s.range, new_text=s.text),
        insert_text_format=types.InsertTextFormat.PlainText,
        filter_text=s.text,
        sort_text="0",
        preselect=True,
        command=_accept_command(s),
    )
    return types.CompletionList(is_incomplete=True, items=[item])
