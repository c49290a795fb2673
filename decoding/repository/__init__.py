"""The repository as context: an index of the workspace's source files (files.py, symbols.py,
index.py) and the choice of what of it each request shows the model (selection.py). Plain text in,
decoding.api.ContextFile out: the server keeps it current, the benchmark builds one per package."""
