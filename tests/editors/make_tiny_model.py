"""Writes the tiny test model (random 2-layer Qwen2 with a real BPE tokenizer) for the editor tests."""
import shutil
import sys
from pathlib import Path

from tests.tiny_models import build_tiny_model  # the repository on PYTHONPATH (lib.mjs)

if len(sys.argv) != 2:
    sys.exit("usage: make_tiny_model.py OUT_DIR")
out = Path(sys.argv[1])
tmp = out.with_name(out.name + ".partial")
for stale in (tmp, out):
    shutil.rmtree(stale, ignore_errors=True)
build_tiny_model(tmp, seed=0)
tmp.replace(out)  # whole or absent: a crash halfway leaves no model that looks complete
print(f"tiny model written to {out}", file=sys.stderr)
