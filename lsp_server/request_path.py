"""What typing along (typing_along.py, prediction.py) needs from the request path that Completions
(completions.py) runs. One object with named methods rather than a callback each, so that a reader
can follow a call from typing along to the code that answers it."""
from __future__ import annotations

from typing import Protocol

from decoding.api import CompletionRequest
from decoding.jobs import Job
from lsp_server.cursor import Cursor
from lsp_server.documents import OpenDocument
from lsp_server.postprocess import IndentStyle
from lsp_server.suggestions import Suggestion


class RequestPath(Protocol):
    def request_at(self, doc: OpenDocument, prefix: str, suffix: str) -> CompletionRequest:
        """The request the editor would send with the cursor at prefix|suffix."""

    def submit(self, request: CompletionRequest, version: int, idle: bool = False) -> Job | None:
        """The engine's job for a request made for a document version; None where the engine refuses
        it (not loaded, or a bad request: logged)."""

    def shaped(self, cursor: Cursor, text: str, instant: bool) -> Suggestion | None:
        """The item the editor is sent for `text` at the cursor (counted as shown); None where the
        text shapes to nothing or would break the word before the cursor."""

    def indent(self, doc: OpenDocument) -> IndentStyle:
        """The document's indentation, which texts are shaped to."""

    def record_stats(self, stats: dict) -> None:
        """The engine's numbers for the text on screen, when typing along answered the request."""
