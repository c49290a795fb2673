"""`draftwise replay`: real files typed back through the real server, as an editor would, to measure
what a user feels: how long after they stop typing a suggestion appears, and how often they take it.

- `keystrokes`: the typing (human timing from a seeded RNG) and the rule for taking a suggestion;
- `editor`: the editor's side (debounce, cancellation, ghost text, Tab) for VS Code and Neovim;
- `draftwise_backend`: `draftwise serve` as a child process over stdio;
- `llamacpp_infill`: whether llama.cpp's /infill (the peer's path) can be driven here;
- `corpus`, `runs`, `report`, `cli`: what is typed, the runs compared, the table and JSON.
"""
