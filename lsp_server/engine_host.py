"""The engine as the server sees it: loaded in the background, asked for completions, cancelled when
a request goes stale, replaced when the models change.

Runs on the server's event loop; the engine does its work on its own worker thread. Anything the
engine calls back from that thread (load progress) is handed to the loop before it touches the
connection.
"""
from __future__ import annotations

import asyncio
import importlib
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from decoding.api import CompletionEngine, CompletionRequest
from decoding.errors import DraftwiseError, EngineNotReady
from decoding.remote import engine_class
from lsp_server.config import Settings
from lsp_server.progress import LoadProgress

if TYPE_CHECKING:
    from decoding.jobs import Job

log = logging.getLogger(__name__)

IDLE, LOADING, READY, FAILED = "idle", "loading", "ready", "failed"


class EngineHost:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.state = IDLE
        self.error: str | None = None
        self._engine: CompletionEngine | None = None  # in-process or remote: decoding.api's one interface
        self._closed = False  # shut down: load nothing more
        self._load_lock = asyncio.Lock()
        # Told (on the event loop) when a remote engine's server fails or comes back: (level, sentence).
        self.on_notice: Callable[[str, str], None] | None = None

    @property
    def ready(self) -> bool:
        return self.state == READY

    @property
    def repo_context_pays(self) -> bool:
        """The loaded model's verdict on the repository as context (`repoContext: "auto"`); False until
        a model is ready."""
        if not self.ready or self._engine is None:
            return False
        return bool((self._engine.info().get("repo_context") or {}).get("pays"))

    # ---- loading -------------------------------------------------------------------------------

    async def configure(self, settings: Settings, progress: LoadProgress | None = None) -> bool | None:
        """Use these settings: loads the models the first time and whenever models or prompt budget
        change, and again after a failed load (the user may have fixed what failed). Returns whether a
        load it ran succeeded; None when nothing had to load. Failure is recorded in state/error,
        never raised. Loads run one at a time, in the order asked."""
        async with self._load_lock:
            if self._closed:
                return None
            needs_engine = self.state in (IDLE, FAILED) or self.settings.needs_reload(settings)
            self.settings = settings
            if not needs_engine:
                return None
            await self._close_engine()
            return await self._load(progress)

    async def _load(self, progress: LoadProgress | None) -> bool:
        loop = asyncio.get_running_loop()
        config = self.settings.engine
        self.state, self.error = LOADING, None
        started = time.monotonic()
        log.info("loading models: target=%s draft=%s device=%s weights=%s",
                 config.target, config.draft, config.device, config.weights)

        def on_progress(message: str, fraction: float | None) -> None:  # engine worker thread
            log.info("load: %s", message)
            if progress is not None:
                loop.call_soon_threadsafe(progress.report, message, fraction)

        try:
            if progress is not None:
                await progress.begin(f"loading {config.target}")
            # Importing the engine pulls in torch and transformers (seconds): off the event loop.
            module_name, class_name = engine_class(config.target)
            module = await loop.run_in_executor(None, importlib.import_module, module_name)
            if not self._closed:  # shutdown during the import: load nothing
                self._engine = getattr(module, class_name)(config)
                if hasattr(self._engine, "on_health"):  # a remote engine: its server's health changes
                    self._engine.on_health = lambda level, text: loop.call_soon_threadsafe(self._notice, level, text)
                await asyncio.wrap_future(self._engine.start_loading(on_progress))
        except DraftwiseError as err:
            self._fail(str(err))
        except Exception as err:  # a bug or an unexpected library error: keep serving, say why
            log.exception("model load failed")
            self._fail(f"loading {config.target} failed: {type(err).__name__}: {err}")
        else:
            if self._closed:
                log.info("models not loaded: the server shut down")
            else:
                self.state = READY
                info = self._info()
                log.info("models ready in %.1f s: target=%s draft=%s device=%s weights=%s (%s)",
                         time.monotonic() - started, info.get("target", config.target),
                         info.get("draft", config.draft), info.get("device"), info.get("weights"),
                         info.get("weights_reason"))
        if progress is not None:
            progress.end("ready" if self.ready else "shut down" if self._closed else f"failed: {self.error}")
        return self.ready

    def _notice(self, level: str, text: str) -> None:
        if self.on_notice is not None and not self._closed:
            self.on_notice(level, text)

    def _fail(self, why: str) -> None:
        if self._closed:  # a load that a shutdown interrupted did not fail
            self.state, self._engine = IDLE, None
            log.info("model load stopped by shutdown (%s)", why)
            return
        self.state, self.error = FAILED, why
        log.error("model load failed: %s", why)
        # A half-loaded engine may still hold memory; let it go (configure() loads a new one).
        engine, self._engine = self._engine, None
        if engine is not None:
            try:
                engine.close()
            except Exception:
                log.debug("closing the failed engine raised", exc_info=True)

    # ---- requests ------------------------------------------------------------------------------

    def submit(self, request: CompletionRequest, version: int, idle: bool = False) -> Job:
        """Queue a completion; the engine cancels this document's previous job (latest wins).
        idle: a prefetch nobody waits for, cancelled by any other request."""
        if not self.ready or self._engine is None:
            raise EngineNotReady(f"the model is not ready (state {self.state})")
        return self._engine.submit(request, version=version, idle=idle)

    def prepare(self, request: CompletionRequest) -> Job | None:
        """Idle work: read this request's prompt into the caches ahead (None when no engine is ready)."""
        if not self.ready or self._engine is None:
            return None
        return self._engine.prepare(request)

    def document_changed(self, document: str, version: int, keep=None) -> None:
        """The document moved past the version its running job was made for: stop that job now,
        unless it is `keep` (idle work's suggestion that a request joined, which the user is typing)."""
        if self._engine is not None:
            self._engine.jobs.document_changed(document, version, keep)

    def document_closed(self, document: str) -> None:
        if self._engine is not None:
            self._engine.jobs.document_closed(document)

    def cancel_all(self) -> None:
        if self._engine is not None:
            self._engine.jobs.cancel_all()

    # ---- reporting -----------------------------------------------------------------------------

    def _info(self) -> dict[str, Any]:
        if self._engine is None:
            return {}
        try:
            return self._engine.info()
        except Exception:  # info() of a half-loaded engine must not break stats
            log.debug("engine.info() failed", exc_info=True)
            return {}

    def stats(self) -> dict[str, Any]:
        config = self.settings.engine
        info = self._info()
        engine_stats: dict[str, Any] = {}
        if self._engine is not None:
            try:
                engine_stats = self._engine.stats()
            except Exception:
                log.debug("engine.stats() failed", exc_info=True)
        state, error, remote = self.state, self.error, engine_stats.get("remote")
        if remote and state == READY and remote.get("problem"):
            state, error = "unavailable", remote["problem"]  # a remote engine's server is down or refusing
        return {
            "state": state,
            "error": error,
            "target": info.get("target") or config.target,
            "targetChoice": info.get("target_choice"),  # with `target: auto`: which model, and why
            "draft": info.get("draft", config.draft),
            "drafter": config.drafter,
            "device": info.get("device") or config.device,
            "dtype": info.get("dtype") or config.dtype,
            "weights": info.get("weights") or config.weights,
            "kernel": info.get("kernel"),  # what runs the format here: kernel, ISA, forward code's hash
            "weightsReason": info.get("weights_reason"),
            "draftWeights": info.get("draft_weights") or (config.draft_weights if config.draft else None),
            "draftLoaded": bool(info.get("draft_loaded")),  # `draft` is what was asked; this, what is held
            "fimTemplate": info.get("fim_template"),
            "draftNote": info.get("draft_note") or None,
            "draftingOff": info.get("drafting_off") or None,
            # `repoContext: "auto"`: whether the repository as context pays for this model, and the measurement
            "repoContextPays": info.get("repo_context"),
            "last": engine_stats.get("last"),
            "cumulative": engine_stats.get("cumulative", {}),
            "requests": engine_stats.get("requests", 0),
            # idle work: prompt tokens read ahead, read-aheads and prefetches run, how many were cancelled
            "idle": engine_stats.get("idle", {}),
            # prompt tokens each request read, not found in the KV cache (median and mean of the last ones)
            "promptRead": engine_stats.get("prompt_read"),
            # the job computing now (document, idle or not, characters written so far), or None
            "running": engine_stats.get("running"),
            "remote": remote,
            # the exactness probe's verdict (listed last: the editors' stats views show the request
            # figures first)
            "verify": info.get("verify"),
            # what the prompt shows after the cursor (`suffix`): the lines after it or its line's rest, and
            # why (after the request figures too)
            "suffix": info.get("suffix"),
        }

    # ---- shutdown ------------------------------------------------------------------------------

    async def _close_engine(self) -> None:
        self.cancel_all()
        engine, self._engine = self._engine, None
        self.state = IDLE
        if engine is not None:
            await asyncio.get_running_loop().run_in_executor(None, engine.close)

    async def close(self, wait_s: float = 2.0) -> None:
        """Stop the engine for shutdown, waiting at most wait_s: not behind the load lock, and not
        until a model load in progress finishes (the engine's thread is a daemon; exit ends it)."""
        self._closed = True
        self.cancel_all()
        engine, self._engine = self._engine, None
        self.state = IDLE
        if engine is None:
            return
        closed = threading.Event()

        def close_engine() -> None:
            try:
                engine.close()
            finally:
                closed.set()

        threading.Thread(target=close_engine, name="draftwise-engine-close", daemon=True).start()
        await asyncio.get_running_loop().run_in_executor(None, closed.wait, wait_s)
