"""Submitted requests: a Job to cancel or await, the one registry of each document's latest job (a
newer request for a document, or an edit past the version a job was made for, stops the old one inside
the verify loop), and the one thread that runs the models."""
from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from typing import Callable

from decoding.api import CancelToken, CompletionRequest, CompletionResult
from decoding.errors import DraftwiseError
from decoding.agreement import agrees


class Job:
    """One submitted request: cancel it from any thread, await it from asyncio."""

    tells_text = True  # the engine reports its text as it is generated (saw)

    def __init__(self, request: CompletionRequest, cancel: CancelToken | None = None, version: int = 0,
                 idle: bool = False, prompt_only: bool = False):
        self.request = request
        self.prompt_only = prompt_only  # reads the prompt ahead (Engine.prepare); its result is a count
        self.version = version  # the document version the request was made for
        self.idle = idle  # idle work: any request a user waits for cancels it (or joins it: Engine.submit)
        self.cancel_token = cancel or CancelToken()
        self.recorded = None  # the engine's stats of its result, once counted (Engine._record)
        self.text_so_far = ""  # the completion's text as generated so far (set by the worker thread)
        # Text the completion must begin with to be of any use (what the user has typed since it
        # started: lsp_server/idle_work.py); it stops itself, `diverged`, once it writes otherwise.
        self.must_begin_with = ""
        self.diverged = False
        self.future: concurrent.futures.Future = concurrent.futures.Future()

    def cancel(self) -> None:
        self.cancel_token.cancel()

    def saw(self, text: str) -> None:
        self.text_so_far = text
        self._stop_if_diverged()

    def expect(self, typed: str) -> None:
        """From now on the completion must begin with `typed`; stop it at once if it does not."""
        self.must_begin_with = typed
        self._stop_if_diverged()

    def _stop_if_diverged(self) -> None:
        if not agrees(self.text_so_far, self.must_begin_with):
            self.diverged = True
            self.cancel()

    def result(self, timeout: float | None = None) -> CompletionResult:
        return self.future.result(timeout)

    def __await__(self):
        # Shielded: cancelling the awaiting task must not cancel the engine's future (call cancel()
        # to stop the generation; the job then resolves with stopped="cancelled").
        return asyncio.shield(asyncio.wrap_future(self.future)).__await__()


class JobRegistry:
    """The latest job per document, and the latest idle job per document; thread-safe (the worker
    settles jobs, the server adds them). A job the user waits for cancels every idle job: there is
    one worker thread, and idle work must never delay a real request by more than one forward."""

    def __init__(self) -> None:
        self._latest: dict[str, Job] = {}
        self._idle: dict[str, Job] = {}
        # Idle jobs that ended uncancelled, until the user asks for them (claim_idle) or newer work
        # for their document replaces them: a suggestion computed before the editor asked.
        self._idle_done: dict[str, Job] = {}
        self._lock = threading.Lock()

    def add(self, job: Job) -> None:
        """Register job as its document's latest; the previous one is cancelled (latest wins)."""
        with self._lock:
            old = self._register(job)
        for job in old:
            job.cancel()

    def _register(self, job: Job) -> list[Job]:
        """Under the lock: job becomes its document's latest (or latest idle) job; the jobs to cancel."""
        document = job.request.document
        self._idle_done.pop(document, None)
        table = self._idle if job.idle else self._latest
        previous = table.get(document)
        table[document] = job
        idle = [] if job.idle else list(self._idle.values())
        if not job.idle:
            self._idle.clear()
        return [j for j in (previous, *idle) if j is not None]

    def idle_for(self, request: CompletionRequest) -> Job | None:
        """A job idle work can take instead of starting `request` again: the document's idle job
        computing exactly it (running, or ended uncancelled), or the running request the user waits
        for, if it is the same."""
        with self._lock:
            latest = self._latest.get(request.document)
            if latest is not None and latest.request == request and not latest.cancel_token.cancelled:
                return latest
            return self._idle_computing(request)

    def _idle_computing(self, request: CompletionRequest) -> Job | None:
        job = self._idle.get(request.document) or self._idle_done.get(request.document)
        if job is None or job.prompt_only or job.cancel_token.cancelled or job.request != request:
            return None
        return job

    def claim_idle(self, request: CompletionRequest, version: int) -> Job | None:
        """The document's idle job, running or ended, if it computes exactly `request`: the user now
        waits for it, so it becomes the document's latest job for `version` (cancelled by newer
        requests and edits like any) instead of being cancelled and started over. None when there is
        no such job. The caller counts it as a request (Engine._join_idle)."""
        document = request.document
        with self._lock:
            running = self._idle.get(document)
            job = self._idle_computing(request)
            if job is None:
                return None
            job.idle, job.version = False, version
            if job is running:
                del self._idle[document]
                old = self._register(job)
            else:  # it has ended: nothing to register or cancel
                del self._idle_done[document]
                old = []
        for other in old:
            other.cancel()
        return job

    def done(self, job: Job) -> None:
        document = job.request.document
        with self._lock:
            table = self._idle if job.idle else self._latest
            if table.get(document) is job:
                del table[document]
                if job.idle and not job.prompt_only and not job.cancel_token.cancelled:
                    self._idle_done[document] = job

    def document_changed(self, document: str, version: int, keep: Job | None = None) -> None:
        """The document moved past the version its running job was made for: stop that job now
        (unless it is `keep`: the caller knows its answer still holds after the edit)."""
        with self._lock:
            job = self._latest.get(document)
            if job is None or job.version >= version or job is keep:
                return
            del self._latest[document]
        job.cancel()

    def document_closed(self, document: str) -> None:
        with self._lock:
            jobs = [self._latest.pop(document, None), self._idle.pop(document, None)]
            self._idle_done.pop(document, None)
        for job in jobs:
            if job is not None:
                job.cancel()

    def cancel_all(self) -> None:
        with self._lock:
            jobs = [*self._latest.values(), *self._idle.values()]
            self._latest, self._idle, self._idle_done = {}, {}, {}
        for job in jobs:
            job.cancel()

    def __len__(self) -> int:
        return len(self._latest) + len(self._idle)


class ModelWorker:
    """Runs tasks in order, each resolving a future, on the one model thread of this process.

    Every engine in a process shares that thread (a benchmark holds several, a server one at a time):
    torch's OpenMP pool belongs to the thread that calls it, and once a process has more pool threads
    than CPUs, libgomp shortens its spin-waits, so each of the few thousand small ops of a decode step
    pays a wake-up. Measured on 2 cores: a second engine's thread made every decode step 1.6x slower."""

    _queue: queue.Queue = queue.Queue()
    _thread: threading.Thread | None = None
    _start_lock = threading.Lock()

    def __init__(self, name: str = "draftwise-engine") -> None:
        self._name = name
        self._closed = False

    @classmethod
    def run_here(cls) -> bool:
        """Whether the caller is on the model thread."""
        return threading.current_thread() is cls._thread

    def call(self, fn: Callable[[], object]) -> concurrent.futures.Future:
        if self._closed:
            raise DraftwiseError("the engine is closed")
        with ModelWorker._start_lock:
            if ModelWorker._thread is None:
                ModelWorker._thread = threading.Thread(target=ModelWorker._work, name=self._name, daemon=True)
                ModelWorker._thread.start()
        future: concurrent.futures.Future = concurrent.futures.Future()
        ModelWorker._queue.put((fn, future))
        return future

    @staticmethod
    def _work() -> None:
        import torch

        with torch.inference_mode():
            while True:
                fn, future = ModelWorker._queue.get()
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    future.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
                    future.set_exception(exc)

    def close(self, timeout: float = 30) -> None:
        """Let this engine's queued tasks finish (waiting at most `timeout`); the thread stays for others."""
        if self._closed:
            return
        last = None if self.run_here() or ModelWorker._thread is None else self.call(lambda: None)
        self._closed = True
        if last is not None:
            try:
                last.result(timeout=timeout)
            except concurrent.futures.TimeoutError:
                pass
