"""What the client reports taking of a sent item (lsp_server.suggestions.SentItems), and how it becomes
what typing along answers from (TypingAlong.taken): no server, no engine."""
from __future__ import annotations

from lsprotocol import types

from decoding.api import CompletionRequest
from lsp_server.config import Settings
from lsp_server.documents import DocumentStore
from lsp_server.suggestions import ItemRecord, SentItems, SuggestionCounts
from lsp_server.typing_along import TypingAlong

URI = "file:///w/a.py"
PREFIX, SUFFIX = "def f(values):\n    return ", "\n"
NOWHERE = types.Range(start=types.Position(line=1, character=11), end=types.Position(line=1, character=11))


class RequestPath:
    """Only what idle_request asks of the request path: the request at a cursor."""

    @staticmethod
    def request_at(doc, prefix: str, suffix: str) -> CompletionRequest:
        return CompletionRequest(prefix=prefix, suffix=suffix, document=doc.uri)


def sent(items: SentItems, text: str, alternative: bool) -> dict:
    suggestion = items.send(ItemRecord(URI, PREFIX, SUFFIX, text, alternative), NOWHERE, instant=False)
    return {"id": suggestion.id, "uri": URI, "length": len(text)}


def test_an_accepted_alternative_is_handed_back_and_the_greedy_item_is_not():
    counts = SuggestionCounts()
    items = SentItems(counts)
    greedy, alternative = sent(items, "sum(values)", False), sent(items, "len(values)", True)
    assert items.accepted([greedy]) is None, "type-ahead remembered the greedy item when it was shown"
    taken = items.accepted([alternative])
    assert taken == ItemRecord(URI, PREFIX, SUFFIX, "len(values)", True)
    assert (counts.accepted, counts.alternatives_accepted, counts.accepted_chars) == (2, 1, 22)


def test_a_partly_taken_item_is_handed_back_even_when_it_was_the_greedy_one():
    counts = SuggestionCounts()
    items = SentItems(counts)
    greedy = sent(items, "sum(values)", False)
    taken = items.partially_accepted([{**greedy, "acceptedLength": 3, "kind": "word"}])
    assert taken is not None and taken.text == "sum(values)"
    gone = items.partially_accepted([{"id": "999", "acceptedLength": 1, "kind": "other"}])
    assert gone is None, "an item no longer known: counted, nothing to build on"
    assert counts.partially_accepted == 2 and counts.partial_by_kind == {"word": 1, "other": 1}


def test_what_the_user_took_is_what_typing_along_answers_from():
    documents = DocumentStore()
    doc = documents.open(URI, "python", 1, PREFIX + "le" + SUFFIX)
    typing_along = TypingAlong(documents, lambda: Settings(), SuggestionCounts(), requests=RequestPath())
    offset = len(PREFIX) + 2  # the user typed "le" of the alternative they took
    assert typing_along.idle_request(doc, offset)[1], "nothing taken yet: worth computing ahead"
    typing_along.taken(ItemRecord(URI, PREFIX, SUFFIX, "len(values)", True))
    assert not typing_along.idle_request(doc, offset)[1], "type-ahead answers there at once"
    assert typing_along.draft_hint(URI, PREFIX + "le") == "n(values)", "and the engine drafts along the rest"
