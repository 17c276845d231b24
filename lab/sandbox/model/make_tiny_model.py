#!/usr/bin/env python3
"""Generate a tiny random-weight Llama checkpoint that real vLLM can serve on a CPU.

Writes two variants of the same model under ``--out``:

- ``tiny-llama/``: one ``model.safetensors``
- ``tiny-llama-sharded/``: ``model-0000i-of-0000K.safetensors`` plus
  ``model.safetensors.index.json`` (weight_map and metadata.total_size)

Each holds ``config.json`` (LlamaForCausalLM, head_dim 32: the CPU attention needs
head_dim >= 32), ``generation_config.json``, ``tokenizer.json`` (byte-level BPE trained
here on a built-in corpus, ~1000 tokens), ``tokenizer_config.json``
(``PreTrainedTokenizerFast``, ChatML chat template), ``configuration.json`` (what
ModelScope repos carry) and ``README.md``. ``manifest.json`` at the top lists every
file with its size and sha256.

Deterministic: the same ``--seed`` and ``--shards`` give byte-identical files (weights
come from numpy's seeded PCG64, the tokenizer trainer runs single-threaded, JSON is
written with sorted keys, safetensors metadata is fixed). Needs numpy, safetensors and
tokenizers, not torch.

Without ``--out`` the model goes to ``$RIGOPS_CACHE/model/<recipe hash>/`` (default
``~/.cache/rigops``) and is reused when already complete. The last line printed is the
output directory.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

# The BPE trainer must not use threads: merge ties are then broken the same way each run.
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ.setdefault("RAYON_RS_NUM_CPUS", "1")

RECIPE_VERSION = 1
SINGLE = "tiny-llama"
SHARDED = "tiny-llama-sharded"

HIDDEN = 128
HEADS = 4
KV_HEADS = 2
LAYERS = 2
INTERMEDIATE = 256
VOCAB = 1000
MAX_POSITIONS = 2048

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BOS, EOS_CHAT, EOS_TEXT = "<|endoftext|>", "<|im_end|>", "<|endoftext|>"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_WORDS = """
the a an of to in on for with from by at as is are was were be been has have had do does
gpu gpus rig rigs node nodes model models token tokens server service vllm cuda driver
kernel memory cache tensor tensors layer layers weight weights shard shards index hub
download upload revision branch tag commit file files size hash checksum resume range
request requests response latency throughput batch batches prompt prompts chat template
system user assistant answer question hello world quick brown fox jumps over lazy dog
ansible role roles task tasks host hosts inventory playbook handler variable facts check
pcie nvlink numa topology bandwidth peer link links switch bridge slot slots lane lanes
start stop restart health ready port key keys secret bind local remote gateway proxy
one two three four five six seven eight nine ten hundred thousand first second last next
fast slow small large tiny random seed number numbers value values list map set order
python numpy torch safetensors tokenizer vocabulary merge merges byte bytes text word words
write read open close copy move keep drop retry fail pass test tests unit integration
""".split()

_EXTRA = [
    "Hello! How can I help you today?",
    "The quick brown fox jumps over the lazy dog.",
    "def main():\n    print('hello, world')\n    return 0\n",
    "GPU 0: NVIDIA GeForce RTX 5090, 32607 MiB, driver 595.45.04, CUDA 13.2",
    '{"model": "Qwen/Qwen3.5-9B", "messages": [{"role": "user", "content": "hi"}]}',
    "vllm serve /models/tiny --port 8000 --api-key $KEY --max-model-len 2048",
    "0123456789 +-*/=()[]{}<>,.;:!?'\"@#$%^&_|~`\\",
]


def corpus(seed: int = 1234, sentences: int = 4000) -> list[str]:
    """A fixed, generated English-ish corpus: enough distinct pairs for ~750 merges."""
    rng = random.Random(seed)
    lines = list(_EXTRA)
    for _ in range(sentences):
        n = rng.randint(4, 14)
        words = [rng.choice(_WORDS) for _ in range(n)]
        words[0] = words[0].capitalize()
        lines.append(" ".join(words) + rng.choice([".", ".", ".", "?", "!", ","]))
    return lines


def train_tokenizer(vocab_size: int = VOCAB):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def config(vocab_size: int, token_ids: dict[str, int]) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HIDDEN // HEADS,
        "num_hidden_layers": LAYERS,
        "vocab_size": vocab_size,
        "max_position_embeddings": MAX_POSITIONS,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "bos_token_id": token_ids[BOS],
        "eos_token_id": token_ids[EOS_CHAT],
        "pad_token_id": token_ids[EOS_TEXT],
        "torch_dtype": "float32",
        "use_cache": True,
    }


def tensor_specs(vocab_size: int) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes in the order a Llama state dict has them (HF naming)."""
    head_dim = HIDDEN // HEADS
    specs: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab_size, HIDDEN))]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        specs += [
            (p + "self_attn.q_proj.weight", (HEADS * head_dim, HIDDEN)),
            (p + "self_attn.k_proj.weight", (KV_HEADS * head_dim, HIDDEN)),
            (p + "self_attn.v_proj.weight", (KV_HEADS * head_dim, HIDDEN)),
            (p + "self_attn.o_proj.weight", (HIDDEN, HEADS * head_dim)),
            (p + "mlp.gate_proj.weight", (INTERMEDIATE, HIDDEN)),
            (p + "mlp.up_proj.weight", (INTERMEDIATE, HIDDEN)),
            (p + "mlp.down_proj.weight", (HIDDEN, INTERMEDIATE)),
            (p + "input_layernorm.weight", (HIDDEN,)),
            (p + "post_attention_layernorm.weight", (HIDDEN,)),
        ]
    specs += [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (vocab_size, HIDDEN))]
    return specs


def make_weights(seed: int, vocab_size: int) -> dict:
    import numpy as np

    rng = np.random.Generator(np.random.PCG64(seed))
    weights = {}
    for name, shape in tensor_specs(vocab_size):
        if name.endswith("norm.weight"):
            weights[name] = np.ones(shape, dtype=np.float32)
        else:
            weights[name] = (rng.standard_normal(shape) * 0.02).astype(np.float32)
    return weights


def dump_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def split_shards(names: list[str], k: int) -> list[list[str]]:
    """Contiguous groups of tensors, as even as the tensor order allows."""
    k = max(1, min(k, len(names)))
    size, rest = divmod(len(names), k)
    groups, start = [], 0
    for i in range(k):
        end = start + size + (1 if i < rest else 0)
        groups.append(names[start:end])
        start = end
    return groups


def write_variant(dst: Path, weights: dict, common: dict[str, bytes], shards: int) -> None:
    from safetensors.numpy import save_file

    dst.mkdir(parents=True)
    for name, data in common.items():
        (dst / name).write_bytes(data)
    meta = {"format": "pt"}
    if shards <= 1:
        save_file(weights, str(dst / "model.safetensors"), metadata=meta)
        return
    groups = split_shards(list(weights), shards)
    weight_map, total = {}, 0
    for i, group in enumerate(groups, start=1):
        fname = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        save_file({n: weights[n] for n in group}, str(dst / fname), metadata=meta)
        for n in group:
            weight_map[n] = fname
            total += weights[n].nbytes
    dump_json(
        dst / "model.safetensors.index.json",
        {"metadata": {"total_size": total}, "weight_map": weight_map},
    )


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def recipe_hash(seed: int, shards: int) -> str:
    import numpy
    import safetensors
    import tokenizers

    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    h.update(f"{RECIPE_VERSION}|{seed}|{shards}".encode())
    h.update(f"{numpy.__version__}|{safetensors.__version__}|{tokenizers.__version__}".encode())
    return h.hexdigest()[:16]


def build(out: Path, seed: int = 0, shards: int = 3) -> dict:
    tok = train_tokenizer()
    vocab_size = tok.get_vocab_size()
    if vocab_size > VOCAB:
        raise SystemExit(f"tokenizer has {vocab_size} tokens, more than {VOCAB}")
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS_CHAT,
        "pad_token": EOS_TEXT,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(ids[t]): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for t in SPECIAL_TOKENS
        },
    }
    cfg = config(VOCAB, ids)
    gen = {"bos_token_id": ids[BOS], "eos_token_id": [ids[EOS_CHAT], ids[EOS_TEXT]]}
    gen["pad_token_id"] = ids[EOS_TEXT]
    readme = (
        f"# rigops tiny-llama\n\nRandom weights (seed {seed}) for testing serving only; the "
        "output is gibberish.\nGenerated by sandbox/model/make_tiny_model.py.\n"  # (in lab/: part of the commit)
    )
    with tempfile.TemporaryDirectory() as tmp:
        tok_path = Path(tmp) / "tokenizer.json"
        tok.save(str(tok_path), pretty=True)
        tok_bytes = tok_path.read_bytes()
    common = {
        "config.json": json.dumps(cfg, indent=2, sort_keys=True).encode() + b"\n",
        "generation_config.json": json.dumps(gen, indent=2, sort_keys=True).encode() + b"\n",
        "tokenizer.json": tok_bytes,
        "tokenizer_config.json": json.dumps(tok_cfg, indent=2, sort_keys=True).encode() + b"\n",
        "configuration.json": b'{"framework": "pytorch", "task": "text-generation"}\n',
        "README.md": readme.encode(),
    }
    weights = make_weights(seed, VOCAB)
    out.mkdir(parents=True, exist_ok=True)
    for name in (SINGLE, SHARDED):
        if (out / name).exists():
            shutil.rmtree(out / name)
    write_variant(out / SINGLE, weights, common, 1)
    write_variant(out / SHARDED, weights, common, shards)
    manifest = {
        "recipe": {"seed": seed, "shards": shards, "version": RECIPE_VERSION},
        "vocab_size": vocab_size,
        "variants": {
            name: {p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)} for p in sorted((out / name).iterdir())}
            for name in (SINGLE, SHARDED)
        },
    }
    dump_json(out / "manifest.json", manifest)
    for p in out.rglob("*"):
        os.chmod(p, 0o755 if p.is_dir() else 0o644)  # safetensors writes 0600 files
    return manifest


def cache_root() -> Path:
    return Path(os.environ.get("RIGOPS_CACHE") or Path.home() / ".cache" / "rigops")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="output dir (default: cached under $RIGOPS_CACHE/model)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shards", type=int, default=3, help="shards of the sharded variant")
    ap.add_argument("--force", action="store_true", help="rebuild even if the cache is complete")
    args = ap.parse_args(argv)
    out = args.out or cache_root() / "model" / recipe_hash(args.seed, args.shards)
    t0 = time.monotonic()
    stamp = out / "manifest.json"
    if args.out is None and stamp.exists() and not args.force:
        print(f"tiny model: cached in {time.monotonic() - t0:.2f}s", file=sys.stderr)
    else:
        # build next to the destination, then move into place: a killed build leaves no half model
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=out.parent))
        try:
            build(tmp, seed=args.seed, shards=args.shards)
            out.mkdir(parents=True, exist_ok=True)
            for name in (SINGLE, SHARDED, "manifest.json"):
                if (out / name).is_dir():
                    shutil.rmtree(out / name)
                os.replace(tmp / name, out / name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print(f"tiny model: built in {time.monotonic() - t0:.2f}s", file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
