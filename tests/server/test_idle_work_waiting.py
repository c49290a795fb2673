"""A read-ahead asked while the engine loads waits for it (lsp_server/idle_work.py): once it is ready the
latest one runs, unless the document changed, closed or is no longer wanted meanwhile. The engine and
typing along are stand-ins that record what idle work asks of them: this is the bookkeeping alone
(tests/server/test_server_read_ahead.py runs the real server)."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from lsp_server.config import Settings
from lsp_server.documents import DocumentStore, OpenDocument
from lsp_server.idle_work import IdleWork


class Host:
    def __init__(self):
        self.ready, self.prepared = False, []

    def prepare(self, request):
        self.prepared.append(request)


def idle_work(settings: Settings):
    documents = DocumentStore()
    # Typing along would compute nothing ahead: each request stands for its prompt, read ahead.
    typing_along = SimpleNamespace(prediction_covers=lambda doc, offset: False,
                                   idle_request=lambda doc, offset: ((doc.uri, doc.version, offset), False),
                                   predict_at=lambda doc, offset, ended: (doc.uri, doc.version, offset))
    host = Host()
    holder = {"settings": settings}
    return IdleWork(typing_along, documents, host, lambda: holder["settings"]), documents, host, holder


def opened(documents: DocumentStore, uri="file:///a.py", text="def f():\n    return 1\n") -> OpenDocument:
    return documents.open(uri, "python", 1, text)


def test_the_read_ahead_asked_while_loading_runs_once_the_engine_is_ready():
    work, documents, host, _ = idle_work(Settings())
    doc = opened(documents)
    work.document_opened(doc)
    assert host.prepared == []  # still loading: kept for later
    host.ready = True
    work.engine_ready()
    assert host.prepared == [(doc.uri, 1, len(doc.text))]


def test_a_document_edited_while_loading_is_read_ahead_where_the_edit_left_the_cursor():
    work, documents, host, _ = idle_work(Settings())
    doc = opened(documents)
    work.document_opened(doc)
    doc.version, doc.text, doc.edit_end = 2, "x" + doc.text, 1  # the kept offset points into an older text
    host.ready = True
    work.engine_ready()
    assert host.prepared == [(doc.uri, 2, 1)]


def test_a_document_closed_or_no_longer_wanted_while_loading_is_not_read_ahead():
    work, documents, host, holder = idle_work(Settings())
    doc = opened(documents)
    work.document_opened(doc)
    holder["settings"] = replace(Settings(), idle_work=False)  # turned off while the model loaded
    host.ready = True
    work.engine_ready()
    assert host.prepared == []

    holder["settings"] = Settings()
    host.ready = False
    work.document_opened(doc)
    opened(documents, doc.uri)  # closed and opened again: another document now
    host.ready = True
    work.engine_ready()
    assert host.prepared == []


def test_the_latest_edit_while_loading_is_where_idle_work_starts_once_ready():
    work, documents, host, _ = idle_work(Settings())
    first, second = opened(documents, "file:///a.py"), opened(documents, "file:///b.py")
    work.document_opened(first)
    work.document_opened(second)
    first.version, first.text, first.edit_end = 2, "y" + first.text, 1  # then an edit in the first
    work.document_changed(first)
    host.ready = True
    work.engine_ready()
    assert host.prepared == [("file:///a.py", 2, 1)]
