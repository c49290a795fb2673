"""The workspace index: every source file the model may see (decoding/repository/files.py), cut
into overlapping windows of lines for similarity search, with the names each file defines.

Built on a background thread from the client's workspace folders and kept current from saves,
edits of open documents and `workspace/didChangeWatchedFiles`. Memory is bounded by FileLimits; a
completion never waits for it (it uses what is indexed so far).
"""
from __future__ import annotations

import logging
import threading
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from decoding.languages import language_from_path
from decoding.repository.files import FileLimits, ignored_by_git, inside, readable_source, workspace_files
from decoding.repository.symbols import Definition, definitions, identifiers

log = logging.getLogger(__name__)

WINDOW_LINES = 20  # Copilot's neighbouring-snippet windows are about this size
WINDOW_STEP = 10
# A word in more windows than this says little about which window is alike (`self`, `return`): its
# posting list is left out of a query, which keeps a query to milliseconds in a large workspace.
COMMON_WORD_WINDOWS = 2000


@dataclass
class IndexedFile:
    path: str  # workspace-relative, / separators
    language: str
    text: str
    window_ids: list[int]  # its windows in the WindowIndex
    definitions: list[Definition]


def windows_of(text: str) -> list[tuple[int, frozenset[str]]]:
    lines = text.split("\n")
    out = []
    for start in range(0, max(1, len(lines) - WINDOW_LINES // 2), WINDOW_STEP):
        words = frozenset(identifiers("\n".join(lines[start:start + WINDOW_LINES])))
        if words:
            out.append((start, words))
    return out


class WindowIndex:
    """Every window's identifiers as an inverted index (word -> window ids), for similarity queries
    that touch only the windows sharing a word with the query. A removed file's windows are marked
    dead and dropped from the posting lists when they are a third of them."""

    def __init__(self) -> None:
        self.postings: dict[str, array] = {}
        self.path: list[str | None] = []  # window id -> its file (None: removed)
        self.start: array = array("I")  # window id -> its first line
        self.size: array = array("I")  # window id -> how many distinct identifiers it has
        self.dead = 0

    def add(self, path: str, windows: list[tuple[int, frozenset[str]]]) -> list[int]:
        ids = []
        for start, words in windows:
            wid = len(self.path)
            self.path.append(path)
            self.start.append(start)
            self.size.append(len(words))
            for w in words:
                self.postings.setdefault(w, array("I")).append(wid)
            ids.append(wid)
        return ids

    def remove(self, ids: list[int]) -> None:
        for wid in ids:
            self.path[wid] = None
        self.dead += len(ids)
        if self.dead * 3 > len(self.path):
            self._compact()

    def _compact(self) -> None:
        alive = self.path
        for w in list(self.postings):
            kept = array("I", (i for i in self.postings[w] if alive[i] is not None))
            if kept:
                self.postings[w] = kept
            else:
                del self.postings[w]
        self.dead = 0

    def query(self, words: frozenset[str]) -> list[tuple[float, str, int]]:
        """(Jaccard similarity over the words counted, path, first line) of every live window sharing
        an uncommon word with `words`, most similar first."""
        hits: Counter = Counter()
        for w in words:
            plist = self.postings.get(w)
            if plist is not None and len(plist) <= COMMON_WORD_WINDOWS:
                hits.update(plist)
        out = []
        n = len(words)
        for wid, inter in hits.items():
            path = self.path[wid]
            if path is not None:
                out.append((inter / (n + self.size[wid] - inter), path, self.start[wid]))
        out.sort(key=lambda x: -x[0])
        return out


def family(language: str) -> str:
    """Languages whose files may serve each other's completions."""
    for group in (("javascript", "typescript", "javascriptreact", "typescriptreact"), ("c", "cpp")):
        if language in group:
            return group[0]
    return language


@dataclass
class IndexStats:
    files: int = 0
    bytes: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # why -> how many files
    build_s: float | None = None
    updates: int = 0
    truncated: bool = False  # FileLimits stopped the walk

    def to_dict(self) -> dict:
        return {"files": self.files, "bytes": self.bytes, "skipped": dict(self.skipped), "buildS": self.build_s,
                "updates": self.updates, "truncated": self.truncated}


class WorkspaceIndex:
    def __init__(self, limits: FileLimits | None = None) -> None:
        self.limits = limits or FileLimits()
        self.folders: list[Path] = []
        self.files: dict[str, IndexedFile] = {}  # workspace-relative path -> file
        self.symbols: dict[str, list[Definition]] = {}
        self.windows = WindowIndex()
        self.stats = IndexStats()
        self.generation = 0  # bumped on every change: a selection made before it may be stale
        self.open_texts: dict[str, str] = {}  # path -> an open document's text, which wins over the disk's
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.built = threading.Event()

    # ---- building -----------------------------------------------------------------------------
    def start(self, folders: list[str]) -> None:
        """Index these folders on a background thread (again, if they changed)."""
        resolved = sorted({Path(f).resolve() for f in folders if Path(f).is_dir()})
        if resolved == self.folders and (self._thread is not None):
            return
        self.close()
        self._stop = threading.Event()
        self.built = threading.Event()
        with self._lock:
            self.folders, self.files, self.symbols, self.stats = resolved, {}, {}, IndexStats()
            self.windows = WindowIndex()
            self.generation += 1
        self._thread = threading.Thread(target=self._build, name="draftwise-index", daemon=True)
        self._thread.start()

    def _build(self) -> None:
        started = time.monotonic()
        try:
            for path in workspace_files(self.folders):
                if self._stop.is_set():
                    return
                with self._lock:
                    if self.stats.files >= self.limits.max_files or self.stats.bytes >= self.limits.max_total_bytes:
                        self.stats.truncated = True
                        break
                self._add(path, self.open_texts.get(str(path)))
            for path, text in list(self.open_texts.items()):  # open documents not saved yet
                if self.relative(Path(path)) not in self.files:
                    self._add(Path(path), text)
            self.stats.build_s = round(time.monotonic() - started, 2)
            log.info("workspace index: %d files, %d KiB in %.1f s (skipped: %s)", self.stats.files,
                     self.stats.bytes >> 10, self.stats.build_s, self.stats.skipped)
        except Exception:  # noqa: BLE001 - the index is a help, never a reason to stop serving
            log.exception("workspace index failed")
        finally:
            self.built.set()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    # ---- keeping it current -------------------------------------------------------------------
    def relative(self, path: Path) -> str | None:
        root = inside(path, self.folders)
        return None if root is None else path.resolve().relative_to(root).as_posix()

    def _add(self, path: Path, text: str | None = None) -> bool:
        relative = self.relative(path)
        if relative is None:
            return False
        why = ""
        if text is None:
            text, why = readable_source(path, self.limits)
        elif not language_from_path(path.name):
            why = "unknown_language"
        if text is None or why:
            with self._lock:
                self.stats.skipped[why] = self.stats.skipped.get(why, 0) + 1
                self._drop(relative)  # a file that became too large, binary or generated leaves the index
            return False
        language = language_from_path(path.name)
        windows, found = windows_of(text), definitions(text, language, relative)
        with self._lock:
            self._drop(relative)
            entry = IndexedFile(relative, language, text, self.windows.add(relative, windows), found)
            self.files[relative] = entry
            for d in entry.definitions:
                self.symbols.setdefault(d.name, []).append(d)
            self.stats.files += 1
            self.stats.bytes += len(text)
            self.generation += 1
        return True

    def _drop(self, relative: str) -> None:
        old = self.files.pop(relative, None)
        if old is None:
            return
        self.windows.remove(old.window_ids)
        for d in old.definitions:
            kept = [x for x in self.symbols.get(d.name, ()) if x.path != relative]
            if kept:
                self.symbols[d.name] = kept
            else:
                self.symbols.pop(d.name, None)
        self.stats.files -= 1
        self.stats.bytes -= len(old.text)
        self.generation += 1

    def update(self, path: str, text: str | None = None) -> bool:
        """A file changed (saved, edited while open, or reported by the client's file watcher): read
        it again, or take `text` (an open document's). Returns whether the index holds it now."""
        p = Path(path)
        if text is not None:
            self.open_texts[str(p.resolve())] = text
        else:
            self.open_texts.pop(str(p.resolve()), None)
        if not self.folders or ignored_by_git(p, self.folders):
            return False
        with self._lock:
            self.stats.updates += 1
            full = (self.stats.files >= self.limits.max_files or
                    self.stats.bytes + len(text or "") >= self.limits.max_total_bytes)
            relative = self.relative(p)
            if full and relative not in self.files:
                return False
        if text is not None and len(text.encode("utf-8", "replace")) > self.limits.max_file_bytes:
            text = None  # an open document too large for the index: read as a file, it is left out
        if text is None and not p.exists():
            self.remove(path)
            return False
        return self._add(p, text)

    def remove(self, path: str) -> None:
        relative = self.relative(Path(path))
        if relative is not None:
            with self._lock:
                self._drop(relative)

    # ---- reading ------------------------------------------------------------------------------
    def snapshot(self) -> tuple[int, list[IndexedFile]]:
        with self._lock:
            return self.generation, list(self.files.values())

    def similar(self, words: frozenset[str]) -> list[tuple[float, IndexedFile, int]]:
        """(similarity, file, first line) of the windows most like `words`, most similar first."""
        with self._lock:
            return [(score, self.files[path], start) for score, path, start in self.windows.query(words)
                    if path in self.files]

    def defined(self, name: str) -> list[Definition]:
        with self._lock:
            return list(self.symbols.get(name, ()))
