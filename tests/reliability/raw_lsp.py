"""The raw stdio LSP client lives in the measurement package (`bench.raw_client`): `draftwise replay` drives
the server with it too. The reliability tests import it from here."""
from bench.raw_client import (
    HEADER_FIELDS, JSONRPC_CODES, LSP_CODES, REPO_ROOT, SERVE, SERVER_ERROR_RANGE, Books, RawServer, Violation,
    encode, frame, valid_error_code,
)

__all__ = ["HEADER_FIELDS", "JSONRPC_CODES", "LSP_CODES", "REPO_ROOT", "SERVE", "SERVER_ERROR_RANGE", "Books",
           "RawServer", "Violation", "encode", "frame", "valid_error_code"]
