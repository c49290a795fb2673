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

Answers from typing along (idle work's prediction, the remembered suggestion, prefetches) are in
typing_along.py; the items sent and the acceptance the client reports in suggestions.py.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Callable, Sequence

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams

from decoding.api import CompletionRequest, CompletionResult
from decoding.errors import EngineNotReady
from decoding.jobs import Job
from lsp_server.config import Settings
from lsp_server.cursor import Cursor, mid_word, read_cursor
from lsp_server.documents import DocumentStore, OpenDocument, display_path, select_context
from lsp_server.engine_host import EngineHost
from lsp_server.postprocess import Edit, IndentStyle, breaks_the_word, detect_indent, shape
from lsp_server.repository_context import RepositoryService
from lsp_server.suggestions import SUPERSEDED, ItemRecord, SentItems, Suggestion, SuggestionCounts, Superseded
from lsp_server.typing_along import ASK_ENGINE, TypingAlong

log = logging.getLogger(__name__)

# An editor cancels a request for a keystroke and sends the keystroke's didChange with it (in either
# order): how long a cancelled request's job waits for that edit.
EDIT_AFTER_CANCEL_S = 0.05
# Bounds how much other-file text is sent, not what the prompt takes: the engine trims context by its
# token count, so this errs on the side of sending more than fits.
CONTEXT_CHARS_PER_TOKEN = 4


class Completions:
    def __init__(self, documents: DocumentStore, host: EngineHost, settings: Callable[[], Settings],
                 workspace_folders: Callable[[], Sequence[str]], repository: RepositoryService | None = None) -> None:
        self.documents = documents
        self.repository = repository
        self.host = host
        self.settings = settings
        self.workspace_folders = workspace_folders
        self.counts = SuggestionCounts()
        self._indent_cache: dict[str, tuple[int, IndentStyle]] = {}
        self.last_stats: dict | None = None  # engine stats of the last suggestion the editor waited for
        # Answers before the engine is asked (lsp_server/idle_work.py says when idle work starts); it
        # asks this object for requests, engine jobs and items (request_path.RequestPath).
        self.typing_along = TypingAlong(documents, settings, self.counts, requests=self)
        self.items = SentItems(self.counts)

    # ---- the request path ----------------------------------------------------------------------

    async def suggest(self, uri: str, position: types.Position, *, arrival_version: int | None = None,
                      selected: types.SelectedCompletionInfo | None = None,
                      invoked: bool = False) -> Suggestion | Superseded | None:
        doc = self.documents.get(uri)
        if doc is None:
            raise JsonRpcInvalidParams(f"document is not open: {uri}")
        if arrival_version is not None and arrival_version != doc.version:
            return SUPERSEDED  # edited after the client sent this request
        settings = self.settings()
        if not settings.serves_language(doc.language_id) or not self.host.ready:
            return None
        cursor = read_cursor(doc, position, selected, self.documents.encoding, self.indent(doc))
        self.documents.touch(uri)
        if not invoked and mid_word(cursor.line_before, cursor.line_after):
            self.counts.skipped_mid_word += 1
            return None
        request = self.request_at(doc, cursor.prefix, cursor.suffix)
        use_memory = selected is None  # a popup selection is hypothetical text: don't remember it
        # Asked for by hand: the user waits for a choice, so no instant answer from type-ahead.
        if invoked and settings.alternatives > 1:
            request.alternatives = settings.alternatives - 1
        if use_memory and not request.alternatives:
            answer = await self.typing_along.answer(cursor, request, invoked)
            if answer is not ASK_ENGINE:
                return answer
        result = await self._engine_answer(cursor, request)
        if result is None or result is SUPERSEDED:
            return result
        self.last_stats = result.stats.to_dict()
        return self._suggestions(cursor, result, use_memory)

    async def _engine_answer(self, cursor: Cursor, request: CompletionRequest):
        """The engine's result for the request; SUPERSEDED when it is stale, None when there is none."""
        uri = cursor.doc.uri
        job = self.submit(request, cursor.version)
        if job is None:
            return None
        try:
            result = await job
        except asyncio.CancelledError:
            # The client cancelled: stop the engine now, not after max_tokens. A request that joined
            # idle work's suggestion was cancelled for a keystroke, which may run along it: that
            # edit decides (IdleWork.document_changed); without one soon, it stops all the same.
            if self.typing_along.owns(job):
                asyncio.get_running_loop().call_later(EDIT_AFTER_CANCEL_S, self._stop_unless_edited, cursor, job)
            else:
                job.cancel()
            raise
        except Exception:
            log.exception("completion failed for %s", uri)
            return None
        if result.stats.stopped == "cancelled" or self.documents.is_stale(cursor.doc, cursor.version):
            return SUPERSEDED
        return result

    def _stop_unless_edited(self, cursor: Cursor, job) -> None:
        if cursor.doc.version == cursor.version:  # no edit since the request: nothing runs along it
            job.cancel()

    def _suggestions(self, cursor: Cursor, result: CompletionResult, use_memory: bool) -> Suggestion | None:
        """The greedy text's suggestion with the distinct alternatives after it."""
        suggestion = self.shaped(cursor, result.text, instant=False)
        if suggestion is not None and use_memory:
            self.typing_along.shown(cursor, suggestion)
        others: list[Suggestion] = []
        for text in result.alternatives:
            other = self.shaped(cursor, text, instant=False, alternative=True)
            # Distinct as the editor shows them (shaping can make two texts equal).
            if other is not None and other.text not in {s.text for s in [suggestion, *others] if s}:
                others.append(other)
        if suggestion is None:
            return others[0] if others else None  # the greedy text shaped to nothing; show the rest
        if others:
            suggestion = replace(suggestion, alternatives=tuple(others))
        return suggestion

    # ---- what typing along asks of the request path (request_path.RequestPath) -------------------

    def shaped(self, cursor: Cursor, text: str, instant: bool, alternative: bool = False) -> Suggestion | None:
        if breaks_the_word(text, cursor.prefix, cursor.suffix):  # nothing rather than a broken line
            self.counts.broken_words += 1
            log.info("not shown: %r would break the word before the cursor", text[:40])
            return None
        edit = shape(text, cursor.line_before, cursor.line_after, cursor.indent)
        if edit is None:
            return None
        return self._suggestion(cursor, edit, instant, alternative)

    def _suggestion(self, cursor: Cursor, edit: Edit, instant: bool, alternative: bool) -> Suggestion:
        doc, encoding = cursor.doc, self.documents.encoding
        replaced = types.Range(start=doc.position_at(cursor.start, encoding),
                               end=doc.position_at(cursor.end + edit.replace, encoding))
        record = ItemRecord(doc.uri, doc.text[:cursor.start], cursor.suffix, cursor.inserted + edit.text,
                            alternative)
        return self.items.send(record, replaced, instant)

    def request_at(self, doc: OpenDocument, prefix: str, suffix: str) -> CompletionRequest:
        settings, folders = self.settings(), self.workspace_folders()
        engine = settings.engine
        on = settings.repo_context_on(self.host.repo_context_pays)
        repo = (self.repository.context_for(doc.uri, doc.language_id, prefix, settings.repo_context_tokens)
                if on and self.repository is not None else None)
        if repo is None:  # off, or a document outside the workspace: other open files of its language
            context = tuple(select_context(self.documents, doc, folders,
                                           max_chars=engine.context_tokens * CONTEXT_CHARS_PER_TOKEN))
        return CompletionRequest(
            prefix=prefix, suffix=suffix, path=display_path(doc.uri, folders), document=doc.uri,
            language=doc.language_id, context=repo.files if repo else context,
            context_reserve_tokens=settings.repo_context_tokens if repo else 0, repo=repo.repo if repo else "",
            lookup_texts=repo.lookup_texts if repo else (), max_tokens=engine.max_tokens,
            context_tokens=engine.context_tokens, scope=settings.scope, drafter=engine.drafter,
            temperature=settings.temperature, draft_hint=self.typing_along.draft_hint(doc.uri, prefix),
            time_limit_s=settings.max_time_ms / 1000 if settings.max_time_ms else None)

    def submit(self, request: CompletionRequest, version: int, idle: bool = False) -> Job | None:
        try:
            return self.host.submit(request, version, idle=idle)
        except EngineNotReady:
            return None
        except Exception:
            log.exception("the engine refused a request for %s", request.document)
            return None

    def record_stats(self, stats: dict) -> None:
        self.last_stats = stats

    def indent(self, doc: OpenDocument) -> IndentStyle:
        cached = self._indent_cache.get(doc.uri)
        if cached is None or cached[0] != doc.version:
            cached = (doc.version, detect_indent(doc.text))
            self._indent_cache[doc.uri] = cached
        return cached[1]

    # ---- document events -----------------------------------------------------------------------

    def document_closed(self, uri: str) -> None:
        self.typing_along.forget(uri)
        self._indent_cache.pop(uri, None)

    # ---- acceptance (suggestions.SentItems) ------------------------------------------------------

    def accepted(self, arguments: Sequence[object]) -> None:
        if (taken := self.items.accepted(arguments)) is not None:
            self.typing_along.taken(taken)

    def partially_accepted(self, arguments: Sequence[object]) -> None:
        if (taken := self.items.partially_accepted(arguments)) is not None:
            self.typing_along.taken(taken)
