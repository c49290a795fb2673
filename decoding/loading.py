"""Loading what an engine runs: the target, its tokenizer and prompt format, the drafters, and a draft
model only where it can pay on this device (the draft model's economics live here)."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from decoding.api import EngineConfig
from decoding.cost_model import CostModel, measure_forward_times
from decoding.drafters.base import Drafter
from decoding.errors import DraftwiseError

log = logging.getLogger("draftwise.loading")

Progress = Callable[[str, "float | None"], None]


@dataclass
class LoadedModels:
    target: Any  # decoding.models.loading.LoadedModel
    weights: Any  # decoding.weight_choice.WeightsChoice of the target
    prompts: Any  # decoding.prompt.PromptBuilder
    end_ids: frozenset[int]
    target_runner: Any  # decoding.runners.base.Runner
    cost: CostModel
    drafters: dict[str, Drafter]  # lookup, suggestion, and "model" when a draft model is used
    draft: Any = None  # LoadedModel of the draft model, when it is used
    draft_weights: Any = None  # its WeightsChoice
    draft_note: str = ""  # why the draft model is (not) used
    draft_costs: dict = field(default_factory=dict)  # measured at load, for info()
    draft_left_out: bool = False  # `auto` did not keep the draft model: it cannot pay on this device
    drafting_off: str = ""  # why every request decodes plainly (the target's verify is not row-exact here)
    healing: Any = None  # decoding.healing.BlankHealing for the target's vocabulary
    max_tokens: int = 64  # EngineConfig.max_tokens: a request's default

    def prompt_parts(self, request):
        """A decoding.api.CompletionRequest's prompt: decoding.prompt.PromptParts, its blanks healed.
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

    def drafter_mode(self, mode: str) -> str:
        """The drafter a request runs: `mode`, or none where drafting would change the text."""
        return "none" if self.drafting_off else mode

    def build_prompt(self, request) -> list[int]:
        """The prompt's token ids for a decoding.api.CompletionRequest."""
        return self.prompt_parts(request).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

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
    from transformers.utils import logging as hf_logging

    from decoding.drafters.lookup import LookupDrafter
    from decoding.drafters.suggestion import SuggestionDrafter
    from decoding.healing import BlankHealing
    from decoding.weight_choice import load_weights
    from decoding.prompt import PromptBuilder, end_token_ids
    from decoding.runners import runner_for

    hf_logging.disable_progress_bar()
    progress(f"loading target {cfg.target}", 0.05)
    target, weights = load_weights(cfg.target, cfg.weights, cfg.device, cfg.dtype, cfg.trust_remote_code, "target",
                                   context_tokens=cfg.context_tokens + cfg.max_tokens + 64)
    prompts = PromptBuilder(target.tokenizer, cfg.context_tokens)
    runner = runner_for(target, cfg.cache_mb * 1024 * 1024)
    progress("measuring forward costs on this device", 0.5)
    # Drafts are capped where verify forwards stop being exact here (decoding/runners/exactness.py).
    cost = CostModel(measure_forward_times(runner, repeats=3 if cfg.measure_cost else 1),
                     max_draft=max(0, min(16, runner.exact_width - 1)))
    models = LoadedModels(target, weights, prompts, frozenset(end_token_ids(target.tokenizer, prompts.template)),
                          runner, cost, {"lookup": LookupDrafter(), "suggestion": SuggestionDrafter(target.tokenizer)},
                          healing=BlankHealing(target.tokenizer, runner.vocab_size), max_tokens=cfg.max_tokens)
    if not runner.verify_exact:
        models.drafting_off = (f"{target.weights} weights: a verify forward's logits differ from one-token steps' "
                               f"here (by up to {runner.verify_difference:.3g}), so drafting could change the text; "
                               "every request decodes plainly")
    elif runner.exact_width <= 16:
        log.info("drafts capped at %d tokens: wider verify forwards are not exact here", runner.exact_width - 1)
        log.warning("drafting off: %s", models.drafting_off)
    if cfg.draft and cfg.draft != "none" and models.drafting_off:
        models.draft_note = "not loaded: drafting is off (see drafting_off)"
    elif cfg.draft and cfg.draft != "none":
        progress(f"loading draft {cfg.draft}", 0.6)
        try:
            _add_draft_model(models, cfg)
        except DraftwiseError as exc:  # the target alone still serves completions; say why the draft is missing
            models.draft_note = f"failed to load: {exc}"
            log.warning("draft model %s", models.draft_note)
    progress("ready", 1.0)
    return models


def _add_draft_model(models: LoadedModels, cfg: EngineConfig) -> None:
    from decoding.drafters.draft_model import ModelDrafter
    from decoding.weight_choice import load_weights
    from decoding.runners import runner_for

    free, need = _available_memory_bytes(models.target.device), _checkpoint_bytes(cfg.draft)
    if free is not None and need is not None and need * 1.2 > free:
        models.draft_note = f"not loaded: needs ~{need >> 20} MiB, {free >> 20} MiB free"
        log.warning("draft model %s %s", cfg.draft, models.draft_note)
        return
    draft, draft_weights = load_weights(cfg.draft, cfg.draft_weights, cfg.device, cfg.dtype,
                                        cfg.trust_remote_code, "draft")
    if draft.tokenizer.get_vocab() != models.tokenizer.get_vocab():
        models.draft_note = "not used: its tokenizer differs from the target's"
        log.warning("draft model %s %s", cfg.draft, models.draft_note)
        return
    runner = runner_for(draft, cfg.cache_mb * 1024 * 1024 // 2, role="draft")
    step_s = measure_forward_times(runner, sizes=(1, 2), repeats=3).by_tokens[1]
    prefill_s = measure_forward_times(runner, sizes=(64, 128), repeats=1)(128) / 128
    ratio = step_s / models.cost.t(1)
    models.draft_costs = {"draft_step_ms": round(step_s * 1000, 1),
                          "draft_prefill_ms_per_token": round(prefill_s * 1000, 2)}
    pays = models.cost.drafter_pays(step_s)
    if not pays and cfg.drafter == "auto":
        models.draft_note = (f"unloaded: a draft step costs {ratio:.2f} target steps, too much to pay even at "
                             "90% acceptance")
        log.info("draft model %s %s", cfg.draft, models.draft_note)
        models.draft_left_out = True
        return
    models.draft, models.draft_weights = draft, draft_weights
    models.draft_note = (
        f"pays per step (a drafted token costs {ratio:.2f} target steps); `auto` uses it only when that also "
        f"pays for reading the prompt first ({prefill_s * 1000:.1f} ms a token)"
        if pays else "kept because --drafter model asks for it; it does not pay here")
    models.drafters["model"] = ModelDrafter(runner, step_s, prefill_s)


def ensure_draft_model(models: LoadedModels, cfg: EngineConfig) -> None:
    """A request names the `model` drafter: load the draft model if `auto` left it out for its cost.
    (One that failed to load, or does not fit, stays out: the target serves alone, and `draft_note`
    in the stats says why.)"""
    if "model" in models.drafters or not models.draft_left_out:
        return
    log.info("loading the draft model %s again: a request asks for the model drafter", cfg.draft)
    models.draft_left_out = False
    try:
        _add_draft_model(models, replace(cfg, drafter="model"))
    except DraftwiseError as exc:
        models.draft_note = f"failed to load: {exc}"
        log.warning("draft model %s", models.draft_note)


def _available_memory_bytes(device) -> int | None:
    try:
        if device.type == "cuda":
            import torch

            free, _ = torch.cuda.mem_get_info(device)
            return free
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, RuntimeError, ValueError):
        pass
    return None


def _checkpoint_bytes(spec_text: str) -> int | None:
    from decoding.models import pack
    from decoding.models.specs import parse_model_spec

    spec = parse_model_spec(spec_text)
    root = pack.preset_dir(spec.preset) if spec.preset else Path(spec.value) if spec.kind == "hf_dir" else None
    if root is None or not root.exists():
        return None
    return sum(f.stat().st_size for f in root.glob("*.safetensors"))
