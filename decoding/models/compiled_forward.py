"""The static forward (decoding/models/static_decoder.py) compiled by torch.compile's CPU backend
(inductor), for the forwards a request waits on token by token: decode steps and verify forwards.

Shapes are fixed where it matters and dynamic where it does not cost a graph:
- one graph per row width (WIDTHS): a forward of n rows is padded to the next width; the padding
  rows write their keys and values to the buffer's last position, which no compiled row reads;
- the attention window (a multiple of WINDOW_STEP) is a dynamic dimension: one graph serves every
  cache position, and attention still reads only the window a row needs;
- a forward whose rows span two windows runs as two calls, one per window (as the eager forward
  splits it), so a row's sums never depend on the forward it came in.

Prompts are read by the eager forward (chunks of hundreds of rows, where op overhead is nothing);
the rows the engine keeps logits for run here. A compiled row is exact against a compiled decode
step at every width and padding (the integer matmuls, and reductions that run along each row): it is
checked here on scratch buffers before the path goes live, and the exactness probe measures it
again on the runner. Compiled and eager rows are not bit-identical to each other (inductor fuses the
float ops), so one request runs on one path: StaticRunner switches between requests.

Compiling takes minutes on a laptop CPU; inductor keeps what it built on disk (under
$DRAFTWISE_HOME/inductor), and a later start loads it in seconds. StaticRunner compiles on a thread
of its own while the eager forward serves.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import torch
from decoding.models.static_decoder import WINDOW_STEP, StaticDecoder

log = logging.getLogger(__name__)

WIDTHS = (1, 2, 4, 8, 16)  # rows per compiled forward: a decode step, and drafts padded up


def _step(model: StaticDecoder, x: torch.Tensor, pos: torch.Tensor, visible: torch.Tensor,
          k_layers: list[torch.Tensor], v_layers: list[torch.Tensor]) -> torch.Tensor:
    """StaticDecoder.forward for rows that share one window (visible: [1, group * n, window]) from
    their embeddings x: keys and values written by index (positions as a tensor: one graph for every
    start), float logits of every row. The embedding is looked up outside the graph: fused with the
    first norm, a gather from the packed table of a tied lm_head made the one-row graph sum that norm
    in another order than the wider ones (the tiny model: 7e-7 apart at one position)."""
    m, window = model, visible.shape[-1]
    cos, sin = m.cos[pos].unsqueeze(1), m.sin[pos].unsqueeze(1)
    for i, block in enumerate(m.blocks):
        rows, k, v = m.attention_inputs(block, x, cos, sin)
        k_layers[i][:, pos] = k
        v_layers[i][:, pos] = v
        x = m.after_attention(block, x, m.attend(rows, k_layers[i][:, :window], v_layers[i][:, :window], visible))
    return m.logits(x)


def padded_width(n: int, widths: tuple[int, ...] = WIDTHS) -> int | None:
    return next((w for w in widths if w >= n), None)


class NotExact(RuntimeError):
    """A compiled width's rows differ from compiled one-token steps."""


class CompiledForward:
    """StaticDecoder's forward for up to max(widths) rows, compiled; build() compiles every width.
    one_thread: inductor's generated kernels on one thread (the matrix products, ours and ATen's,
    keep both cores), for a model whose graphs are not exact otherwise (StaticRunner retries so)."""

    def __init__(self, model: StaticDecoder, widths: tuple[int, ...] = WIDTHS, one_thread: bool = False) -> None:
        self.model, self.widths = model, tuple(sorted(widths))
        self.one_thread = one_thread
        self.cache_len = model.max_len  # the KV buffer's length the graphs were built for
        # In a narrower dtype than fp32 (bf16: int4 on ATen's kernel), inductor keeps fused
        # intermediates in fp32 and drops the casts between them; which casts it drops depends on
        # how it fused each width, so a 2-row forward's logits differed from one-token steps by 0.7
        # (the 0.5B). Rounding where the eager code rounds makes every width compute rows alike.
        options = {"emulate_precision_casts": True} if model.dtype != torch.float32 else {}
        if one_thread:
            # The 1.5B's one-row graph, its kernels on two threads, gave logits 1.74 away from the
            # two-row graph's rows; on one thread every width is exact, and a step no slower (42 ms).
            options["cpp.threads"] = 1
        # Dynamo keeps the graphs of every CompiledForward (one per width each) under one code
        # object, up to recompile_limit entries (8): a second model in the process (the bench's
        # formats, a server reloading for a new setting) would hit it and fall back to eager.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        self._fn = torch.compile(lambda *args: _step(model, *args), dynamic=False, fullgraph=True, options=options)
        self.ready = False

    @property
    def max_rows(self) -> int:
        return self.widths[-1]

    def fits(self, start: int, n: int) -> bool:
        """Whether the compiled graphs can run these rows (the buffer has not grown since)."""
        # rows end before the buffer's last position unless they fill the widest graph (no padding)
        return (self.ready and self.model.max_len == self.cache_len and n <= self.max_rows
                and start + self.max_rows <= self.cache_len)

    def _call(self, ids: list[int], start: int, k_layers, v_layers) -> torch.Tensor:
        """Rows that share one window: padded to a compiled width; their logits [len(ids), V]."""
        n = len(ids)
        width = padded_width(n, self.widths)
        window = ((start + n - 1) // WINDOW_STEP + 1) * WINDOW_STEP
        window = min(window, self.cache_len)
        # padding rows go to the buffer's last position: no row a graph computes reads it (fits())
        pos = torch.tensor(list(range(start, start + n)) + [self.cache_len - 1] * (width - n))
        padded = torch.tensor(ids + [ids[-1]] * (width - n), dtype=torch.long)
        visible = self.model.visible(pos, window)
        torch._dynamo.mark_dynamic(visible, 2)
        x = self.model.embed(padded).to(self.model.dtype)
        return self._fn(x, pos, visible, k_layers, v_layers)[:n]

    def forward(self, ids: list[int], start: int, keep: int, caches=None) -> torch.Tensor:
        """Like StaticDecoder.forward (rows at positions start..), on the compiled graphs."""
        k_layers, v_layers = caches or (list(self.model.k_cache.unbind(0)), list(self.model.v_cache.unbind(0)))
        parts = []
        for a, b, _ in self.model.window_groups(start, len(ids)):
            parts.append(self._call(ids[a:b], start + a, k_layers, v_layers))
        logits = parts[0] if len(parts) == 1 else torch.cat(parts)
        return logits[len(ids) - keep:]

    @torch.inference_mode()
    def build(self, pause: Callable[[], None] = lambda: None) -> None:
        """Compile every width (or load it from inductor's cache) on scratch KV buffers, each wider
        one checked at once against compiled one-token steps (a path that is not exact fails after
        two graphs, not five), and mark the graphs ready. pause() is called before each forward: it
        returns when the build may go on (a request's forwards and the build's would share the cores)."""
        m = self.model

        def forward(*args) -> torch.Tensor:
            pause()
            return self.forward(*args)

        # Scratch buffers of the live ones' kind: an inference tensor and a normal one dispatch
        # differently, and a graph built for one kind would be built again (a minute) for the other.
        with torch.inference_mode(m.k_cache.is_inference()):
            scratch = (list(torch.zeros_like(m.k_cache).unbind(0)), list(torch.zeros_like(m.v_cache).unbind(0)))
        ids = [(i * 7919) % min(m.vocab_size - 20, 1000) + 10 for i in range(WINDOW_STEP + 2 * self.max_rows)]
        # where the widest forward stays in one window, and where it spans two; the rows compared read
        # the same cache before `start`, whatever it holds
        starts = (WINDOW_STEP // 2, WINDOW_STEP - self.max_rows // 2)
        steps: dict[int, torch.Tensor] = {}
        checked = 1
        for width in self.widths:
            t = time.perf_counter()
            # compiled at positions past those compared: rows never attend to keys after their own
            forward(ids[:width], 2 * WINDOW_STEP, width, scratch)
            log.info("compiled forward: %d-row graph ready in %.1f s", width, time.perf_counter() - t)
            if not steps:
                steps = {s: torch.cat([forward([ids[p]], p, 1, scratch) for p in range(s, s + self.max_rows)])
                         for s in starts}
            for n in range(checked + 1, width + 1):
                for start in starts:
                    rows = forward(ids[start:start + n], start, n, scratch)
                    if not torch.equal(rows, steps[start][:n]):
                        diff = float((rows - steps[start][:n]).abs().max())
                        raise NotExact(f"compiled {n}-row forwards differ from compiled one-token steps "
                                           f"(by {diff:.3g} at position {start}): not exact")
            checked = width
        self.ready = True
