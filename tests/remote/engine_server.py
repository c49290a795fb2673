"""llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`), unchanged, with one
addition for the tests: every forward pass llama.cpp runs (`Llama.eval`) appends a line
{"start": monotonic seconds, "t": when it ended, "tokens": tokens fed} to the file named by DRAFTWISE_EVAL_LOG. That is the
engine's own count of the work it did, read by the cancellation test (a decode step feeds 1 token).

Usage: python engine_server.py [llama_cpp.server arguments]
"""
from __future__ import annotations

import json
import os
import runpy
import threading
import time

import llama_cpp

LOG = os.environ.get("DRAFTWISE_EVAL_LOG")
if LOG:
    _lock = threading.Lock()
    _original_eval = llama_cpp.Llama.eval

    def counting_eval(self, tokens):
        start = time.monotonic()
        result = _original_eval(self, tokens)
        with _lock, open(LOG, "a") as f:
            f.write(json.dumps({"start": start, "t": time.monotonic(), "tokens": len(tokens)}) + "\n")
        return result

    llama_cpp.Llama.eval = counting_eval

runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
