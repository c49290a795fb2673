"""draftwise's language server: LSP in, plain-text requests to the engine out. Never touches tensors."""
