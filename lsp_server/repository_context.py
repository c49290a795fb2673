"""The repository context as the server uses it: one index for the workspace folders, kept current
from the client's notifications, and each request's selection with a record of what it showed."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from decoding.api import ContextFile
from lsp_server.documents import uri_to_path
from decoding.repository.index import WorkspaceIndex
from decoding.repository.selection import ContextSelector

@dataclass(frozen=True)
class RepositoryContext:
    files: tuple[ContextFile, ...]
    lookup_texts: tuple[str, ...]
    repo: str  # the workspace folder's name, the model's <|repo_name|>


class RepositoryService:
    def __init__(self) -> None:
        self.index = WorkspaceIndex()
        self.selector = ContextSelector(self.index)
        self.last: dict | None = None  # what the last request showed, for draftwise/stats

    def start(self, folders: Sequence[str]) -> None:
        if folders:
            self.index.start(list(folders))

    def close(self) -> None:
        self.index.close()

    def file_changed(self, uri: str, text: str | None = None) -> None:
        """A save, an open document's text, or a watched-file event (text None: read the disk)."""
        path = uri_to_path(uri)
        if path is not None and self.index.folders:
            self.index.update(path, text)

    def file_deleted(self, uri: str) -> None:
        path = uri_to_path(uri)
        if path is not None and self.index.folders:
            self.index.remove(path)

    def document_closed(self, uri: str) -> None:
        self.selector.forget(uri)
        self.file_changed(uri)  # back to what is on disk: unsaved edits are gone with the editor's buffer

    def context_for(self, uri: str, language: str, prefix: str, budget_tokens: int) -> RepositoryContext | None:
        """The request's repository context; None when the document is outside the workspace."""
        path = uri_to_path(uri)
        relative = self.index.relative(Path(path)) if path and self.index.folders else None
        if relative is None:
            return None
        selection = self.selector.for_request(uri, relative, language, prefix, budget_tokens)
        root = next((f for f in self.index.folders if Path(path).resolve().is_relative_to(f)), None)
        self.last = {"document": relative, "sections": selection.describe(), "lookupFiles": len(selection.lookup_texts)}
        return RepositoryContext(tuple(selection.context_files()), selection.lookup_texts, root.name if root else "")

    def stats(self) -> dict:
        building = bool(self.index.folders) and not self.index.built.is_set()
        return {"index": {**self.index.stats.to_dict(), "building": building},
                "selections": dict(self.selector.counts), "last": self.last}
