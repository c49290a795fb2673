"""The $DRAFTWISE_HOME folder (default ~/.cache/draftwise): where each file lives (`paths`), and the
crash-safe rules every kept file follows (`cache_files`). The lowest layer: it imports nothing else of
draftwise, so the kernels, the models and the runners may all keep their files here."""
