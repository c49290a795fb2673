"""Fixtures of the server tests (helpers for driving a server process are in lsp_harness.py)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A workspace folder for one module's sessions."""
    return tmp_path_factory.mktemp("workspace")
