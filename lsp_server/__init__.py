"""draftwise's language server: LSP in, plain-text requests to the engine out. Never touches tensors.

Where things live:
- `server.py`       the pygls server: capabilities and one short handler per LSP method
- `protocol.py`     the JSON-RPC envelope and the LSP life cycle, where pygls leaves them out
- `transport.py`    reading framed messages off stdio or TCP; exit codes
- `completions.py`  what a completion request does, from cursor to item
- `cursor.py`       where the cursor is: the line around it, mid-word or not
- `suggestions.py`  a suggestion as LSP items, and what the user accepted of it
- `typing_along.py` every answer before the engine is asked: the prediction, type-ahead, prefetches
- `request_path.py` what typing along asks of completions.py by name: requests, engine jobs, items
- `prediction.py`   idle work: the suggestion computed before it is asked for, followed while typing
- `idle_work.py`    when idle work starts: the pause timer, read-ahead and prefetch
- `repository_context.py` the workspace index (decoding/repository/) kept current, and each request's share
- `engine_host.py`  owns the engine: background load with progress, submit/cancel, staleness, stats
- `documents.py`    open documents, position encodings (utf-8/16/32), context from other files
- `postprocess.py`  shaping model text into an edit: single line vs block, brackets, indentation
- `typeahead.py`    answering at once while the user types along a shown suggestion
  (whether typing agrees with a suggestion: decoding/agreement.py, for server and engine alike)
- `config.py`       settings from initializationOptions / didChangeConfiguration
- `progress.py`     work-done progress while models load
- `cli.py`          the `draftwise` command (serve, complete, bench, models)

What a client can rely on (capabilities, settings, custom requests) is in PROTOCOL.md.
"""
