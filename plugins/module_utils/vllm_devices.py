# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which device nodes one vLLM instance may open: the plan of its drop-in
``vllm@<instance>.service.d/devices.conf`` (roles/vllm_service), as plain data.

The unit ``vllm@.service`` has ``DevicePolicy=closed`` on the GPU flavours (cuda, jetson): an instance
opens no device unless its drop-in allows it. ``PrivateDevices=yes`` on the cpu flavour (no drop-in).

cuda: the instance's own GPUs and the driver's shared nodes, nothing else.

- ``/dev/nvidia<minor>``: the GPU's node. Its minor number is the driver's (``minor_number`` in
  ``nvidia-smi -q -x``, the nvidia_gpu_facts fact), which need not be the nvidia-smi index that ``gpus``
  names (a real A100 capture: index 0, minor 1). Without a minor in the facts the index is assumed, and
  the plan says so in its notes.
- ``/dev/nvidiactl`` (minor 255): every CUDA process opens it.
- ``/dev/nvidia-uvm`` and ``/dev/nvidia-uvm-tools`` (class ``nvidia-uvm``, a major the kernel picks when
  the module loads): CUDA's unified memory; the class covers both nodes.
- ``/dev/nvidia-caps/*`` (class ``nvidia-caps``), read only: MIG capabilities, where the driver has them.
- not ``/dev/nvidia-modeset`` (minor 254): the display (KMS) interface of X, Wayland and EGL displays;
  CUDA does not open it. Nor ``/dev/nvidia-nvswitch*`` (the fabric manager's, not CUDA's).

The GPU nodes are named by number (``/dev/char/195:<minor>``, the driver's fixed major 195) and the uvm
and caps nodes by class: systemd resolves a node path when it sets up the unit's cgroup, once per start,
before ExecStartPre=, and skips a path that does not exist yet; a number or a class needs no node. The
access includes ``m`` (mknod) on the nodes the root ExecStartPre= (``nvidia-modprobe``) may have to
create: DevicePolicy= binds every process of the unit's cgroup, the ``+`` (privileged) ones too. The
service itself cannot mknod (no CAP_MKNOD), so ``m`` gives it nothing.

jetson: one integrated GPU, shared by every instance of the board: a fixed list of the nodes CUDA
opens on Orin (JetPack 6, nvgpu driver) and on Thor (JetPack 7, NVIDIA's unified OpenRM driver), by
path (L4T's udev rules create them at boot; a path absent on the board is skipped by systemd). The list
is drawn from the nodes NVIDIA's container runtime hands to containers on these boards (its CSV and CDI
files), less the display, camera, video and PVA nodes; it has not been checked on a board by this project
(roles/vllm_service/README.md). What a board needs beyond it goes in vllm_service_device_allow.

Pure functions, standard library only (Python 3.8+).
"""

from __future__ import annotations

import re

FLAVOURS = ("cpu", "cuda", "jetson")
GPU_FLAVOURS = ("cuda", "jetson")
NVIDIA_MAJOR = 195  # the nvidia module's fixed character major (nvidia-modprobe: NV_MAJOR_DEVICE_NUMBER)
CTL_MINOR = 255  # /dev/nvidiactl
NVIDIA_MODPROBE = "/usr/bin/nvidia-modprobe"

# The nodes every cuda instance shares: (DeviceAllow= entry, what it is).
CUDA_SHARED = (
    (f"/dev/char/{NVIDIA_MAJOR}:{CTL_MINOR} rwm", "/dev/nvidiactl, the driver's control node"),
    ("char-nvidia-uvm rwm", "/dev/nvidia-uvm and /dev/nvidia-uvm-tools (unified memory; major set at load)"),
    ("char-nvidia-caps r", "/dev/nvidia-caps/* (MIG capabilities), where the driver has them"),
)

# Jetson: (DeviceAllow= entry, what it is). Orin first (nvgpu: the nodes of JetPack 6, then their legacy
# names, which JetPack 6 still creates), then Thor (OpenRM: nodes like a discrete GPU's), then what both use.
_ORIN_NODES = ("ctrl", "as", "channel", "tsg", "ctxsw", "dbg", "prof", "prof-ctx", "prof-dev", "sched", "nvsched",
               "nvsched_ctrl_fifo", "power")  # fmt: skip
_ORIN_LEGACY = ("ctrl-gpu", "as-gpu", "gpu", "tsg-gpu", "ctxsw-gpu", "dbg-gpu", "prof-gpu", "prof-ctx-gpu",
                "prof-dev-gpu", "sched-gpu", "nvsched-gpu", "nvsched_ctrl_fifo-gpu", "power-gpu")  # fmt: skip
JETSON_NODES = (
    tuple((f"/dev/nvgpu/igpu0/{n} rw", "Orin (nvgpu)") for n in _ORIN_NODES)
    + tuple((f"/dev/nvhost-{n} rw", "Orin (nvgpu, legacy name)") for n in _ORIN_LEGACY)
    + (
        (f"/dev/char/{NVIDIA_MAJOR}:{CTL_MINOR} rw", "Thor (OpenRM): /dev/nvidiactl"),
        (f"/dev/char/{NVIDIA_MAJOR}:0 rw", "Thor (OpenRM): /dev/nvidia0, the integrated GPU"),
        (f"/dev/char/{NVIDIA_MAJOR}:1 rw", "Thor (OpenRM): /dev/nvidia1 (listed by NVIDIA's container runtime)"),
        ("char-nvidia-uvm rwm", "Thor (OpenRM): /dev/nvidia-uvm, /dev/nvidia-uvm-tools"),
        ("/dev/nvmap rw", "Orin, Thor: the Tegra memory allocator"),
        ("/dev/host1x-fence rw", "Orin, Thor: host1x sync fences (CUDA's initialisation needs them on Orin)"),
        ("/dev/dri/renderD128 rw", "Orin, Thor: the GPU's DRM render node (CUDA's initialisation on Orin)"),
    )
)

# A DeviceAllow= entry: a node path, /dev/char|block/<major>:<minor>, or char-/block-<class>, and the access.
_ENTRY = re.compile(r"^(/dev/[^\s]+|(?:char|block)-[^\s]+)( [rwm]{1,3})?$")


def entry_problem(entry):
    """Why ``entry`` is no DeviceAllow= line for this role (None when it is one)."""
    if not isinstance(entry, str) or not _ENTRY.match(entry):
        return (
            f"{entry!r} is not a DeviceAllow= entry: write a node (/dev/...) or a class (char-<name>, "
            "block-<name>), a space and the access (r, w, m), e.g. 'char-nvidia-caps-imex-channels rw'"
        )
    access = entry.split(" ")[1] if " " in entry else ""
    if len(set(access)) != len(access):
        return f"{entry!r}: the access {access!r} repeats a letter; write each of r, w, m once"
    return None


def gpu_minors(gpus, gpu_facts=None):
    """Each GPU index of ``gpus`` with its device node: [{index, minor, minor_from, pci_bus_id, name}].

    ``gpu_facts``: the nvidia_gpu fact ({gpus: [{index, minor_number, pci_bus_id, name, ...}]}), or
    None/{} when it could not be read. ``minor_from`` is ``facts``, or ``index`` when the facts have no
    minor number for that GPU (then the minor is assumed to equal the index).
    """
    by_index = {}
    for gpu in (gpu_facts or {}).get("gpus") or []:
        if isinstance(gpu, dict) and isinstance(gpu.get("index"), int):
            by_index[gpu["index"]] = gpu
    out = []
    for index in gpus:
        fact = by_index.get(index, {})
        minor = fact.get("minor_number")
        known = isinstance(minor, int) and not isinstance(minor, bool) and 0 <= minor < CTL_MINOR - 1
        out.append(
            {
                "index": index,
                "minor": minor if known else index,
                "minor_from": "facts" if known else "index",
                "pci_bus_id": fact.get("pci_bus_id"),
                "name": fact.get("name"),
            }
        )
    return out


def device_plan(name, flavour, gpus, gpu_facts=None, extra=()):
    """The devices drop-in of instance ``name``: {name, flavour, gpus, allow, exec_start_pre, notes}.

    ``allow``: [{entry, what}] in the order of the DeviceAllow= lines; ``exec_start_pre``: the root
    commands (ExecStartPre=) that create the instance's GPU nodes; ``notes``: what the operator should
    know (minor numbers assumed). The cpu flavour has no drop-in: ``allow`` is empty.
    ValueError for an unknown flavour or a malformed extra entry.
    """
    if flavour not in FLAVOURS:
        raise ValueError(f"flavour {flavour!r} is unknown; use one of {', '.join(FLAVOURS)}")
    for entry in extra:
        problem = entry_problem(entry)
        if problem:
            raise ValueError(f"vllm_service_device_allow: {problem}")
    plan = {"name": name, "flavour": flavour, "gpus": [], "allow": [], "exec_start_pre": [], "notes": []}
    if flavour == "cpu":
        return plan
    if flavour == "jetson":
        plan["gpus"] = [
            {"index": i, "minor": None, "minor_from": "shared", "pci_bus_id": None, "name": None} for i in gpus
        ]
        plan["allow"] = [{"entry": e, "what": w} for e, w in JETSON_NODES]
    else:
        plan["gpus"] = gpu_minors(gpus, gpu_facts)
        for gpu in plan["gpus"]:
            where = f", {gpu['pci_bus_id']}" if gpu["pci_bus_id"] else ""
            plan["allow"].append(
                {
                    "entry": f"/dev/char/{NVIDIA_MAJOR}:{gpu['minor']} rwm",
                    "what": f"/dev/nvidia{gpu['minor']}, GPU {gpu['index']}{where} (minor from {gpu['minor_from']})",
                }
            )
        plan["allow"] += [{"entry": e, "what": w} for e, w in CUDA_SHARED]
        minors = " ".join(f"-c={g['minor']}" for g in plan["gpus"])
        plan["exec_start_pre"] = [f"-+{NVIDIA_MODPROBE} -c={CTL_MINOR} {minors}".rstrip()]
        assumed = [g["index"] for g in plan["gpus"] if g["minor_from"] == "index"]
        if assumed:
            plan["notes"].append(
                f"vllm@{name}: no minor number in the GPU facts (nvidia_gpu_facts: nvidia-smi -q -x) for GPU(s) "
                f"{assumed}: their device nodes are assumed to be /dev/nvidia<index> "
                f"({', '.join(f'/dev/nvidia{i}' for i in assumed)}); if the instance cannot open its GPUs, "
                "run the role where nvidia-smi works (the driver loaded)"
            )
    seen = {a["entry"] for a in plan["allow"]}
    for entry in extra:
        if entry not in seen:
            plan["allow"].append({"entry": entry, "what": "vllm_service_device_allow"})
            seen.add(entry)
    return plan


def device_plans(instances, flavour, gpu_facts=None, extra=()):
    """device_plan for each instance of a host ({name, gpus, ...} as merged by the contract, vllm_instances.merge)."""
    return [device_plan(inst["name"], flavour, list(inst.get("gpus") or []), gpu_facts, extra) for inst in instances]
