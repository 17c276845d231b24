"""The example inventory's rigs through the topology check, with the sandbox emulator as their nvidia-smi.

inventories/example ships two rig groups: rtx5090 (8x RTX 5090, one instance on GPUs 0-7,
tensor parallel 8) and h100 (8x H100, two instances of four GPUs). Each runs here against
its sandbox profile: rtx5090 on rtx5090x8 (NVIDIA's stock driver: GNS on every pair) and
on rtx5090x8-p2p (a P2P-enabled driver on the same box), h100 on h100x8.

The module's arguments are built the way roles/gpu_topology/tasks/main.yml builds them:
role defaults, then the example's group_vars (all, gpu-rigs, the rig's group). Only what
points at the simulated host changes: the nvidia-smi binary (lab/sandbox/driver_repo/nvidia-smi,
which the module runs itself), sysfs (the scratch root's, as inventories/sandbox does),
the environment files under the scratch root, and lspci -vvv captured from the
simulation's lspci (the module would otherwise run the test machine's own lspci).
"""

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.rigops.fleet.plugins.module_utils import vllm_instances as schema
from ansible_collections.rigops.fleet.plugins.modules import gpu_topology as gpu_topology_module

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "inventories" / "example"
ROLE = ROOT / "roles" / "gpu_topology"
HW = ROOT / "lab" / "sandbox" / "hardware"
SMI = ROOT / "lab" / "sandbox" / "driver_repo" / "nvidia-smi"
PROFILES = ROOT / "lab" / "sandbox" / "profiles"
KREL = "6.1.0-nvsim-test"
ACS_REDIRECT = "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"


def load_yaml(path):
    return yaml.safe_load(path.read_text()) or {}


class SimRig:
    """A simulated rig in a scratch root, driver installed and loaded (as after the driver role)."""

    def __init__(self, root, profile):
        self.root = root
        self.env = dict(os.environ, NVIDIA_SIM_ROOT=str(root), NVIDIA_SIM_KERNEL_RELEASE=KREL, HOME=str(root / "root"))
        self.env.pop("NVIDIA_SIM_DRIVER_VERSION", None)
        (root / "etc/nvidia-sim").mkdir(parents=True)
        (root / "root").mkdir()
        (root / "etc/nvidia-sim/profile.yaml").write_text(yaml.safe_dump(profile))
        self.check(HW / "install-hardware")
        code = "from nvsim import kmod; kmod.install_driver_modules('595.45.04', 'open')"
        subprocess.run([sys.executable, "-c", code], env=dict(self.env, PYTHONPATH=str(HW / "lib")), check=True)
        self.path("/etc/modprobe.d").mkdir(parents=True, exist_ok=True)
        self.path("/etc/modprobe.d/blacklist-nouveau.conf").write_text("blacklist nouveau\noptions nouveau modeset=0\n")
        self.path("/etc/modules-load.d").mkdir(parents=True, exist_ok=True)
        self.path("/etc/modules-load.d/nvidia.conf").write_text("nvidia\nnvidia_uvm\n")
        self.check(HW / "bin" / "update-initramfs", "-u")
        shutil.rmtree(self.path("/run"), ignore_errors=True)  # reboot: /run is a tmpfs
        self.check(HW / "bin" / "nvidia-sim-boot", "--no-services")
        # the module runs nvidia-smi itself; this wrapper runs the emulator with the test's Python
        self.nvidia_smi = root / "nvidia-smi"
        self.nvidia_smi.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{SMI}" "$@"\n')
        self.nvidia_smi.chmod(self.nvidia_smi.stat().st_mode | stat.S_IXUSR)

    def path(self, p):
        return self.root / p.lstrip("/")

    def check(self, exe, *args, **env):
        r = subprocess.run(
            [sys.executable, str(exe), *args],
            env=dict(self.env, **env),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert r.returncode == 0, r.stderr
        return r.stdout


def profile(name, acs_redirect=False):
    data = load_yaml(PROFILES / f"{name}.yaml")
    if acs_redirect:  # ACS on in the BIOS: every port redirects peer traffic upstream
        for dev in data["pci"]:
            if dev["kind"] in ("root_port", "switch_downstream"):
                dev["acs_ctl"] = ACS_REDIRECT
    return data


def inventory_vars(group):
    """Role defaults, then the example's group_vars of all, gpu-rigs and the rig's group."""
    merged = load_yaml(ROLE / "defaults" / "main.yml")
    for layer in ("all", "gpu-rigs", group):
        for f in sorted((EXAMPLE / "group_vars" / layer).glob("*.yml")):
            merged.update(load_yaml(f))
    assert "rigops.fleet.vllm_instances(vllm_service_instance_defaults" in merged["gpu_topology_instances"]
    merged["gpu_topology_instances"] = schema.merge(
        merged["vllm_instances"], merged.get("vllm_service_instance_defaults")
    )
    return merged


def role_module_args(group):
    """The gpu_topology module's arguments as the role's task passes them for this group."""
    values = inventory_vars(group)
    tasks = load_yaml(ROLE / "tasks" / "main.yml")
    (check,) = [t for t in tasks if "block" in t]
    (task,) = [t for t in check["block"] if "rigops.fleet.gpu_topology" in t]
    instances = values["gpu_topology_instances"]
    args = {}
    for option, template in task["rigops.fleet.gpu_topology"].items():
        if option == "groups":
            assert template == "{{ gpu_topology__groups }}"
            args["groups"] = [{"name": i["name"], "gpus": i["gpus"]} for i in instances]
            continue
        var = re.search(r"\b(gpu_topology_[a-z0-9_]+)", template).group(1)
        value = values[var]
        if value is None or value == "":  # the task's omit
            continue
        args[option] = value
    # the role's preflight (tasks/preflight.yml) would stop an inconsistent inventory first
    for inst in instances:
        assert 1 <= inst["engine"].get("tensor_parallel_size", len(inst["gpus"])) <= len(inst["gpus"])
        assert max(inst["gpus"]) < values["gpu_topology_expected_gpus"]
    return args


@pytest.fixture
def run_check(tmp_path, monkeypatch, run_module):
    """Run the module on a simulated rig of ``profile_data`` with the example group's arguments."""
    count = [0]

    def _run(group, profile_data, environment=None):
        count[0] += 1
        rig = SimRig(tmp_path / f"rig{count[0]}", profile_data)
        if environment is not None:
            rig.path("/etc/environment").write_text(environment)
        lspci = tmp_path / f"lspci{count[0]}.txt"
        lspci.write_text(rig.check(HW / "bin" / "lspci", "-vvv", NVIDIA_SIM_FAKE_EUID="0"))
        for key in ("NVIDIA_SIM_ROOT", "NVIDIA_SIM_KERNEL_RELEASE"):
            monkeypatch.setenv(key, rig.env[key])
        monkeypatch.delenv("NVIDIA_SIM_DRIVER_VERSION", raising=False)
        args = role_module_args(group)
        args.update(
            nvidia_smi_path=str(rig.nvidia_smi),
            sysfs_root=str(rig.path("/etc/nvidia-sim/sys")),
            env_files=[str(rig.path(p)) for p in args["env_files"]],
            lspci_file=str(lspci),
        )
        failed, result = run_module(gpu_topology_module.main, args)
        return failed, result, rig

    return _run


def lines_of(result, kind):
    return [line for line in result["problem_lines"] if f" {kind} [" in line]


def by_kind(result, kind):
    return [p for p in result["problems"] if p["kind"] == kind]


def test_example_inventory_is_what_these_tests_read():
    rtx = role_module_args("rtx5090")
    assert rtx["groups"] == [{"name": "main", "gpus": list(range(8))}]
    assert rtx["require_p2p"] is True and rtx["expected_gpus"] == 8 and rtx["p2p_modes"] == ["r", "w"]
    # the instance spans both sockets by design: the rtx5090 group allows SYS links for it
    assert rtx["worst_link_allowed"] == "SYS"
    assert "p2p_unsupported_by_product" not in rtx["fail_on"]
    h100 = role_module_args("h100")
    assert h100["groups"] == [{"name": "chat", "gpus": [0, 1, 2, 3]}, {"name": "coder", "gpus": [4, 5, 6, 7]}]
    assert h100["worst_link_allowed"] == "NODE" and h100["require_p2p"] is True


def test_example_5090_rig_passes_on_the_stock_driver_with_the_cost_explained(run_check):
    failed, result, _ = run_check("rtx5090", profile("rtx5090x8"))
    assert not failed, result.get("msg")
    assert result["passed"] and result["gpus"] == 8 and result["worst_link"] == "SYS"
    assert set(result["p2p"].values()) == {"GNS"} and len(result["p2p"]) == 28
    assert all(p["severity"] == "warning" for p in result["problems"])
    # every pair: the product offers no P2P; a warning that says what NCCL does and what it costs
    product = by_kind(result, "p2p_unsupported_by_product")
    assert len(product) == 28 and {p["cause_class"] for p in product} == {"product"}
    (line,) = lines_of(result, "p2p_unsupported_by_product")
    assert line.startswith("[main] all pairs of GPU[0-7] (28 pairs) p2p_unsupported_by_product [warning, product]: ")
    assert "GNS (GPU not supported)" in line and "host memory (SHM)" in line and "roughly half" in line
    assert "tensor_parallel_size 4 with '--pipeline-parallel-size=2'" in line
    assert "GPU[0-3] on NUMA 0, GPU[4-7] on NUMA 1" in line
    assert line in (ROLE / "README.md").read_text()  # the role's README shows this very line
    # the IOMMU groups split the GPUs by host bridge, which changes nothing without P2P
    iommu = by_kind(result, "iommu_split")
    assert len(iommu) == 24 and {p["cause_class"] for p in iommu} == {"informational"}
    (line,) = lines_of(result, "iommu_split")
    assert "GPU[0-1] x GPU[2-7], GPU[2-3] x GPU[4-7], GPU[4-5] x GPU[6-7] (24 pairs)" in line
    assert "[warning, informational]" in line and "4 IOMMU groups" in line
    (line,) = lines_of(result, "cross_numa")
    assert line.startswith("[main] GPU[0-3] x GPU[4-7] (16 pairs) cross_numa [warning, layout]: ")
    # 68 findings, three lines: one per kind, not one per pair
    assert len(result["problems"]) == 28 + 24 + 16
    assert len(result["problem_lines"]) == 3
    assert result["verdicts"][0]["p2p_product_pairs"] == [p["pair"] for p in product]


def test_example_5090_instance_passes_on_a_p2p_driver(run_check):
    failed, result, _ = run_check("rtx5090", profile("rtx5090x8-p2p"))
    assert not failed, result.get("msg")
    assert result["passed"] and result["p2p_ok"] is False
    # P2P inside each socket; CNS only across the two sockets, which no setting changes
    assert result["p2p"]["GPU0-GPU3"] == "OK" and result["p2p"]["GPU0-GPU4"] == "CNS"
    product = by_kind(result, "p2p_unsupported_by_product")
    assert {p["pair"] for p in product} == {f"GPU{a}-GPU{b}" for a in range(4) for b in range(4, 8)}
    (line,) = lines_of(result, "p2p_unsupported_by_product")
    assert line.startswith("[main] GPU[0-3] x GPU[4-7] (16 pairs) p2p_unsupported_by_product [warning, product]: ")
    assert "CNS (chipset not supported)" in line and "socket interconnect" in line
    assert not by_kind(result, "p2p_not_supported")
    # split IOMMU groups between host bridges of one socket: P2P works there, so it is the fixable kind
    # (a warning, not in fail_on); across the sockets it is informational
    classes = {(p["pair"], p["cause_class"]) for p in by_kind(result, "iommu_split")}
    assert ("GPU0-GPU2", "fixable") in classes and ("GPU0-GPU4", "informational") in classes
    assert all(p["severity"] == "warning" for p in result["problems"])


def test_example_h100_rig_passes(run_check):
    failed, result, _ = run_check("h100", profile("h100x8"))
    assert not failed, result.get("msg")
    assert result["passed"] and result["p2p_ok"] is True and result["worst_link"] == "NV18"
    assert [v["name"] for v in result["verdicts"]] == ["chat", "coder"]
    assert all(v["passed"] and v["p2p_product_pairs"] == [] for v in result["verdicts"])
    assert not any(p["severity"] == "error" for p in result["problems"])


@pytest.mark.parametrize("name", ["rtx5090x8", "rtx5090x8-p2p"])
def test_nccl_p2p_disable_left_in_the_environment_fails_with_its_fix(run_check, name):
    failed, result, rig = run_check("rtx5090", profile(name), environment="NCCL_P2P_DISABLE=1\n")
    assert failed and not result["passed"]
    path = rig.path("/etc/environment")
    (line,) = lines_of(result, "nccl_p2p_disabled")
    assert line.startswith("[main] GPU[0-7] nccl_p2p_disabled [error, fixable]: NCCL_P2P_DISABLE=1 in ")
    assert f"Fix: remove NCCL_P2P_DISABLE from {path} and restart the service" in line
    assert line in result["msg"] and "1 error(s) on 1 line(s)" in result["msg"]
    # the product warnings are still there, and do not fail
    assert {p["severity"] for p in by_kind(result, "p2p_unsupported_by_product")} == {"warning"}


def test_acs_redirect_fails_where_the_product_does_p2p_and_informs_where_it_does_not(run_check):
    failed, result, _ = run_check("rtx5090", profile("rtx5090x8-p2p", acs_redirect=True))
    assert failed and not result["passed"]
    acs = by_kind(result, "acs_redirect")
    assert len(acs) == 28
    inside = [p for p in acs if p["pair"] == "GPU0-GPU1"]
    assert inside[0]["severity"] == "error" and inside[0]["cause_class"] == "fixable"
    assert "BIOS: disable ACS" in inside[0]["fix"] and "pci=disable_acs_redir=" in inside[0]["fix"]
    across = [p for p in acs if p["pair"] == "GPU0-GPU4"]
    assert across[0]["severity"] == "warning" and across[0]["cause_class"] == "informational"
    error_lines = [line for line in result["problem_lines"] if "[error" in line]
    assert any(" acs_redirect [error, fixable]: ACS redirects peer traffic" in line for line in error_lines)
    assert all("acs_redirect" in line or "iommu_split" in line for line in error_lines), error_lines

    stock_failed, stock, _ = run_check("rtx5090", profile("rtx5090x8", acs_redirect=True))
    assert not stock_failed, stock.get("msg")
    assert {(p["severity"], p["cause_class"]) for p in by_kind(stock, "acs_redirect")} == {("warning", "informational")}
    (line,) = lines_of(stock, "acs_redirect")
    assert "all pairs of GPU[0-7] (28 pairs) acs_redirect [warning, informational]" in line
    assert "matters only with a P2P-capable driver or GPU" in line
