"""Shared fixtures: tiny deterministic models (built once per session) and the real 0.5B pack."""
from __future__ import annotations

import pytest

from decoding.models import pack
from decoding.models.specs import PRESETS

REAL_PRESET = "qwen2.5-coder-0.5b"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from tests.tiny_models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "target", seed=0)


@pytest.fixture(scope="session")
def tiny_draft_dir(tiny_model_dir, tmp_path_factory):
    """A perturbed copy of the tiny target: its drafts are right for a while, then wrong."""
    from tests.tiny_models import perturb_copy

    return perturb_copy(tiny_model_dir, tmp_path_factory.mktemp("tiny") / "draft", noise=0.05, seed=1)


@pytest.fixture(scope="session")
def real_model():
    """The real Qwen2.5-Coder-0.5B preset; `make test` pulls it before running pytest."""
    if not pack.is_pulled(PRESETS[REAL_PRESET]):
        pytest.skip(f"{REAL_PRESET} is not pulled (run `draftwise models pull {REAL_PRESET}`, as `make test` does)")
    return REAL_PRESET
