"""Measurement, kept out of the product: `draftwise bench` (speed and quality against plain decoding,
the HF built-ins and llama.cpp's own server) and `draftwise replay` (real files typed back through the
real server). The `draftwise` command imports this package only when one of those two runs; nothing
in `decoding/` or `lsp_server/` imports it (tests/test_import_graph.py).

- `cli`, `harness`, `metrics`, `report`: the benchmark's command, its runs, its goals, its table;
- `corpus`, `crossfile`: the cases, sampled from a folder or built across files;
- `hf_baselines`, `llamacpp_baselines`, `llama_server`, `serve_memory`: the peers and what they cost;
- `replay/`: the typing replay; `raw_client`: a byte-level stdio LSP client it and the tests use.
"""
