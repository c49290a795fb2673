"""The engine's public vocabulary: what a caller asks for and what it gets back.

Callers (the LSP server, the CLI, the benchmark) speak only in these types and plain text; they
never see tensors or tokenizers.
"""
from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Callable, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    import concurrent.futures

DRAFTERS = ("none", "lookup", "model", "suggestion", "auto")
SCOPES = ("auto", "line", "block", "full")
# What the prompt shows after the cursor: the rest of its line, or the lines after it too (as many as the
# suffix budget holds); auto: the lines where the quality gate measured that they pay for the model.
SUFFIXES = ("auto", "line", "lines")
WEIGHT_FORMATS = ("auto", "fp32", "bf16", "int8", "int4", "gguf")  # decoding.models.weights implements them;
# gguf: the model's GGUF file run by llama.cpp (decoding/runners/llamacpp.py)
# "error": a remote engine's request that failed (it ends empty); the in-process engine raises instead
STOP_REASONS = ("eos", "max_tokens", "stop_rule", "time_limit", "cancelled", "error")


@dataclass(frozen=True)
class ContextFile:
    """Another file shown to the model before the current one (e.g. an open editor tab)."""

    path: str  # shown to the model as a header; relative to the workspace when possible
    text: str


@dataclass
class CompletionRequest:
    prefix: str  # document text before the cursor
    suffix: str = ""  # document text after the cursor
    path: str = ""  # current file's path (header in repo-level prompts); may be empty
    document: str = ""  # key for latest-wins, KV reuse and suggestion memory (an LSP uri)
    language: str = ""  # LSP language id ("python", "typescript", ...); "" guesses from path
    context: Sequence[ContextFile] = ()  # most relevant first; fitted into the token budget
    # Of the budget, this many tokens go to `context` before the prefix takes the rest (repository
    # context); 0: the prefix first, context in what room is left (other open files).
    context_reserve_tokens: int = 0
    repo: str = ""  # the repository's name, for families with a repository-level format (<|repo_name|>)
    # More of the repository than fits the prompt: the lookup drafter drafts from these texts too.
    lookup_texts: Sequence[str] = ()
    context_tokens: int | None = None  # prompt token budget; None: EngineConfig.context_tokens
    max_tokens: int | None = None  # None: the engine's configured default
    # "line" | "block": stop rules for code; "auto": line or block, decided from the cursor's context;
    # "full": the model's raw output until end-of-text or max_tokens, untouched (benchmarks compare it)
    scope: str = "auto"
    drafter: str | None = None  # overrides the engine's configured drafter for this request
    temperature: float = 0.0  # 0: greedy (lossless: identical to plain greedy decoding)
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    time_limit_s: float | None = None  # stop (stopped="time_limit") after this much generation time, counted
    # from the end of prompt reading
    alternatives: int = 0  # other suggestions wanted after the greedy one (decoding/alternatives.py)
    # Text the user is probably typing next (the rest of a suggestion on screen): the suggestion
    # drafter proposes it and the target verifies it, so a wrong hint costs one forward, never output.
    draft_hint: str = ""


@dataclass
class RequestStats:
    prompt_tokens: int = 0
    reused_prompt_tokens: int = 0  # prompt tokens whose KV came from an earlier request
    generated_tokens: int = 0
    target_forwards: int = 0  # target forward passes after prefill (each emits >= 1 token)
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    drafted_by: dict[str, int] = field(default_factory=dict)
    accepted_by: dict[str, int] = field(default_factory=dict)
    decisions: dict[str, int] = field(default_factory=dict)  # "lookup:6" -> steps that chose it
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    first_token_ms: float = 0.0  # from start of request to first generated token
    drafter: str = "none"  # the configured mode for this request
    stopped: str = ""  # one of STOP_REASONS
    forwards_after_cancel: int = 0  # target forwards that finished after cancel() was called

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.generated_tokens / self.target_forwards if self.target_forwards else 0.0

    def add(self, other: "RequestStats") -> None:
        """Accumulate another request's counts and times (the engine's cumulative stats)."""
        for f in fields(self):
            value = getattr(other, f.name)
            if isinstance(value, dict):
                mine = getattr(self, f.name)
                for key, n in value.items():
                    mine[key] = mine.get(key, 0) + n
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                setattr(self, f.name, getattr(self, f.name) + value)

    def copy(self) -> "RequestStats":
        return replace(self, drafted_by=dict(self.drafted_by), accepted_by=dict(self.accepted_by),
                       decisions=dict(self.decisions))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["acceptance_rate"] = round(self.acceptance_rate, 4)
        d["tokens_per_forward"] = round(self.tokens_per_forward, 3)
        d["prefill_ms"] = round(self.prefill_ms, 1)
        d["decode_ms"] = round(self.decode_ms, 1)
        d["first_token_ms"] = round(self.first_token_ms, 1)
        return d


@dataclass
class CompletionResult:
    text: str
    stats: RequestStats
    alternatives: list[str] = field(default_factory=list)  # distinct from text; empty unless asked for

    def to_dict(self) -> dict:
        out = {"text": self.text, "stats": self.stats.to_dict()}
        if self.alternatives:
            out["alternatives"] = list(self.alternatives)
        return out


class Cancelled(Exception):
    """Raised where work stops between chunks (a prompt read, a draft model's catch-up) because its
    CancelToken was cancelled: what was done so far is consistent and kept."""


class CancelToken:
    """Set from any thread; the engine checks it before each draft step and each target forward."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.cancelled_at: float | None = None

    def cancel(self) -> None:
        if not self._event.is_set():
            self.cancelled_at = time.monotonic()
            self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


@dataclass
class EngineConfig:
    # model spec: preset, HF directory, .gguf file, or hub id; "auto": the 1.5B preset where this machine
    # runs it within the latency goals, else the 0.5B (decoding/setup/target_choice.py)
    target: str = "auto"
    draft: str | None = None  # model spec of the draft model; None/"none": no draft model
    drafter: str = "auto"  # default drafter mode, one of DRAFTERS
    max_tokens: int = 64
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16 (the compute dtype when weights is auto)
    weights: str = "auto"  # target weight format: auto | fp32 | bf16 | int8 | int4 (decoding.models.weights)
    draft_weights: str = "auto"  # the draft model's; auto picks the fastest (the output stays the target's)
    context_tokens: int = 1536  # prompt budget: prefix + suffix + other files
    suffix: str = "auto"  # one of SUFFIXES (decoding/models/quality_gate.py: SUFFIX_LINES)
    cache_mb: int = 512  # bound on KV memory kept for reuse across requests
    trust_remote_code: bool = False
    measure_cost: bool = True  # time forwards at load to build the cost model


Progress = Callable[[str, "float | None"], None]  # (message, fraction done or None) from the loading thread


@runtime_checkable
class CompletionEngine(Protocol):
    """What the LSP server, the CLI and the benchmark may call: the in-process engine
    (decoding.engine.Engine) and a remote one (decoding.remote.remote_engine.RemoteEngine) both implement it, and
    a test checks that their signatures match this one."""

    state: str  # "idle" | "loading" | "ready" | "failed"
    error: str | None

    def start_loading(self, progress: Progress | None = None) -> concurrent.futures.Future: ...

    def load(self, progress: Progress | None = None) -> None: ...

    def build_prompt(self, request: CompletionRequest) -> list[int]: ...

    def submit(self, request: CompletionRequest, cancel: CancelToken | None = None, version: int = 0,
               idle: bool = False) -> Job: ...  # noqa: F821 - decoding.jobs.Job, which imports this module

    def prepare(self, request: CompletionRequest) -> Job | None: ...  # noqa: F821

    def complete(self, request: CompletionRequest, cancel: CancelToken | None = None) -> CompletionResult: ...

    def clear_caches(self) -> None: ...

    def info(self) -> dict: ...

    def stats(self) -> dict: ...

    def close(self) -> None: ...
