"""What a completion request does, from an LSP position to the item an editor shows.

One path serves both `textDocument/inlineCompletion` (ghost text) and `textDocument/completion` (a
single popup item, for clients without inline completion):

1. read prefix/suffix at the cursor in the client's position encoding;
2. if the user is typing along the suggestion on screen, answer from it at once (and still ask the
   engine, in the background, so its verification, memory and stats follow);
3. otherwise submit to the engine and await the job; an LSP `$/cancelRequest` cancels the asyncio
   task awaiting it, and we pass that on to the job, which stops inside the verify loop;
4. shape the text into an edit (postprocess) and build the item.

An explicitly invoked request (triggerKind Invoked) asks the engine for alternatives too and answers
with up to `alternatives` distinct items, the greedy one first; automatic triggers get one item.

A request whose answer would be stale (a newer request for the document, or an edit after it was
sent) is answered with null, the result the spec allows when there is nothing to show.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams

from decoding.api import CompletionRequest, CompletionResult
from decoding.errors import EngineNotReady
from decoding.jobs import Job, agrees
from lsp_server.config import Settings
from lsp_server.documents import LINE_BREAK, DocumentStore, OpenDocument, display_path, select_context
from lsp_server.engine_host import EngineHost
from lsp_server.postprocess import Edit, IndentStyle, detect_indent, shape
from lsp_server.typeahead import TypeAheadMemory, typed_since

log = logging.getLogger(__name__)

ACCEPTED_COMMAND = "draftwise.accepted"
PARTIALLY_ACCEPTED_COMMAND = "draftwise.partiallyAccepted"
# An editor cancels a request for a keystroke and sends the keystroke's didChange with it (in either
# order): how long a cancelled request's job waits for that edit.
EDIT_AFTER_CANCEL_S = 0.05
CONTEXT_CHARS_PER_TOKEN = 4  # generous: code averages about 3 characters per token


class _Superseded:
    def __repr__(self) -> str:
        return "SUPERSEDED"


SUPERSEDED = _Superseded()  # the answer would be stale: reply null


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


@dataclass(frozen=True)
class _Cursor:
    """Where one request completes, read once from the document as it was when the request came."""

    doc: OpenDocument
    version: int
    start: int  # the range a suggestion replaces starts here (a selected popup item's start) ...
    end: int  # ... and ends here, before the auto-closed characters the edit also covers
    inserted: str  # a selected popup item's text, taken as typed
    prefix: str
    suffix: str
    line_before: str  # the cursor's line, before and after the cursor
    line_after: str
    indent: IndentStyle


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

    def to_dict(self) -> dict:
        return {"shown": self.shown, "instant": self.instant, "accepted": self.accepted,
                "partiallyAccepted": self.partially_accepted, "acceptedChars": self.accepted_chars,
                "alternativesShown": self.alternatives_shown,
                "alternativesAccepted": self.alternatives_accepted,
                "partiallyAcceptedBy": dict(self.partial_by_kind), "prefetched": self.prefetched,
                "predicted": self.predicted,
                "skippedMidWord": self.skipped_mid_word}


PARTIAL_KINDS = ("word", "line", "other")
ITEMS_REMEMBERED = 256  # sent items whose acceptance the server can still use


def mid_word(line_before: str, line_after: str) -> bool:
    """The rule for keystrokes not worth a generation: an automatic request with a letter, digit or
    underscore on both sides of the cursor is inside a word (editing an identifier, not writing new
    code). Editors do not show inline suggestions there, or the user types over them; an explicit
    invoke is still answered."""
    def word_char(ch: str) -> bool:
        return ch.isalnum() or ch == "_"

    return bool(line_before) and bool(line_after) and word_char(line_before[-1]) and word_char(line_after[0])


def line_break_of(text: str) -> str:
    """The line break an Enter inserts in this document."""
    return "\r\n" if "\r\n" in text else "\n"


def cursor_line(prefix: str, suffix: str) -> tuple[str, str]:
    """The cursor line's text before and after the cursor, without line breaks."""
    cut = max(prefix.rfind("\n"), prefix.rfind("\r"))
    match = LINE_BREAK.search(suffix)
    return prefix[cut + 1:], suffix[: match.start()] if match else suffix


CUT_SHORT = ("time_limit", "max_tokens")  # stop reasons of a suggestion the model had more to say after
MODEL_ENDED = ("stop_rule", "eos")  # stop reasons of a suggestion the model (or a stop rule) ended

# A prediction grows a line at a time while the user types along it: it keeps this many finished
# links from the one the cursor is in to its end (the line being typed and the one after the Enter).
LINKS_AHEAD = 2


@dataclass
class Prediction:
    """The suggestion idle work computes at the cursor where the user last stopped typing. While the
    user goes on typing what it says, it keeps running, and the request at their next pause is
    answered from it (Completions.suggest); otherwise it is stopped.

    It is a chain of links, each computed in idle time as if the user had typed the text so far, so
    the next suggestion is ready when they get there. The time cap (maxTimeMs) ends a suggestion at a
    line end although the model had more to say (as maxTokens may): the next link goes on from there.
    Where the model itself ended the suggestion at the end of its line, the next link is the line
    after an Enter there: the request after the user's Enter (and the editor's indentation) is
    answered from it at once. Each link is the suggestion the editor would get at its start; a
    request is answered with the rest of the link the cursor is in."""

    doc: OpenDocument
    version: int  # the document version it was started for
    prefix: str
    suffix: str
    job: Job  # the running link's job, or the last link's
    ended: Callable[["Prediction"], None]  # told each time its task is over
    task: asyncio.Task | None = None  # awaits the links and adds their text
    text: str = ""  # the finished links' text, as the editor would show it at `prefix`, with their leads
    ends: list[int] = field(default_factory=list)  # where each finished link ends in `text`
    starts: list[int] = field(default_factory=list)  # where each finished link's suggestion starts (after its lead)
    stats: list[dict] = field(default_factory=list)  # each finished link's engine stats (the statusline's timing)
    # How the next link starts after `text`: "" where the last link was cut short (CUT_SHORT: the
    # model had more to say), a line break where the model ended it at the end of its line; None: no
    # next link. `lead` is the running link's: typed by the user, not part of its suggestion.
    next_lead: str | None = None
    lead: str = ""
    _grown: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    def typed(self, prefix: str, suffix: str) -> str | None:
        """What the user typed since it started, if the document reads prefix + suffix by that alone."""
        return typed_since(self.prefix, self.suffix, prefix, suffix)

    def agrees(self, typed: str) -> bool:
        """The typing agrees with what is generated so far. A running link is given the benefit of
        the doubt for what it has not generated yet: it stops itself at its first token that
        disagrees (Job.expect). Not a job whose text comes only at its end (a remote engine's)."""
        so_far = self.text + (self.lead + self.job.text_so_far if self.running else "")
        return agrees(so_far, typed) and (bool(so_far) or self.job.tells_text)

    def link_at(self, typed: str) -> int | None:
        """Which finished link the user is in after typing `typed` (0-based); None past them, or
        where they have not typed its lead yet."""
        k = next((k for k, end in enumerate(self.ends) if len(typed) < end), None)
        return k if k is not None and len(typed) >= self.starts[k] else None

    def ended_line_at(self, typed: str) -> bool:
        """The user has typed a link to its end, where the model ended the suggestion at the end of
        its line (the next link, after a line break, is the line after an Enter)."""
        n = len(typed)
        if n == len(self.text):
            return bool(self.lead if self.running else self.next_lead)
        return any(end == n and start > n for end, start in zip(self.ends, self.starts[1:]))

    def wants_link(self, typed: str) -> bool:
        """Another link is worth computing: there is one to compute, and the user has come within
        LINKS_AHEAD links of the end (of links with text: the model may end a line with nothing to say)."""
        ahead = sum(end > len(typed) and end > start for start, end in zip(self.starts, self.ends))
        return self.next_lead is not None and ahead < LINKS_AHEAD

    def add_link(self, text: str, next_lead: str | None, stats: dict) -> None:
        self.starts.append(len(self.text) + len(self.lead))
        self.text += self.lead + text
        self.ends.append(len(self.text))
        self.stats.append(stats)
        self.next_lead, self.lead = next_lead, ""
        self.grew()

    def grew(self) -> None:
        """Wake whoever waits for the next link (or for the end)."""
        self._grown.set()
        self._grown = asyncio.Event()

    async def next_link(self) -> None:
        """Until a link is added or the chain stops (a cancelled waiter leaves it running)."""
        await self._grown.wait()


class Completions:
    def __init__(self, documents: DocumentStore, host: EngineHost, settings: Callable[[], Settings],
                 workspace_folders: Callable[[], Sequence[str]]) -> None:
        self.documents = documents
        self.host = host
        self.settings = settings
        self.workspace_folders = workspace_folders
        self.typeahead = TypeAheadMemory()
        self.counts = SuggestionCounts()
        self._ids = itertools.count(1)
        self._indent_cache: dict[str, tuple[int, IndentStyle]] = {}
        self._background: set[asyncio.Task] = set()
        self._items: OrderedDict[str, ItemRecord] = OrderedDict()
        self.last_stats: dict | None = None  # engine stats of the last suggestion the editor waited for
        self.prediction: Prediction | None = None  # idle work's latest suggestion (lsp_server/idle_work.py)

    # ---- the request path ----------------------------------------------------------------------

    async def suggest(self, uri: str, position: types.Position, *, arrival_version: int | None = None,
                      selected: types.SelectedCompletionInfo | None = None,
                      invoked: bool = False) -> Suggestion | _Superseded | None:
        doc = self.documents.get(uri)
        if doc is None:
            raise JsonRpcInvalidParams(f"document is not open: {uri}")
        if arrival_version is not None and arrival_version != doc.version:
            return SUPERSEDED  # edited after the client sent this request
        settings = self.settings()
        if not settings.serves_language(doc.language_id) or not self.host.ready:
            return None
        cursor = self._cursor(doc, position, selected)
        self.documents.touch(uri)
        if not invoked and mid_word(cursor.line_before, cursor.line_after):
            self.counts.skipped_mid_word += 1
            return None
        request = self.request_at(doc, cursor.prefix, cursor.suffix, settings)
        use_memory = selected is None  # a popup selection is hypothetical text: don't remember it
        # Asked for by hand: the user waits for a choice, so no instant answer from type-ahead.
        if invoked and settings.alternatives > 1:
            request.alternatives = settings.alternatives - 1
        instant = None
        if use_memory and not request.alternatives:
            predicted = await self._from_prediction(cursor)
            if predicted is SUPERSEDED:
                return SUPERSEDED
            if predicted == "" and not invoked:
                return None  # idle work's suggestion ended here (asked for by hand: the engine answers)
            shown = self._shaped(cursor, predicted, instant=True) if predicted else None
            if shown is not None:
                # The engine's own answer, for an earlier cursor the user has typed along: no need
                # to ask it again.
                self.counts.predicted += 1
                if not cursor.line_before.strip() and not cursor.line_after and settings.idle_work:
                    self._run_in_background(self._prefetch_after_blank_line(cursor))  # a pause on an empty line
                return shown
            instant = self.typeahead.continuation(uri, cursor.prefix, cursor.suffix)
        if instant is not None:
            job = self._submit(request, cursor.version)
            if job is not None:
                self._run_in_background(self._remember_when_done(job, cursor))
            return self._shaped(cursor, instant, instant=True)
        result = await self._engine_answer(cursor, request)
        if result is None or result is SUPERSEDED:
            return result
        self.last_stats = result.stats.to_dict()
        return self._suggestions(cursor, result, use_memory)

    def _cursor(self, doc: OpenDocument, position: types.Position,
                selected: types.SelectedCompletionInfo | None) -> _Cursor:
        encoding = self.documents.encoding
        start = end = doc.offset_at(position, encoding)
        inserted = ""
        if selected is not None:
            # The popup's selected item would replace `range` with its text; suggest what follows it.
            start = doc.offset_at(selected.range.start, encoding)
            end = doc.offset_at(selected.range.end, encoding)
            if end < start:
                raise JsonRpcInvalidParams("selectedCompletionInfo.range ends before it starts")
            inserted = selected.text
        prefix, suffix = doc.text[:start] + inserted, doc.text[end:]
        line_before, line_after = cursor_line(prefix, suffix)
        return _Cursor(doc, doc.version, start, end, inserted, prefix, suffix, line_before, line_after,
                       self._indent(doc))

    async def _engine_answer(self, cursor: _Cursor, request: CompletionRequest):
        """The engine's result for the request; SUPERSEDED when it is stale, None when there is none."""
        uri = cursor.doc.uri
        job = self._submit(request, cursor.version)
        if job is None:
            return None
        try:
            result = await job
        except asyncio.CancelledError:
            # The client cancelled: stop the engine now, not after max_tokens. A request that joined
            # idle work's suggestion was cancelled for a keystroke, which may run along it: that
            # edit decides (IdleWork.document_changed); without one soon, it stops all the same.
            if self.prediction is not None and job is self.prediction.job:
                asyncio.get_running_loop().call_later(EDIT_AFTER_CANCEL_S, self._stop_unless_edited, cursor, job)
            else:
                job.cancel()
            raise
        except Exception:
            log.exception("completion failed for %s", uri)
            return None
        if result.stats.stopped == "cancelled" or self._moved_on(cursor.doc, cursor.version):
            return SUPERSEDED
        return result

    def _suggestions(self, cursor: _Cursor, result: CompletionResult, use_memory: bool) -> Suggestion | None:
        """The greedy text's suggestion with the distinct alternatives after it."""
        suggestion = self._shaped(cursor, result.text, instant=False)
        if suggestion is not None and use_memory:
            self.typeahead.remember(cursor.doc.uri, cursor.prefix, cursor.suffix, suggestion.text)
            if self.settings().idle_work:
                self._run_in_background(self._prefetch_after(cursor, suggestion))
        others: list[Suggestion] = []
        for text in result.alternatives:
            other = self._shaped(cursor, text, instant=False, alternative=True)
            # Distinct as the editor shows them (shaping can make two texts equal).
            if other is not None and other.text not in {s.text for s in [suggestion, *others] if s}:
                others.append(other)
        if suggestion is None:
            return others[0] if others else None  # the greedy text shaped to nothing; show the rest
        if others:
            suggestion = replace(suggestion, alternatives=tuple(others))
        return suggestion

    def _shaped(self, cursor: _Cursor, text: str, instant: bool, alternative: bool = False) -> Suggestion | None:
        edit = shape(text, cursor.line_before, cursor.line_after, cursor.indent)
        if edit is None:
            return None
        return self._suggestion(cursor, edit, instant, alternative)

    def request_at(self, doc: OpenDocument, prefix: str, suffix: str, settings: Settings) -> CompletionRequest:
        folders = self.workspace_folders()
        engine = settings.engine
        context = select_context(self.documents, doc, folders,
                                 max_chars=engine.context_tokens * CONTEXT_CHARS_PER_TOKEN)
        return CompletionRequest(
            prefix=prefix, suffix=suffix, path=display_path(doc.uri, folders), document=doc.uri,
            language=doc.language_id, context=tuple(context), max_tokens=engine.max_tokens,
            context_tokens=engine.context_tokens, scope=settings.scope, drafter=engine.drafter,
            temperature=settings.temperature, draft_hint=self.typeahead.draft_hint(doc.uri, prefix),
            time_limit_s=settings.max_time_ms / 1000 if settings.max_time_ms else None)

    def idle_request(self, doc: OpenDocument, offset: int) -> tuple[CompletionRequest, bool]:
        """The request the editor will send if the user stops with the cursor at `offset`, and whether
        it is worth computing before it comes (False: suggest() would not ask the engine first, as
        inside a word or along a shown suggestion; reading its prompt ahead still pays)."""
        prefix, suffix = doc.text[:offset], doc.text[offset:]
        request = self.request_at(doc, prefix, suffix, self.settings())
        line_before, line_after = cursor_line(prefix, suffix)
        generate = (not mid_word(line_before, line_after)
                    and self.typeahead.continuation(doc.uri, prefix, suffix) is None
                    and not self.prediction_covers(doc, offset))
        return request, generate

    # ---- idle work's prediction ----------------------------------------------------------------

    def predict(self, doc: OpenDocument, version: int, request: CompletionRequest,
                ended: Callable[[Prediction], None]) -> Prediction | None:
        """Start idle work's suggestion for `request` (from idle_request); `ended` is called each time
        its task is over (finished, stopped, or waiting for the user to come within LINKS_AHEAD links
        of its end: extend_prediction)."""
        job = self._submit(request, version, idle=True)
        if job is None:
            return None
        self.prediction = prediction = Prediction(doc, version, request.prefix, request.suffix, job, ended)
        self._follow_links(prediction)
        return prediction

    def extend_prediction(self, doc: OpenDocument, offset: int) -> bool:
        """Idle work with the cursor at `offset` along idle work's stopped prediction: its next link,
        if the user has come within LINKS_AHEAD links of its end. Whether one was started."""
        p = self.prediction
        typed = self._typed_along_prediction(doc, doc.text[:offset], doc.text[offset:])
        if typed is None or p.running or not p.wants_link(typed) or not self._next_link(p, typed):
            return False
        self._follow_links(p)
        return True

    def prediction_covers(self, doc: OpenDocument, offset: int) -> bool:
        """The user typed along idle work's latest suggestion since it started, and it has more to
        show at `offset` (or, still running, agrees with the typing so far): it answers the request
        at the next pause, nothing new needs computing."""
        return self._typed_along_prediction(doc, doc.text[:offset], doc.text[offset:]) is not None

    def follow_typing(self, doc: OpenDocument, offset: int) -> Job | None:
        """After an edit: the job of idle work's running link if the prediction covers the new cursor,
        told what the user typed into it (it stops itself at a token that differs: Job.expect); else
        None."""
        typed = self._typed_along_prediction(doc, doc.text[:offset], doc.text[offset:])
        if typed is None or not self.prediction.running:
            return None
        p = self.prediction
        p.job.expect(typed[len(p.text) + len(p.lead):])  # the running link's suggestion starts there
        return p.job

    def _typed_along_prediction(self, doc: OpenDocument, prefix: str, suffix: str) -> str | None:
        """What the user typed since idle work's latest suggestion started, if that covers the cursor
        at prefix|suffix; else None."""
        p = self.prediction
        if p is None or p.doc is not doc or (not p.ends and not p.running):
            return None
        typed = p.typed(prefix, suffix)
        if typed is None or not p.agrees(typed) or not (typed or p.ends):
            return None  # (at its start while its first link runs: a request there joins that job)
        return typed if p.running or len(typed) < len(p.text) or p.ended_line_at(typed) else None

    def _stop_unless_edited(self, cursor: _Cursor, job) -> None:
        if cursor.doc.version == cursor.version:  # no edit since the request: nothing runs along it
            job.cancel()

    def stop_prediction(self) -> None:
        if self.prediction is not None and self.prediction.running:
            self.prediction.job.cancel()

    def _follow_links(self, p: Prediction) -> None:
        p.task = asyncio.ensure_future(self._links(p))
        p.task.add_done_callback(lambda _: p.ended(p))

    async def _links(self, p: Prediction) -> None:
        """The prediction's task: add each link's text when it is done, and start the next one while
        the user is within LINKS_AHEAD links of the end."""
        try:
            while await self._add_link(p):
                typed = self._typed_now(p)
                if typed is None or not p.wants_link(typed) or not self._next_link(p, typed):
                    return
        finally:
            p.grew()

    async def _add_link(self, p: Prediction) -> bool:
        """Await the running link and add its text as the editor would show it at the link's start."""
        try:
            result = await p.job
        except Exception:
            log.debug("idle work failed for %s", p.doc.uri, exc_info=True)
            return False
        if result.stats.stopped == "cancelled":
            return False
        start = p.prefix + p.text + p.lead
        line_before, line_after = cursor_line(start, p.suffix)
        edit = shape(result.text, line_before, line_after, self._indent(p.doc))
        text = edit.text if edit is not None else ""
        next_lead = None  # only a link that leaves the rest of the line as it is can be taken as typed
        if edit is None or edit.replace == 0:
            end_before, end_after = cursor_line(start + text, p.suffix)
            if result.stats.stopped in CUT_SHORT and text:
                next_lead = ""
            elif result.stats.stopped in MODEL_ENDED and end_before.strip() and not end_after.strip():
                # The model ended the suggestion at the end of its line (even with nothing to say):
                # the user's next key is most likely Enter.
                next_lead = line_break_of(p.prefix)
        if not text and next_lead is None:
            return False
        p.add_link(text, next_lead, stats=result.stats.to_dict())
        return True

    def _next_link(self, p: Prediction, typed: str) -> bool:
        """Submit the prediction's next link: the request at its end (after its lead), as if the user
        had typed it."""
        doc, lead = p.doc, p.next_lead
        if self._moved_on(doc, doc.version) or not self.settings().idle_work or not agrees(p.text + lead, typed):
            return False
        job = self._submit(self.request_at(doc, p.prefix + p.text + lead, p.suffix, self.settings()), doc.version,
                           idle=True)
        if job is None:
            return False
        job.expect(typed[len(p.text) + len(lead):])  # typed past the finished links already
        p.job, p.lead = job, lead
        return True

    def _typed_now(self, p: Prediction) -> str | None:
        """What the user has typed along the prediction so far (None: they left it, or it is gone)."""
        doc = p.doc
        if self.prediction is not p or self.documents.get(doc.uri) is not doc:
            return None
        if doc.version == p.version:
            return ""
        if doc.edit_end is None:
            return None
        typed = p.typed(doc.text[:doc.edit_end], doc.text[doc.edit_end:])
        return typed if typed is not None and agrees(p.text, typed) else None

    async def _from_prediction(self, cursor: _Cursor) -> str | _Superseded | None:
        """The rest of the link of idle work's suggestion that the user typed into since it started
        (waiting for that link to finish); "" where they typed a link to the end of the line where the
        model ended it (the next link is the line after an Enter); else None."""
        typed = self._typed_along_prediction(cursor.doc, cursor.prefix, cursor.suffix)
        if typed is None:
            return None
        p, waited = self.prediction, time.perf_counter()
        while p.running and len(typed) >= len(p.text) + len(p.lead):
            await p.next_link()  # a cancelled request leaves the prediction running
        if self._moved_on(cursor.doc, cursor.version):
            return SUPERSEDED
        if not p.text.startswith(typed):
            return None
        link = p.link_at(typed)
        if link is None:
            # Where the model ended its line the engine would say nothing more: asking it again would
            # only cancel the next link, the line after the user's Enter.
            return "" if p.ended_line_at(typed) else None
        rest = p.text[len(typed):p.ends[link]]  # the rest of the link the cursor is in
        self.last_stats = p.stats[link]  # the engine's numbers for the text on screen
        log.info("request: answered from idle work's suggestion (%d characters typed along it, link %d of %d; "
                 "waited %.0f ms)", len(typed), link + 1, len(p.ends), (time.perf_counter() - waited) * 1000)
        return rest

    def _submit(self, request: CompletionRequest, version: int, idle: bool = False):
        try:
            return self.host.submit(request, version, idle=idle)
        except EngineNotReady:
            return None
        except Exception:
            log.exception("the engine refused a request for %s", request.document)
            return None

    async def _remember_when_done(self, job, cursor: _Cursor) -> None:
        """After an instant answer: the engine's own answer becomes the remembered suggestion."""
        doc = cursor.doc
        try:
            result = await job
        except Exception:
            log.exception("background completion failed for %s", doc.uri)
            return
        if result.stats.stopped == "cancelled" or self._moved_on(doc, cursor.version):
            return
        edit = shape(result.text, cursor.line_before, cursor.line_after, cursor.indent)
        if edit is not None:
            self.typeahead.remember(doc.uri, cursor.prefix, cursor.suffix, edit.text)

    async def _prefetch_after(self, cursor: _Cursor, shown: Suggestion) -> None:
        """Idle work after a suggestion is shown: the next one, as if it were accepted. When the user
        takes it and the editor asks at the end of it, type-ahead answers from this at once (and the
        engine verifies it as a draft hint in one forward). A request the user waits for cancels it."""
        doc = cursor.doc
        prefix = doc.text[:cursor.start] + shown.text
        suffix = doc.text[doc.offset_at(shown.range.end, self.documents.encoding):]
        await self._prefetch(doc, cursor.version, prefix, suffix, cursor.indent)

    async def _prefetch_after_blank_line(self, cursor: _Cursor) -> None:
        """Idle work at a pause on an empty line: the suggestion after one more Enter. Idle work's
        prediction foresaw the line after the Enter, but code often leaves a blank line there; when
        the user types the Enter (and the editor its indentation), type-ahead answers from this at
        once. It comes before the prediction's next link (which it cancels): that one is for after
        the user has typed the line on screen, and starts again when they type along it."""
        prefix = cursor.prefix[:len(cursor.prefix) - len(cursor.line_before)] + line_break_of(cursor.prefix)
        await self._prefetch(cursor.doc, cursor.version, prefix, cursor.suffix, cursor.indent)

    async def _prefetch(self, doc: OpenDocument, version: int, prefix: str, suffix: str,
                        indent: IndentStyle) -> None:
        """The suggestion at prefix|suffix in idle time, for type-ahead to answer from."""
        job = self._submit(self.request_at(doc, prefix, suffix, self.settings()), version, idle=True)
        if job is None:
            return
        try:
            result = await job
        except Exception:
            log.debug("prefetch failed for %s", doc.uri, exc_info=True)
            return
        if result.stats.stopped == "cancelled":
            return
        line_before, line_after = cursor_line(prefix, suffix)
        edit = shape(result.text, line_before, line_after, indent)
        if edit is not None and edit.text:
            self.counts.prefetched += 1
            self.typeahead.remember(doc.uri, prefix, suffix, edit.text, prefetched=True)

    def _run_in_background(self, coroutine) -> None:
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._background.discard)

    def _moved_on(self, doc: OpenDocument, version: int) -> bool:
        return self.documents.get(doc.uri) is not doc or doc.version != version

    def _indent(self, doc: OpenDocument) -> IndentStyle:
        cached = self._indent_cache.get(doc.uri)
        if cached is None or cached[0] != doc.version:
            cached = (doc.version, detect_indent(doc.text))
            self._indent_cache[doc.uri] = cached
        return cached[1]

    def _suggestion(self, cursor: _Cursor, edit: Edit, instant: bool, alternative: bool) -> Suggestion:
        doc, encoding = cursor.doc, self.documents.encoding
        replaced = types.Range(start=doc.position_at(cursor.start, encoding),
                               end=doc.position_at(cursor.end + edit.replace, encoding))
        self.counts.shown += 1
        self.counts.instant += instant
        self.counts.alternatives_shown += alternative
        suggestion = Suggestion(id=str(next(self._ids)), uri=doc.uri, text=cursor.inserted + edit.text,
                                range=replaced, instant=instant, alternative=alternative)
        self._items[suggestion.id] = ItemRecord(doc.uri, doc.text[:cursor.start], cursor.suffix,
                                                suggestion.text, alternative)
        while len(self._items) > ITEMS_REMEMBERED:
            self._items.popitem(last=False)
        return suggestion

    # ---- document events -----------------------------------------------------------------------

    def document_closed(self, uri: str) -> None:
        self.typeahead.forget(uri)
        self._indent_cache.pop(uri, None)

    # ---- acceptance ----------------------------------------------------------------------------

    def accepted(self, arguments: Sequence[object]) -> None:
        info = _command_argument(arguments, ACCEPTED_COMMAND)
        self.counts.accepted += 1
        length = info.get("length")
        if isinstance(length, int) and not isinstance(length, bool) and length >= 0:
            self.counts.accepted_chars += length
        record = self._items.pop(info["id"], None)
        if record is not None and record.alternative:
            self.counts.alternatives_accepted += 1
            # What the user took is what they build on: the suggestion drafter drafts along it.
            self.typeahead.remember(record.uri, record.prefix, record.suffix, record.text)

    def partially_accepted(self, arguments: Sequence[object]) -> None:
        """The user took the first `acceptedLength` characters of an item (a word, a line). The rest
        is what they are likely to type next: it becomes the type-ahead answer for the next keystroke
        and the suggestion drafter's draft, even when the item was an alternative."""
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
            return  # an item from before a restart, or long gone: counted, nothing to remember
        if record.alternative:
            self.counts.alternatives_accepted += 1
        self.typeahead.remember(record.uri, record.prefix, record.suffix, record.text)


def _command_argument(arguments: Sequence[object], command: str) -> dict:
    if len(arguments) != 1 or not isinstance(arguments[0], dict) or not isinstance(arguments[0].get("id"), str):
        raise JsonRpcInvalidParams(f"{command} takes one argument {{\"id\": string, ...}}, got {list(arguments)!r}")
    return arguments[0]


# ---- LSP items ---------------------------------------------------------------------------------

def _accept_command(s: Suggestion) -> types.Command:
    return types.Command(title="draftwise: suggestion accepted", command=ACCEPTED_COMMAND,
                         arguments=[{"id": s.id, "uri": s.uri, "length": len(s.text)}])


def inline_result(s: Suggestion | _Superseded | None) -> types.InlineCompletionList | None:
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


def completion_result(s: Suggestion | _Superseded | None, language_id: str = "",
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
