"""The tiny model generator: determinism, shard index, Llama shapes, tokenizer, chat template.

Needs numpy, safetensors and tokenizers (lab/sandbox/model/requirements.txt, in requirements-dev.txt).
That transformers (and vLLM) load it is proven with the runtime's own torch and transformers in
tests/integration/test_sandbox_runtime.py.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import jinja2
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "lab" / "sandbox" / "model" / "make_tiny_model.py"
sys.path.insert(0, str(SCRIPT.parent))

import make_tiny_model as tm  # noqa: E402


def digests(d: Path) -> dict[str, str]:
    return {
        p.relative_to(d).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(d.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "m"
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--seed", "0", "--shards", "3"], check=True)
    return out


def test_same_seed_is_byte_identical_across_processes(model, tmp_path):
    again = tmp_path / "again"
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(again), "--seed", "0", "--shards", "3"], check=True)
    assert digests(model) == digests(again)


def test_other_seed_changes_weights_only(model, tmp_path):
    other = tmp_path / "other"
    tm.build(other, seed=1, shards=3)
    a, b = digests(model), digests(other)
    changed = {k for k in a if a[k] != b[k]}
    assert "tiny-llama/model.safetensors" in changed
    assert "tiny-llama/tokenizer.json" not in changed
    assert "tiny-llama/config.json" not in changed


def test_manifest_matches_files(model):
    manifest = json.loads((model / "manifest.json").read_text())
    for variant, files in manifest["variants"].items():
        on_disk = digests(model / variant)
        assert on_disk == {name: meta["sha256"] for name, meta in files.items()}


def test_config_sanity(model):
    cfg = json.loads((model / "tiny-llama" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    assert head_dim >= 32, "the vLLM CPU attention needs head_dim >= 32"
    assert cfg["head_dim"] == head_dim
    assert cfg["num_attention_heads"] % cfg["num_key_value_heads"] == 0
    assert cfg["max_position_embeddings"] >= 1024
    tok = json.loads((model / "tiny-llama" / "tokenizer.json").read_text())
    assert len(tok["model"]["vocab"]) <= cfg["vocab_size"]
    assert max(tok["model"]["vocab"].values()) < cfg["vocab_size"]


def test_llama_tensor_names_and_shapes(model):
    from safetensors.numpy import load_file

    cfg = json.loads((model / "tiny-llama" / "config.json").read_text())
    tensors = load_file(str(model / "tiny-llama" / "model.safetensors"))
    h, v, i = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    expected = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        expected.update(
            {
                p + "self_attn.q_proj.weight": (h, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, h),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
            }
        )
    assert {k: t.shape for k, t in tensors.items()} == expected
    assert all(t.dtype == np.float32 for t in tensors.values())


def test_shard_index_is_consistent(model):
    from safetensors import safe_open

    d = model / "tiny-llama-sharded"
    index = json.loads((d / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in d.glob("*.safetensors"))
    assert shards == [f"model-{n:05d}-of-00003.safetensors" for n in (1, 2, 3)]
    assert set(index["weight_map"].values()) == set(shards)
    total, seen = 0, {}
    for shard in shards:
        with safe_open(str(d / shard), framework="numpy") as f:
            for key in f.keys():
                t = f.get_tensor(key)
                seen[key] = shard
                total += t.nbytes
    assert seen == index["weight_map"]
    assert index["metadata"]["total_size"] == total
    # the same tensors as the single-file variant
    from safetensors.numpy import load_file

    single = load_file(str(model / "tiny-llama" / "model.safetensors"))
    assert set(single) == set(seen)


def test_tokenizer_and_chat_template(model):
    from tokenizers import Tokenizer

    d = model / "tiny-llama"
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    text = "Hello! The quick brown fox jumps over the lazy dog. GPU 0: 32607 MiB ünïcödé"
    assert tok.decode(tok.encode(text).ids) == text  # byte-level: round-trips anything
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert cfg["eos_token"] == "<|im_end|>"
    ids = {int(k): v["content"] for k, v in cfg["added_tokens_decoder"].items()}
    assert all(tok.token_to_id(content) == i for i, content in ids.items())
    rendered = (
        jinja2.Environment()
        .from_string(cfg["chat_template"])
        .render(messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True)
    )
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    gen = json.loads((d / "generation_config.json").read_text())
    assert tok.token_to_id("<|im_end|>") in gen["eos_token_id"]


def test_split_shards_balances():
    assert [len(g) for g in tm.split_shards(list("abcdefg"), 3)] == [3, 2, 2]
    assert tm.split_shards(list("ab"), 5) == [["a"], ["b"]]
