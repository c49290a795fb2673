"""Typing along: every answer that comes before, or instead of, asking the engine, behind one object.

- idle work's prediction (prediction.py): the suggestion computed where the user stopped, followed
  while they type it;
- the remembered suggestion (typeahead.py): the rest of what was shown, while the user types it;
- what keeps them filled: the engine's answer behind an instant one, the next suggestion prefetched
  after one is shown or after one more Enter on an empty line.

Completions.suggest asks `answer` first and the engine only when it says ASK_ENGINE; it tells
`shown` what the engine answered and `taken` what the user took of an item. Idle work
(idle_work.py) says when the prediction starts, follows the typing or stops (the methods asked by
IdleWork). What typing along needs of the request path (the request at a cursor, an engine job, the
item sent) it asks of Completions by name: request_path.RequestPath.
Whether typing agrees with a text: decoding/agreement.py.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from decoding.api import CompletionRequest
from decoding.jobs import Job
from lsp_server.config import Settings
from lsp_server.cursor import Cursor, cursor_line, line_break_of, mid_word
from lsp_server.documents import DocumentStore, OpenDocument
from lsp_server.postprocess import IndentStyle, shape
from lsp_server.prediction import Prediction, Predictor
from lsp_server.request_path import RequestPath
from lsp_server.suggestions import SUPERSEDED, ItemRecord, Suggestion, SuggestionCounts
from lsp_server.typeahead import TypeAheadMemory

log = logging.getLogger(__name__)

ASK_ENGINE = object()  # answer(): nothing typed along answers this request


class TypingAlong:
    def __init__(self, documents: DocumentStore, settings: Callable[[], Settings], counts: SuggestionCounts,
                 requests: RequestPath) -> None:
        self.documents, self.settings, self.counts = documents, settings, counts
        self.requests = requests
        self._memory = TypeAheadMemory()
        self._predictor = Predictor(documents, settings, requests)
        self._background: set[asyncio.Task] = set()

    # ---- asked by Completions ---------------------------------------------------------------------

    async def answer(self, cursor: Cursor, request: CompletionRequest, invoked: bool):
        """The answer without waiting for the engine: a Suggestion, SUPERSEDED, None (nothing to show),
        or ASK_ENGINE."""
        predicted = await self._predictor.answer(cursor)
        if predicted is SUPERSEDED:
            return SUPERSEDED
        if predicted is not None and predicted.text == "" and not invoked:
            return None  # idle work's suggestion ended here (asked for by hand: the engine answers)
        if predicted is not None and (shown := self._from_prediction(cursor, predicted)) is not None:
            return shown
        instant = self._memory.continuation(cursor.doc.uri, cursor.prefix, cursor.suffix)
        if instant is None:
            return ASK_ENGINE
        # the engine is still asked, in the background, and its answer becomes the remembered one
        job = self.requests.submit(request, cursor.version)
        if job is not None:
            self._run_in_background(self._remember_when_done(job, cursor))
        return self.requests.shaped(cursor, instant, instant=True)

    def shown(self, cursor: Cursor, suggestion: Suggestion) -> None:
        """The engine's suggestion is on screen: remember it, and prefetch the one after it."""
        self._memory.remember(cursor.doc.uri, cursor.prefix, cursor.suffix, suggestion.text)
        if self.settings().idle_work:
            doc = cursor.doc
            prefix = doc.text[:cursor.start] + suggestion.text
            suffix = doc.text[doc.offset_at(suggestion.range.end, self.documents.encoding):]
            self._run_in_background(self._prefetch(doc, cursor.version, prefix, suffix, cursor.indent))

    def taken(self, item: ItemRecord) -> None:
        """The user took (part of) a sent item that type-ahead does not know yet: what they build on,
        for the next keystroke's answer and the suggestion drafter's draft."""
        self._memory.remember(item.uri, item.prefix, item.suffix, item.text)

    def draft_hint(self, uri: str, prefix: str) -> str:
        return self._memory.draft_hint(uri, prefix)

    def owns(self, job: Job) -> bool:
        """`job` is a link of idle work's prediction, which a request joined: the user may be typing
        along it, so a cancelled request leaves it to the next edit to stop."""
        return self._predictor.owns(job)

    def forget(self, uri: str) -> None:
        self._memory.forget(uri)

    # ---- idle work's prediction, asked by IdleWork ------------------------------------------------

    def idle_request(self, doc: OpenDocument, offset: int) -> tuple[CompletionRequest, bool]:
        """The request the editor will send if the user stops with the cursor at `offset`, and whether
        it is worth computing before it comes (False: suggest() would not ask the engine first, as
        inside a word or along a shown suggestion or the prediction; reading its prompt ahead still pays)."""
        prefix, suffix = doc.text[:offset], doc.text[offset:]
        request = self.requests.request_at(doc, prefix, suffix)
        line_before, line_after = cursor_line(prefix, suffix)
        worth_generating = (not mid_word(line_before, line_after)
                            and self._memory.continuation(doc.uri, prefix, suffix) is None
                            and not self._predictor.covers(doc, offset))
        return request, worth_generating

    def predict_at(self, doc: OpenDocument, offset: int,
                   ended: Callable[[Prediction], None]) -> CompletionRequest | None:
        """Idle work where an edit left the cursor: the prediction's next link, where the user typed
        along it to within LINKS_AHEAD links of its end; else a new prediction there (see
        start_prediction). The request where nothing is worth computing ahead, for its prompt to be
        read ahead; None where a link or a prediction was started."""
        if self._predictor.extend(doc, offset):
            return None
        request, worth_generating = self.idle_request(doc, offset)
        if not worth_generating:
            return request
        self._predictor.start(doc, doc.version, request, ended)
        return None

    def start_prediction(self, doc: OpenDocument, version: int, request: CompletionRequest,
                         ended: Callable[[Prediction], None]) -> Prediction | None:
        """Idle work's suggestion for `request` (idle_request); `ended` is told each time its task is
        over (finished, stopped, or waiting for the user to type along)."""
        return self._predictor.start(doc, version, request, ended)

    def prediction_covers(self, doc: OpenDocument, offset: int) -> bool:
        """The user typed along the prediction and it answers the request at `offset`."""
        return self._predictor.covers(doc, offset)

    def follow_typing(self, doc: OpenDocument, offset: int) -> Job | None:
        return self._predictor.follow_typing(doc, offset)

    def is_latest_prediction(self, prediction: Prediction) -> bool:
        return self._predictor.latest is prediction

    def stop_prediction(self) -> None:
        self._predictor.stop()

    # ---- keeping the answers filled ---------------------------------------------------------------

    def _from_prediction(self, cursor: Cursor, predicted) -> Suggestion | None:
        """The engine's own answer, for an earlier cursor the user has typed along."""
        if predicted.stats is not None:
            self.requests.record_stats(predicted.stats)  # the engine's numbers for the text on screen
        shown = self.requests.shaped(cursor, predicted.text, instant=True) if predicted.text else None
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
            self._memory.remember(doc.uri, cursor.prefix, cursor.suffix, edit.text)

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
        job = self.requests.submit(self.requests.request_at(doc, prefix, suffix), version, idle=True)
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
            self._memory.remember(doc.uri, prefix, suffix, edit.text, prefetched=True)

    def _run_in_background(self, coroutine) -> None:
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._background.discard)
