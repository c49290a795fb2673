"""A model's tokenizer as transformers built it, kept on disk and read back with the `tokenizers` library
alone: a later start skips importing transformers and building its tokenizer object (~1.3 s of a 4 s
start on 2 cores), and gets the same ids and texts.

What is kept is transformers' own pipeline (`backend_tokenizer.to_str()`), not the model's
tokenizer.json: a tokenizer class may rebuild parts of that file (Qwen2's sets its own normalizer and
pre-tokenizer). It is kept only for the classes whose calls below are that pipeline and nothing more,
and is keyed by the tokenizer's files, the transformers version that built it and the code that keeps
and reads it; one that cannot be read is deleted and built again. Equality with
transformers' tokenizer, id for id and offset for offset: tests/models/test_tokenizer.py."""
from __future__ import annotations

import functools
import hashlib
import json
import logging
from importlib import metadata
from pathlib import Path

from decoding.home import cache_files, paths

log = logging.getLogger(__name__)

# transformers' tokenizer classes whose encode, decode and call run their Rust pipeline and nothing else
PLAIN_CLASSES = frozenset({"Qwen2Tokenizer", "Qwen2TokenizerFast", "PreTrainedTokenizerFast", "TokenizersBackend"})
# the files a tokenizer class reads (config.json: AutoTokenizer may pick the class from model_type)
SOURCES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "config.json")


def kept_path(directory: str | Path) -> Path | None:
    """Where the tokenizer transformers builds for `directory` is kept; None without a tokenizer.json."""
    directory = Path(directory)
    if not (directory / "tokenizer.json").is_file():
        return None
    try:
        digest = hashlib.sha256(f"{metadata.version('transformers')} {_kept_by()}".encode())
    except metadata.PackageNotFoundError:
        return None
    for name in SOURCES:
        try:
            digest.update(name.encode() + (directory / name).read_bytes())
        except OSError:
            digest.update(name.encode())
    return paths.draftwise_home() / "tokenizers" / f"{digest.hexdigest()[:20]}.json"


@functools.lru_cache(maxsize=1)
def _kept_by() -> str:
    return cache_files.code_hash(FileTokenizer.keep, FileTokenizer.read)


class FileTokenizer:
    """The part of transformers' fast-tokenizer interface the engine uses, on the kept pipeline."""

    def __init__(self, backend, eos_token: str | None):
        # transformers turns a pipeline's own truncation and padding off on every call: so here, once
        backend.no_truncation()
        backend.no_padding()
        self.backend_tokenizer = backend  # tokenizers.Tokenizer, as transformers names it
        self.eos_token = eos_token
        self._vocab = backend.get_vocab(with_added_tokens=True)
        self.eos_token_id = self._vocab.get(eos_token) if eos_token else None

    @classmethod
    def read(cls, directory: str | Path) -> "FileTokenizer | None":
        """The kept tokenizer for a model directory, or None: none kept (transformers builds it)."""
        where = kept_path(directory)
        if where is None or not where.is_file():
            return None
        seen = None
        try:
            from tokenizers import Tokenizer

            seen = where.stat()
            kept = json.loads(where.read_text(encoding="utf-8"))
            backend = Tokenizer.from_str(kept["pipeline"])
            backend.encode_special_tokens = kept["encode_special_tokens"]  # not in the pipeline's JSON
            tokenizer = cls(backend, kept["eos_token"])
        except Exception as exc:  # noqa: BLE001 - unreadable: transformers builds it again
            cache_files.unreadable("kept tokenizer", where, exc, "building it again")
            cache_files.discard(where, seen)
            return None
        cache_files.touch(where)  # used: the tokenizers used last are kept
        return tokenizer

    @staticmethod
    def keep(directory: str | Path, built) -> None:
        """Keep what transformers built for `directory`, where its class adds nothing to the pipeline."""
        where = kept_path(directory)
        backend = getattr(built, "backend_tokenizer", None)
        if where is None or backend is None or type(built).__name__ not in PLAIN_CLASSES:
            return
        try:
            paths.atomic_write(where, json.dumps({"class": type(built).__name__, "eos_token": built.eos_token,
                                                  "encode_special_tokens": backend.encode_special_tokens,
                                                  "pipeline": backend.to_str()}))
        except OSError as exc:  # a full or read-only home costs later starts transformers' build
            cache_files.could_not_keep("the tokenizer", where.parent, exc, "the next start builds it again")

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        """Read once: transformers rebuilds it on every call (0.1 s for Qwen's 151k tokens). Shared:
        callers read it, never change it."""
        return self._vocab

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def __call__(self, text: str | list[str], add_special_tokens: bool = True, return_offsets_mapping: bool = False):
        """transformers' call for one text or a list: {"input_ids": ..., "offset_mapping": ...}."""
        one = isinstance(text, str)
        encodings = self.backend_tokenizer.encode_batch([text] if one else list(text),
                                                        add_special_tokens=add_special_tokens)
        out = {"input_ids": [e.ids for e in encodings]}
        if return_offsets_mapping:
            out["offset_mapping"] = [e.offsets for e in encodings]
        return {k: v[0] for k, v in out.items()} if one else out

    def decode(self, ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool = False) -> str:
        if clean_up_tokenization_spaces:
            raise ValueError("clean_up_tokenization_spaces is not supported: the engine decodes text as written")
        return self.backend_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def batch_decode(self, sequences, skip_special_tokens: bool = False,
                     clean_up_tokenization_spaces: bool = False) -> list[str]:
        return [self.decode(ids, skip_special_tokens, clean_up_tokenization_spaces) for ids in sequences]

    def convert_ids_to_tokens(self, ids):
        if isinstance(ids, int):
            return self.backend_tokenizer.id_to_token(ids)
        return [self.backend_tokenizer.id_to_token(i) for i in ids]

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            return self._vocab.get(tokens)
        return [self._vocab.get(t) for t in tokens]
