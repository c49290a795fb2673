"""Loading what an engine runs, in one home: the target, its tokenizer and prompt format, the drafters
and the cost model (here); the format each model runs in (`weight_choice`); a draft model only where
it can pay on this device (`draft_choice`). How one model's files are read and quantized is the
models' own business (decoding/models/checkpoint.py); how long its forwards take, the runners'
(decoding/runners/timing.py)."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from decoding.api import EngineConfig, Progress
from decoding.cost_model import CostModel
from decoding.runners.timing import kept_forward_times
from decoding.drafters.base import Drafter
from decoding.policy import DraftPolicy

if TYPE_CHECKING:  # for the annotations only: at run time these load later, in the functions that need them
    from decoding.api import CompletionRequest, RequestStats
    from decoding.models.checkpoint import LoadedModel
    # Healing as decoding.prompt has it (PromptBuilder.healing): an import of decoding.healing itself would
    # be this module's eighth sibling (tests/test_import_graph.py allows seven)
    from decoding.prompt import Healing, PromptBuilder, PromptParts
    from decoding.runners.base import Runner
    from decoding.setup.target_choice import TargetChoice
    from decoding.setup.weight_choice import WeightsChoice

log = logging.getLogger("draftwise.loading")

# The cost model also times forwards on a cache this long: prompts fill ~1,000 positions, where
# attention makes verify rows dearer than on its short cache (decoding/runners/timing.py, ForwardTimes).
LONG_CACHE = 512


def long_cache(runner: Runner) -> int | None:
    """The longer cache the cost model times forwards on, or None: none where drafting is off (no
    draft to price), and within the runner's positions."""
    if not runner.verify_exact:
        return None
    limit = getattr(runner, "context_limit", None) or getattr(runner, "max_positions", None)
    return LONG_CACHE if limit is None else min(LONG_CACHE, limit - 32)


@dataclass
class LoadedModels:
    target: LoadedModel
    weights: WeightsChoice  # of the target
    prompts: PromptBuilder
    end_ids: frozenset[int]
    target_runner: Runner
    cost: CostModel
    drafters: dict[str, Drafter]  # lookup, suggestion, and "model" when a draft model is used
    draft: LoadedModel | None = None  # the draft model, when it is used
    draft_weights: WeightsChoice | None = None  # its format
    draft_note: str = ""  # why the draft model is (not) used
    draft_costs: dict[str, float] = field(default_factory=dict)  # measured at load, for info()
    draft_left_out: bool = False  # `auto` did not keep the draft model: it cannot pay on this device
    drafting_off: str = ""  # why every request decodes plainly (the target's verify is not row-exact here)
    healing: Healing | None = None  # for the target's tokenizer
    target_choice: TargetChoice | None = None  # which model `target` named, and why
    max_tokens: int = 64  # EngineConfig.max_tokens: a request's default
    suffix_why: str = ""  # what the prompt's suffix holds, and why (EngineConfig.suffix)

    @property
    def kernel(self) -> str:
        """What runs the target's weight format here, as kept measurements are keyed (decoding.models.weights);
        `+rows` only where the loaded decoder runs its attention on row_ops.cpp (a head size the kernel
        lacks runs torch's)."""
        from decoding.models.weights import GGUF, implementation

        if self.target.weights == GGUF:
            return "llama.cpp"
        label = implementation(self.target.weights)
        if not getattr(self.target.model, "attention_kernel", False):
            label = label.replace("+rows", "")
        return label

    def prompt_parts(self, request: CompletionRequest) -> PromptParts:
        """A decoding.api.CompletionRequest's prompt: decoding.prompt.PromptParts, its end healed.
        Where the target's cache has a fixed size (llama.cpp's context), the prompt budget leaves room
        in it for the completion and a draft."""
        limit = getattr(self.target_runner, "context_limit", None)
        if limit is not None:
            room = (request.max_tokens or self.max_tokens) + 18  # a 16-token draft and the target's token
            budget = min(request.context_tokens or self.prompts.budget, max(64, limit - room))
            request = replace(request, context_tokens=budget)
        return self.prompts.build_request(request, heal=True)

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def draft_policy(self, mode: str, stats: RequestStats) -> DraftPolicy:
        """The drafting policy of one request that runs drafter `mode` (see drafter_mode)."""
        return DraftPolicy(mode, self.drafters, self.cost, stats)

    def drafter_mode(self, mode: str) -> str:
        """The drafter a request runs: `mode`, or none where drafting would change the text."""
        return "none" if self.drafting_off else mode

    def build_prompt(self, request: CompletionRequest) -> list[int]:
        """The prompt's token ids for a decoding.api.CompletionRequest."""
        return self.prompt_parts(request).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def ensure_draft_model(self, cfg: EngineConfig) -> None:
        """A request names the `model` drafter: load the draft model if `auto` left it out."""
        from decoding.setup.draft_choice import load_left_out_draft_model

        load_left_out_draft_model(self, cfg)

    def clear_caches(self) -> None:
        """The one way to forget every stored KV cache: the next request starts cold."""
        self.target_runner.store.clear()
        for drafter in self.drafters.values():
            drafter.clear()
        try:
            import torch

            if self.target.device.type == "cuda":
                torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 - best effort
            pass


def load_models(cfg: EngineConfig, progress: Progress) -> LoadedModels:
    from decoding.setup.target_choice import choose_target

    choice = choose_target(cfg.target, cfg.device)
    if cfg.target != choice.spec:
        log.info("target auto: %s (%s)", choice.spec, choice.reason)
        progress(f"target auto: {choice.spec}", 0.02)
    models = _load_models(replace(cfg, target=choice.spec), progress)
    models.target_choice = choice
    return models


def _load_models(cfg: EngineConfig, progress: Progress) -> LoadedModels:
    from decoding.setup.draft_choice import add_draft_model
    from decoding.drafters.lookup import LookupDrafter
    from decoding.drafters.suggestion import SuggestionDrafter
    from decoding.setup.weight_choice import load_weights
    from decoding.prompt import PromptBuilder, end_token_ids
    from decoding.models.weights import return_freed_memory
    from decoding.runners import runner_for
    from decoding.models.quality_gate import suffix_choice

    lines, suffix_why = suffix_choice(cfg.suffix, cfg.target)  # a bad value fails before the weights load
    progress(f"loading target {cfg.target}", 0.05)
    target, weights = load_weights(cfg.target, cfg.weights, cfg.device, cfg.dtype, cfg.trust_remote_code, "target",
                                   context_tokens=cfg.context_tokens + cfg.max_tokens + 64)
    prompts = PromptBuilder(target.tokenizer, cfg.context_tokens, whole_suffix=lines)
    runner = runner_for(target, cfg.cache_mb * 1024 * 1024)
    progress("measuring forward costs on this device", 0.5)
    # Drafts are capped where verify forwards stop being exact here (decoding/runners/exactness.py).
    cost = CostModel(kept_forward_times(runner, repeats=3 if cfg.measure_cost else 1, long_context=long_cache(runner)),
                     max_draft=max(0, min(16, runner.exact_width - 1)))
    models = LoadedModels(target, weights, prompts, frozenset(end_token_ids(target.tokenizer, prompts.template)),
                          runner, cost, {"lookup": LookupDrafter(encode=prompts.encode), "suggestion": SuggestionDrafter(target.tokenizer)},
                          healing=prompts.healing, max_tokens=cfg.max_tokens, suffix_why=suffix_why)
    if not runner.verify_exact:
        differ = runner.not_exact_why or f"a verify forward's logits differ from one-token steps' here (by up to {runner.verify_difference:.3g})"
        models.drafting_off = f"{target.weights} weights: {differ}, so drafting could change the text; every request decodes plainly"
        log.warning("drafting off: %s", models.drafting_off)
    elif runner.exact_width <= 16:
        log.info("drafts capped at %d tokens: wider verify forwards are not exact here", runner.exact_width - 1)
    if cfg.draft and cfg.draft != "none" and models.drafting_off:
        models.draft_note = "not loaded: drafting is off (see drafting_off)"
    elif cfg.draft and cfg.draft != "none":
        progress(f"loading draft {cfg.draft}", 0.6)
        add_draft_model(models, cfg)
    return_freed_memory()  # the load's temporaries (the timing forwards' activations among them)
    progress("ready", 1.0)
    return models
