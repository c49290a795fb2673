"""The draft model's economics: load one only where it fits in memory, shares the target's tokenizer
and can pay on this device; load it again when a request names the `model` drafter."""
from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from decoding.api import EngineConfig
from decoding.runners.timing import measure_forward_times
from decoding.errors import DraftwiseError

log = logging.getLogger("draftwise.loading")


def add_draft_model(models, cfg: EngineConfig) -> None:
    """Load cfg.draft into decoding.setup.LoadedModels `models` where it can pay; a draft model that
    fails to load leaves the target serving alone, and `draft_note` says why."""
    try:
        _add_draft_model(models, cfg)
    except DraftwiseError as exc:
        models.draft_note = f"failed to load: {exc}"
        log.warning("draft model %s", models.draft_note)


def _add_draft_model(models, cfg: EngineConfig) -> None:
    from decoding.drafters.draft_model import ModelDrafter
    from decoding.setup.weight_choice import load_weights
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


def load_left_out_draft_model(models, cfg: EngineConfig) -> None:
    """A request names the `model` drafter: load the draft model if `auto` left it out for its cost.
    (One that failed to load, or does not fit, stays out: the target serves alone, and `draft_note`
    in the stats says why.)"""
    if "model" in models.drafters or not models.draft_left_out:
        return
    log.info("loading the draft model %s again: a request asks for the model drafter", cfg.draft)
    models.draft_left_out = False
    add_draft_model(models, replace(cfg, drafter="model"))


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
