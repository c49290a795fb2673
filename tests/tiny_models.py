"""A tiny, randomly initialised Qwen2-architecture model with a real BPE tokenizer and FIM tokens.

Tests of the engine and the server use it (tests/conftest.py's fixtures; the editor tests through
tests/editors/make_tiny_model.py): it loads through the same code path as the real models
(a Hugging Face directory with safetensors), runs in milliseconds, and is deterministic for a seed.
It writes nonsense, which is fine: what tests check is that speculative output equals plain output.
"""
from __future__ import annotations

import json
from pathlib import Path

SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
]

# A fixed training text keeps the tokenizer identical on every machine and Python version.
_CORPUS = r'''
def fibonacci(n):
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)


class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        return self.items.pop()

function add(a, b) { return a + b; }
const values = [1, 2, 3].map((x) => x * 2);
for (let i = 0; i < values.length; i++) { console.log(values[i]); }
int main(int argc, char **argv) { printf("%d\n", argc); return 0; }
fn main() { let v: Vec<i32> = Vec::new(); println!("{}", v.len()); }
local function greet(name) return "hello " .. name end
func Sum(xs []int) int { total := 0; for _, x := range xs { total += x }; return total }
import os, sys, json
with open(path, "r", encoding="utf-8") as f:
    data = json.load(f)
for key, value in sorted(data.items()):
    print(f"{key}: {value}")
# emoji 🙂 and CJK 漢字 and tabs	here
'''


def build_tokenizer(vocab_size: int = 384):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )


def build_tiny_model(out_dir: str | Path, seed: int = 0, layers: int = 2, hidden: int = 64,
                     init_std: float = 0.25, tokenizer=None) -> Path:
    """Write a tiny model directory (config, safetensors weights, tokenizer) and return its path.

    init_std is large on purpose: random models with the usual 0.02 produce near-tied logits, and a
    near tie can flip under the tiny float differences between a one-token and a k-token forward.
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = tokenizer or build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=8192, tie_word_embeddings=True, initializer_range=init_std,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        bos_token_id=None, pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    (out / "draftwise-tiny.json").write_text(json.dumps({"seed": seed, "layers": layers, "hidden": hidden}))
    return out


def perturb_copy(src_dir: str | Path, out_dir: str | Path, noise: float, seed: int = 1) -> Path:
    """A draft model that agrees with the target for a while and then does not: the target's
    weights plus Gaussian noise. Used to force partial acceptance in tests."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(src_dir), dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * noise * p.std())
    out = Path(out_dir)
    model.save_pretrained(str(out), safe_serialization=True)
    AutoTokenizer.from_pretrained(str(src_dir)).save_pretrained(str(out))
    return out
