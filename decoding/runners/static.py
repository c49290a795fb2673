"""The quantized formats (int8, int4) on the static-shape forward (decoding/models/static_decoder.py):
one KV buffer per model holds the live cache in place, saved caches are copies of its first n
positions, and every verify row is a decode step bit for bit (the exactness probe checks it).

With `compile` on, the forwards a request waits on token by token (decode steps, verify forwards)
run on graphs torch.compile built (decoding/models/compiled_forward.py); prompts are still read by
the eager forward. The graphs are built on a thread of their own while the eager forward serves, and
go live between two requests (go_live), so that one request never mixes the two paths."""
from __future__ import annotations

import contextlib
import logging
import threading
import time

import torch

from decoding.runners.base import OneLiveCache

log = logging.getLogger(__name__)

# Prefill chunk: the int8 matmul costs about as much per token at 128 rows as at 512 (oneDNN's
# blocking), and a smaller chunk lets a cancel land sooner.
STATIC_PREFILL_CHUNK = 256


class StaticRunner(OneLiveCache):
    prefill_chunk = STATIC_PREFILL_CHUNK

    def __init__(self, loaded, cache_budget_bytes: int, role: str = "target") -> None:
        self._init_bookkeeping(role, loaded)
        self.model = loaded.model  # a StaticDecoder
        self.vocab_size = self.model.vocab_size
        self._init_live(self.model.kv_bytes_per_token, cache_budget_bytes)
        self.compiled = None  # the live CompiledForward, once go_live() took it
        self.built = None  # a CompiledForward built and checked, not live yet
        # off | compiling | built | live | failed: why
        self.compile_state = "off"
        # clear while a request a user waits for runs: the graph build waits for it between forwards
        # (two threads' parallel kernels on the same cores slowed a first suggestion from 0.6 s to 10)
        self._no_request = threading.Event()
        self._no_request.set()
        self.compile_seconds: float | None = None
        self._reading_prompt = False

    @property
    def path(self) -> str:
        return "compiled" if self.compiled is not None else "eager"

    @property
    def compiled_one_thread(self) -> bool:
        """Whether the graphs (live or built) run inductor's kernels on one thread (see CompiledForward)."""
        graphs = self.compiled or self.built
        return bool(graphs is not None and graphs.one_thread)

    @property
    def forward_widths(self) -> tuple[int, ...] | None:
        """The row counts the live compiled graphs run (a draft is padded to the next); None: eager."""
        return self.compiled.widths if self.compiled is not None else None

    @property
    def max_positions(self) -> int:
        """Positions the cache holds without growing (the exactness probe tests near it)."""
        return self.model.max_len

    # ---- the compiled path ----------------------------------------------------------------------
    def start_compiling(self, on_built=None, widths=None) -> threading.Thread:
        """Build the compiled graphs on a thread of its own (minutes the first time on a CPU, seconds
        from inductor's cache later); on_built() is called when they are ready to go live."""
        from decoding.models.compiled_forward import WIDTHS, CompiledForward, NotExact

        self.compile_state = "compiling"

        def build() -> None:
            started = time.perf_counter()
            try:
                try:
                    compiled = CompiledForward(self.model, widths or WIDTHS)
                    compiled.build(pause=self._no_request.wait)
                except NotExact as exc:
                    log.info("compiled forward: %s; building again with its kernels on one thread", exc)
                    compiled = CompiledForward(self.model, widths or WIDTHS, one_thread=True)
                    compiled.build(pause=self._no_request.wait)
            except Exception as exc:  # noqa: BLE001 - the eager path goes on serving
                self.compile_state = f"failed: {type(exc).__name__}: {exc}".splitlines()[0][:300]
                log.warning("compiled forward not used: %s", self.compile_state)
                return
            self.compile_seconds = time.perf_counter() - started
            self.built, self.compile_state = compiled, "built"
            log.info("compiled forward built in %.1f s; it goes live before the next request", self.compile_seconds)
            if on_built is not None:
                on_built()

        thread = threading.Thread(target=build, name="draftwise-compile", daemon=True)
        thread.start()
        return thread

    @contextlib.contextmanager
    def serving(self):
        """Around a request a user waits for (on the thread that runs requests)."""
        self._no_request.clear()
        try:
            yield
        finally:
            self._no_request.set()

    def go_live(self) -> bool:
        """Between requests (on the thread that runs them): serve from the built graphs from now on.
        Saved caches stay: they are keys and values of tokens, whichever path computed them."""
        if self.built is None:
            return False
        self.compiled, self.built, self.compile_state = self.built, None, "live"
        log.info("forward path: compiled (decode and verify forwards of up to %d rows)", self.compiled.max_rows)
        return True

    def drop_compiled(self, why: str) -> None:
        """Back to the eager forward for good (between requests)."""
        self.compiled, self.compile_state = None, f"failed: {why}"
        log.warning("compiled forward not used: %s", why)

    def _read_prompt(self, ids: list[int]) -> None:
        self._reading_prompt = True
        try:
            self.forward(ids, logits_to_keep=1)
        finally:
            self._reading_prompt = False

    # ---- the live cache -------------------------------------------------------------------------
    def assume_cached(self, ids: list[int]) -> None:
        """Take the buffer's first len(ids) positions as these tokens' cache, whatever they hold: the
        exactness probe compares forwards over one cache and needs no real prompt read first."""
        self.model.grow(len(ids) + 64)
        self._live, self.tokens = list(ids), list(ids)

    @torch.inference_mode()
    def _live_decode(self, ids: list[int], position: int, keep: int) -> torch.Tensor:
        compiled = self.compiled
        if compiled is not None and not self._reading_prompt and compiled.fits(position, len(ids)):
            try:
                with torch.compiler.set_stance("fail_on_recompile"):
                    return compiled.forward(ids, position, keep)
            except Exception as exc:  # noqa: BLE001 - a guard the build did not foresee: never compile while a user waits
                self.drop_compiled(f"it would have compiled again: {type(exc).__name__}: {exc}".splitlines()[0][:300])
        return self.model(torch.tensor(ids, dtype=torch.long), position, keep)

    def _live_drop_from(self, position: int) -> None:
        """Nothing to do: positions past the live ones are masked, and overwritten when reached."""

    def _live_clear(self) -> None:
        pass

    def _live_save(self) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(self._live)
        return self.model.k_cache[:, :, :n].clone(), self.model.v_cache[:, :, :n].clone()

    def _live_restore(self, state: tuple[torch.Tensor, torch.Tensor]) -> None:
        k, v = state
        self.model.grow(k.shape[2])
        self.model.k_cache[:, :, :k.shape[2]] = k
        self.model.v_cache[:, :, :v.shape[2]] = v
