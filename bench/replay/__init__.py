"""`draftwise replay`: real files typed back through the real server, as an editor would, to measure
what a user feels: how long after they stop typing a suggestion appears, and how often they take it.

- `keystrokes`: the typing (human timing from a seeded RNG) and the rule for taking a suggestion;
- `editor`: the editor's side (debounce, cancellation, ghost text, Tab) for VS Code and Neovim;
- `draftwise_backend`: `draftwise serve` as a child process over stdio;
- `llama_vim`: the peer's path, llama.vim's logic against llama.cpp's `llama-server` /infill;
- `corpus`, `runs`, `report`, `cli`: what is typed, the runs compared, the table and JSON.
"""
