"""Build the tiny local model offline: a random-weight Llama, a BPE tokenizer trained here.

Runs inside the engine environment (it needs torch, transformers and tokenizers):

    .venv-engine/bin/python -m engine.tiny_model OUT_DIR [--seed 0]

Its text is noise (the weights are random), but everything vLLM does with it is real:
tokenisation, the chat template with tools, prefix caching, speculative decoding, tool
parsing. The same seed on the same Python gives byte-identical files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

TEMPLATE = Path(__file__).parent / "templates" / "tiny_chat.jinja"
VOCAB_SIZE = 4096
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added as whole tokens, like Hermes and Qwen tokenizers do, so tool markup is cheap.
MARKUP_TOKENS = [
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<tools>",
    "</tools>",
]
CORPUS_BYTES = 3_000_000


def corpus() -> Iterator[str]:
    """Local, license-clean text: this Python's own standard library sources, in a fixed order."""
    yield TEMPLATE.read_text(encoding="utf-8")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    taken = 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        yield text
        taken += len(text)
        if taken >= CORPUS_BYTES:
            return


def build(out: Path, seed: int) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    out.mkdir(parents=True, exist_ok=True)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.add_tokens(MARKUP_TOKENS)

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=16384,
    )
    fast.chat_template = TEMPLATE.read_text(encoding="utf-8")
    fast.save_pretrained(str(out))

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16384,
        bos_token_id=fast.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=fast.convert_tokens_to_ids("<|endoftext|>"),
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    ).save_pretrained(str(out))
    (out / "BUILD.json").write_text(
        json.dumps(
            {"seed": seed, "python": sys.version.split()[0], "digest": digest(out)}, indent=2
        )
        + "\n"
    )


def digest(out: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(out.iterdir()):
        if path.name != "BUILD.json" and path.is_file():
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    build(args.out, args.seed)
    print(f"tiny model written to {args.out} ({digest(args.out)[:12]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
