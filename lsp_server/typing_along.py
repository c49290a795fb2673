"""Typing along: every answer that comes before, or instead of, asking the engine, behind one object.

- idle work's prediction (prediction.py): the suggestion computed where the user stopped, followed
  while they type it;
- the remembered suggestion (typeahead.py): the rest of what was shown, while the user types it;
- what keeps them filled: the engine's answer behind an instant one, the next suggestion prefetched
  after one is shown or after one more Enter on an empty line.

Completions.suggest asks `answer` first and the engine only when it says ASK_ENGINE; it tells
`shown` what the engine answered. Whether typing agrees with a text: decoding/agreement.py.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from decoding.api import CompletionRequest
from lsp_server.config import Settings
from lsp_server.cursor import Cursor, cursor_line, line_break_of
from lsp_server.documents import DocumentStore, OpenDocument
from lsp_server.postprocess import IndentStyle, shape
from lsp_server.prediction import Predictor
from lsp_server.suggestions import SUPERSEDED, Suggestion, SuggestionCounts
from lsp_server.typeahead import TypeAheadMemory

log = logging.getLogger(__name__)

ASK_ENGINE = object()  # answer(): nothing typed along answers this request


class TypingAlong:
    def __init__(self, documents: DocumentStore, settings: Callable[[], Settings], counts: SuggestionCounts,
                 request_at: Callable[[OpenDocument, str, str], CompletionRequest],
                 submit: Callable[..., object], shaped: Callable[..., Suggestion | None],
                 indent: Callable[[OpenDocument], IndentStyle], record_stats: Callable[[dict], None]) -> None:
        """request_at(doc, prefix, suffix): the request there; submit(request, version, idle=...): an
        engine job or None; shaped(cursor, text, instant=...): the item the editor is sent, or None;
        record_stats: told the engine's numbers for a text answered from here."""
        self.documents, self.settings, self.counts = documents, settings, counts
        self.request_at, self.submit, self.shaped, self.record_stats = request_at, submit, shaped, record_stats
        self.memory = TypeAheadMemory()
        self.predictor = Predictor(documents, settings, request_at=request_at,
                                   submit_idle=lambda request, version: submit(request, version, idle=True),
                                   indent=indent)
        self._background: set[asyncio.Task] = set()

    async def answer(self, cursor: Cursor, request: CompletionRequest, invoked: bool):
        """The answer without waiting for the engine: a Suggestion, SUPERSEDED, None (nothing to show),
        or ASK_ENGINE."""
        predicted = await self.predictor.answer(cursor)
        if predicted is SUPERSEDED:
            return SUPERSEDED
        if predicted is not None and predicted.text == "" and not invoked:
            return None  # idle work's suggestion ended here (asked for by hand: the engine answers)
        if predicted is not None and (shown := self._from_prediction(cursor, predicted)) is not None:
            return shown
        instant = self.memory.continuation(cursor.doc.uri, cursor.prefix, cursor.suffix)
        if instant is None:
            return ASK_ENGINE
        # the engine is still asked, in the background, and its answer becomes the remembered one
        job = self.submit(request, cursor.version)
        if job is not None:
            self._run_in_background(self._remember_when_done(job, cursor))
        return self.shaped(cursor, instant, instant=True)

    def shown(self, cursor: Cursor, suggestion: Suggestion) -> None:
        """The engine's suggestion is on screen: remember it, and prefetch the one after it."""
        self.memory.remember(cursor.doc.uri, cursor.prefix, cursor.suffix, suggestion.text)
        if self.settings().idle_work:
            doc = cursor.doc
            prefix = doc.text[:cursor.start] + suggestion.text
            suffix = doc.text[doc.offset_at(suggestion.range.end, self.documents.encoding):]
            self._run_in_background(self._prefetch(doc, cursor.version, prefix, suffix, cursor.indent))

    def draft_hint(self, uri: str, prefix: str) -> str:
        return self.memory.draft_hint(uri, prefix)

    def answers_at(self, doc: OpenDocument, prefix: str, suffix: str) -> bool:
        """Whether a request there would be answered from here (idle work need not compute it)."""
        return (self.memory.continuation(doc.uri, prefix, suffix) is not None
                or self.predictor.covers(doc, len(prefix)))

    def owns(self, job) -> bool:
        return self.predictor.owns(job)

    def forget(self, uri: str) -> None:
        self.memory.forget(uri)

    def _from_prediction(self, cursor: Cursor, predicted) -> Suggestion | None:
        """The engine's own answer, for an earlier cursor the user has typed along."""
        if predicted.stats is not None:
            self.record_stats(predicted.stats)  # the engine's numbers for the text on screen
        shown = self.shaped(cursor, predicted.text, instant=True) if predicted.text else None
        if shown is not None:
            self.counts.predicted += 1
            if not cursor.line_before.strip() and not cursor.line_after and self.settings().idle_work:
                self._run_in_background(self._prefetch_after_blank_line(cursor))  # a pause on an empty line
        return shown

    async def _remember_when_done(self, job, cursor: Cursor) -> None:
        """After an instant answer: the engine's own answer becomes the remembered suggestion."""
        doc = cursor.doc
        try:
            result = await job
        except Exception:
            log.exception("background completion failed for %s", doc.uri)
            return
        if result.stats.stopped == "cancelled" or self.documents.is_stale(doc, cursor.version):
            return
        edit = shape(result.text, cursor.line_before, cursor.line_after, cursor.indent)
        if edit is not None:
            self.memory.remember(doc.uri, cursor.prefix, cursor.suffix, edit.text)

    async def _prefetch_after_blank_line(self, cursor: Cursor) -> None:
        """Idle work at a pause on an empty line: the suggestion after one more Enter. Idle work's
        prediction foresaw the line after the Enter, but code often leaves a blank line there; when
        the user types the Enter (and the editor its indentation), type-ahead answers from this at
        once. It comes before the prediction's next link (which it cancels): that one is for after
        the user has typed the line on screen, and starts again when they type along it."""
        prefix = cursor.prefix[:len(cursor.prefix) - len(cursor.line_before)] + line_break_of(cursor.prefix)
        await self._prefetch(cursor.doc, cursor.version, prefix, cursor.suffix, cursor.indent)

    async def _prefetch(self, doc: OpenDocument, version: int, prefix: str, suffix: str,
                        indent: IndentStyle) -> None:
        """The suggestion at prefix|suffix in idle time, as if the one shown were taken: when the user
        takes it and the editor asks there, type-ahead answers from this at once (and the engine
        verifies it as a draft hint in one forward). A request the user waits for cancels it."""
        job = self.submit(self.request_at(doc, prefix, suffix), version, idle=True)
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
            self.memory.remember(doc.uri, prefix, suffix, edit.text, prefetched=True)

    def _run_in_background(self, coroutine) -> None:
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._background.discard)
