"""The language server: capabilities and one short handler per LSP method.

The logic lives elsewhere (see the package docstring); handlers only translate between LSP and it.
"""
from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import os
import sys
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from decoding.api import EngineConfig
from lsp_server.completions import Completions
from lsp_server.config import KNOWN_KEYS, SECTION as SETTINGS_SECTION, Settings, apply_settings
from lsp_server.documents import DocumentStore
from lsp_server.engine_host import EngineHost
from lsp_server.idle_work import IdleWork
from lsp_server.progress import LoadProgress
from lsp_server.protocol import DraftwiseProtocol, arrival_version
from lsp_server.repository_context import RepositoryService
from lsp_server.suggestions import ACCEPTED_COMMAND, PARTIALLY_ACCEPTED_COMMAND, completion_result, inline_result

log = logging.getLogger(__name__)

STATS_REQUEST = "draftwise/stats"
DOCUMENT_TEXT_REQUEST = "draftwise/documentText"
CURSOR_NOTIFICATION = "draftwise/cursor"  # where the editor's cursor rests: idle work starts there

def _server_version() -> str:
    try:
        return importlib.metadata.version("draftwise")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree
        return "dev"


def plain_json(value: Any) -> Any:
    """Params of custom requests as plain JSON values (pygls hands them over as namedtuples)."""
    if hasattr(value, "_asdict"):
        return {k: plain_json(v) for k, v in value._asdict().items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(v) for v in value]
    return value


class DraftwiseServer(LanguageServer):
    def __init__(self, config: EngineConfig) -> None:
        super().__init__("draftwise", _server_version(), protocol_cls=DraftwiseProtocol,
                         text_document_sync_kind=types.TextDocumentSyncKind.Incremental)
        self.settings = Settings(engine=config)
        self.documents = DocumentStore()
        self.engine_host = EngineHost(self.settings)
        self.engine_host.on_notice = self.show_engine_notice
        self.repository = RepositoryService()
        self.completions = Completions(self.documents, self.engine_host, lambda: self.settings,
                                       self.workspace_folders, self.repository)
        self.idle_work = IdleWork(self.completions.typing_along, self.documents, self.engine_host,
                                  lambda: self.settings)
        self.client_has_inline_completion = False
        self.client_reads_markdown_docs = False
        self._pending_problems: list[str] = []
        self._tasks: set[asyncio.Task] = set()
        self._watching = False  # the file watcher is registered (once a session)

    def workspace_folders(self) -> list[str]:
        try:
            workspace = self.workspace
        except RuntimeError:  # before initialize
            return []
        uris = [f.uri for f in workspace.folders.values()] or ([workspace.root_uri] if workspace.root_uri else [])
        return [path for path in (to_fs_path(uri) for uri in uris) if path]

    def report_server_error(self, error: Exception, source) -> None:
        # pygls would pop up a message in the editor for each error; per keystroke that is unusable.
        log.error("%s: %s", getattr(source, "__name__", source), error)

    # ---- settings and loading ------------------------------------------------------------------

    def update_settings(self, raw: Any, where: str) -> Settings:
        update = apply_settings(self.settings, raw)
        if update.ignored:
            log.warning("ignoring unknown draftwise settings in %s: %s (known: %s)",
                        where, ", ".join(update.ignored), ", ".join(KNOWN_KEYS))
        for problem in update.problems:
            log.warning("%s", problem)
        self._pending_problems += update.problems
        return update.settings

    def show_pending_problems(self) -> None:
        if self._pending_problems:
            self.window_show_message(types.ShowMessageParams(
                type=types.MessageType.Error, message=" ".join(self._pending_problems)))
            self._pending_problems.clear()

    def show_engine_notice(self, level: str, text: str) -> None:
        """A remote engine's server failed or came back (once per change, never per request)."""
        kind = types.MessageType.Error if level == "error" else types.MessageType.Info
        self.window_show_message(types.ShowMessageParams(type=kind, message=f"draftwise: {text}"))

    def apply_configuration(self, raw: Any, where: str) -> None:
        self.settings = self.update_settings(raw, where)
        self.show_pending_problems()
        self.index_workspace()
        self.spawn(self.configure_engine(self.settings))  # reloads only when the models change

    @property
    def repo_context_on(self) -> bool:
        return self.settings.repo_context_on(self.engine_host.repo_context_pays)

    def index_workspace(self) -> None:
        """The repository context's index, over the workspace folders (in the background); with
        `repoContext: "auto"` once the loaded model is known to gain from it."""
        if self.repo_context_on:
            self.repository.start(self.workspace_folders())
        else:
            self.repository.close()

    def watch_files(self) -> None:
        """Ask the client to tell us of file changes outside the editor (a checkout, a generator)."""
        caps = getattr(self.protocol, "client_capabilities", None)
        watched = caps and caps.workspace and caps.workspace.did_change_watched_files
        if not (watched and watched.dynamic_registration and self.repo_context_on) or self._watching:
            return
        options = types.DidChangeWatchedFilesRegistrationOptions(watchers=[types.FileSystemWatcher(glob_pattern="**/*")])
        self._watching = True

        async def register() -> None:
            try:
                await self.client_register_capability_async(types.RegistrationParams(registrations=[
                    types.Registration(id="draftwise-watched-files", method=types.WORKSPACE_DID_CHANGE_WATCHED_FILES,
                                       register_options=options)]))
            except Exception as err:  # noqa: BLE001 - saves and opened files still keep the index current
                log.info("the client did not register the file watcher: %s", err)

        self.spawn(register())

    def client_serves_configuration(self) -> bool:
        caps = getattr(self.protocol, "client_capabilities", None)
        return bool(caps and caps.workspace and caps.workspace.configuration)

    async def pull_configuration(self) -> None:
        try:
            [section] = await self.workspace_configuration_async(types.ConfigurationParams(
                items=[types.ConfigurationItem(section=SETTINGS_SECTION)]))
        except Exception as err:  # the client could not answer; keep the settings we have
            log.warning("workspace/configuration failed: %s", err)
            return
        self.apply_configuration(plain_json(section), "workspace/configuration")

    def spawn(self, coroutine) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def configure_engine(self, settings: Settings) -> None:
        progress = LoadProgress(self, "draftwise: loading model")
        loaded = await self.engine_host.configure(settings, progress)
        if loaded:
            self.idle_work.engine_ready()
            self.index_workspace()  # `repoContext: "auto"` follows the model just loaded
            self.watch_files()
        if loaded is False:
            # Once per failed load: requests keep getting empty answers, stats say why.
            self.window_show_message(types.ShowMessageParams(
                type=types.MessageType.Error, message=f"draftwise: {self.engine_host.error}"))

    def document_at(self, params: Any, method: str):
        """The open document and the offset of the position (None without one) that a custom request's
        {"textDocument": {"uri"}, "position"?} name."""
        if not isinstance(params, dict) or not isinstance(params.get("textDocument"), dict) \
                or not isinstance(params["textDocument"].get("uri"), str):
            raise JsonRpcInvalidParams(f"{method} takes {{\"textDocument\": {{\"uri\": string}}, "
                                       f"\"position\"?: Position}}")
        uri = params["textDocument"]["uri"]
        doc = self.documents.get(uri)
        if doc is None:
            raise JsonRpcInvalidParams(f"document is not open: {uri}")
        offset = None
        if (position := params.get("position")) is not None:
            try:
                pos = types.Position(line=position["line"], character=position["character"])
            except (TypeError, KeyError, ValueError) as err:
                raise JsonRpcInvalidParams(f"position must be {{line, character}}: {err}") from err
            offset = doc.offset_at(pos, self.documents.encoding)
        return doc, offset

    def document_info(self, params: Any) -> dict[str, Any]:
        doc, offset = self.document_at(params, DOCUMENT_TEXT_REQUEST)
        info: dict[str, Any] = {"uri": doc.uri, "version": doc.version, "languageId": doc.language_id,
                                "text": doc.text, "positionEncoding": self.documents.encoding}
        if offset is not None:
            info["offset"] = offset
        return info

    def cursor_rested(self, params: Any) -> None:
        """draftwise/cursor: a notification, so bad params are logged, never answered."""
        try:
            doc, offset = self.document_at(params, CURSOR_NOTIFICATION)
        except JsonRpcInvalidParams as err:
            log.warning("%s ignored: %s", CURSOR_NOTIFICATION, err)
            return
        if offset is not None:
            self.idle_work.cursor_rested(doc, offset)

    def stats(self) -> dict[str, Any]:
        engine = self.engine_host.stats()
        return {**engine, "timing": last_timing(self.completions.last_stats), "readAhead": dict(self.idle_work.counts),
                "suggestions": self.completions.counts.to_dict(),
                "positionEncoding": self.documents.encoding, "openDocuments": len(self.documents),
                "repoContext": self.repository.stats() if self.repo_context_on else None}


def last_timing(last: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the editors show about the last suggestion an editor waited for (the engine's request,
    or the idle work link it was answered from; not type-ahead answers, nor runs that were
    cancelled): how long the engine took from request to text, its decoding speed (generated tokens
    per second of decoding, prompt reading excluded; None without tokens) and the share of its
    drafted tokens accepted."""
    if not last:
        return None
    prefill, decode = last.get("prefill_ms") or 0.0, last.get("decode_ms") or 0.0
    tokens = last.get("generated_tokens") or 0
    speed = round(tokens * 1000.0 / decode, 1) if decode > 0 and tokens > 0 else None
    return {"latencyMs": round(prefill + decode, 1), "firstTokenMs": last.get("first_token_ms"),
            "tokens": tokens, "tokensPerSecond": speed, "acceptanceRate": last.get("acceptance_rate")}


def create_server(config: EngineConfig) -> DraftwiseServer:
    server = DraftwiseServer(config)
    _add_life_cycle(server)
    _add_document_sync(server)
    _add_completions(server)
    _add_custom_requests(server)
    return server


def _add_life_cycle(server: DraftwiseServer) -> None:
    @server.feature(types.INITIALIZE)
    def initialize(ls: DraftwiseServer, params: types.InitializeParams) -> None:
        encoding = ls.workspace.position_encoding or types.PositionEncodingKind.Utf16
        ls.documents.encoding = getattr(encoding, "value", encoding)
        text_caps = params.capabilities.text_document
        ls.client_has_inline_completion = bool(text_caps and text_caps.inline_completion)
        item_caps = text_caps and text_caps.completion and text_caps.completion.completion_item
        ls.client_reads_markdown_docs = bool(
            item_caps and types.MarkupKind.Markdown in (item_caps.documentation_format or ()))
        ls.settings = ls.update_settings(params.initialization_options, "initializationOptions")

    @server.feature(types.INITIALIZED)
    def initialized(ls: DraftwiseServer, params: types.InitializedParams) -> None:
        ls.show_pending_problems()
        ls.spawn(ls.configure_engine(ls.settings))
        ls.index_workspace()
        ls.watch_files()

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    def did_change_configuration(ls: DraftwiseServer, params: types.DidChangeConfigurationParams) -> None:
        if params.settings is None and ls.client_serves_configuration():
            ls.spawn(ls.pull_configuration())  # the pull model: "something changed, ask me"
        else:
            ls.apply_configuration(params.settings, "workspace/didChangeConfiguration")

    @server.feature(types.WORKSPACE_DID_CHANGE_WORKSPACE_FOLDERS)
    def did_change_folders(ls: DraftwiseServer, params: types.DidChangeWorkspaceFoldersParams) -> None:
        ls.index_workspace()  # pygls has updated ls.workspace.folders

    @server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    def did_change_watched_files(ls: DraftwiseServer, params: types.DidChangeWatchedFilesParams) -> None:
        for change in params.changes:
            if ls.documents.get(change.uri) is not None:
                continue  # open: the editor's text is what counts, and didSave brings it
            if change.type == types.FileChangeType.Deleted:
                ls.repository.file_deleted(change.uri)
            else:
                ls.repository.file_changed(change.uri)

    @server.feature(types.SHUTDOWN)
    async def shutdown(ls: DraftwiseServer, params: None) -> None:
        ls.repository.close()
        ls.idle_work.close()
        await ls.engine_host.close(wait_s=2.0)


def _add_document_sync(server: DraftwiseServer) -> None:
    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: DraftwiseServer, params: types.DidOpenTextDocumentParams) -> None:
        doc = params.text_document
        opened = ls.documents.open(doc.uri, doc.language_id, doc.version, doc.text)
        ls.repository.file_changed(doc.uri, doc.text)  # the editor's text, saved or not
        ls.idle_work.document_opened(opened)  # its prompt read ahead before the first request

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: DraftwiseServer, params: types.DidChangeTextDocumentParams) -> None:
        doc = params.text_document
        changed = ls.documents.change(doc.uri, doc.version, params.content_changes)
        running_along = ls.idle_work.document_changed(changed)  # idle work's job the user types along, if any
        ls.engine_host.document_changed(doc.uri, doc.version, keep=running_along)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: DraftwiseServer, params: types.DidCloseTextDocumentParams) -> None:
        ls.documents.close(params.text_document.uri)
        ls.engine_host.document_closed(params.text_document.uri)
        ls.completions.document_closed(params.text_document.uri)
        ls.repository.document_closed(params.text_document.uri)
        ls.idle_work.document_closed(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: DraftwiseServer, params: types.DidSaveTextDocumentParams) -> None:
        doc = ls.documents.get(params.text_document.uri)
        ls.repository.file_changed(params.text_document.uri, doc.text if doc is not None else None)


def _add_completions(server: DraftwiseServer) -> None:
    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(ls: DraftwiseServer, params: types.InlineCompletionParams):
        suggestion = await ls.completions.suggest(
            params.text_document.uri, params.position, arrival_version=arrival_version.get(),
            selected=params.context.selected_completion_info,
            invoked=params.context.trigger_kind == types.InlineCompletionTriggerKind.Invoked)
        return inline_result(suggestion)

    @server.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions())
    async def completion(ls: DraftwiseServer, params: types.CompletionParams):
        if ls.client_has_inline_completion:
            # The client shows ghost text already; a popup item too would duplicate it, and its
            # request would cancel the inline one (one job per document).
            return completion_result(None)
        suggestion = await ls.completions.suggest(params.text_document.uri, params.position,
                                                  arrival_version=arrival_version.get())
        doc = ls.documents.get(params.text_document.uri)
        return completion_result(suggestion, doc.language_id if doc else "", ls.client_reads_markdown_docs)

    @server.command(ACCEPTED_COMMAND)
    def accepted(ls: DraftwiseServer, *arguments: Any) -> None:
        ls.completions.accepted(arguments)

    @server.command(PARTIALLY_ACCEPTED_COMMAND)
    def partially_accepted(ls: DraftwiseServer, *arguments: Any) -> None:
        ls.completions.partially_accepted(arguments)


def _add_custom_requests(server: DraftwiseServer) -> None:
    @server.feature(STATS_REQUEST)
    def stats(ls: DraftwiseServer, params: Any) -> dict[str, Any]:
        return ls.stats()

    @server.feature(DOCUMENT_TEXT_REQUEST)
    def document_text(ls: DraftwiseServer, params: Any) -> dict[str, Any]:
        # The server's copy of a document, for client authors checking their sync and encodings.
        return ls.document_info(plain_json(params))

    @server.feature(CURSOR_NOTIFICATION)
    def cursor(ls: DraftwiseServer, params: Any) -> None:
        ls.cursor_rested(plain_json(params))


def _protocol_stdout():
    """A private handle on the real stdout for LSP messages, with fd 1 pointed at stderr: a stray
    print (or a C library writing to fd 1) then ends up in the log instead of corrupting the stream."""
    sys.stdout.flush()
    protocol_out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    return protocol_out


def run(config: EngineConfig, *, tcp: tuple[str, int] | None = None, allow_remote: bool = False) -> int:
    """Serve LSP over stdio (tcp=None) or TCP until the client says exit; the exit code LSP asks for
    (0 after shutdown, 1 without)."""
    from lsp_server.transport import check_listen_host, serve_stdio, serve_tcp

    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        # pygls logs every message body (whole documents) at INFO.
        logging.getLogger("pygls").setLevel(logging.WARNING)
    server = create_server(config)
    if tcp is not None:
        host, port = tcp
        check_listen_host(host, allow_remote)
        return serve_tcp(server, host, port)
    return serve_stdio(server, sys.stdin.buffer, _protocol_stdout())
