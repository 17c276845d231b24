"""Hardware profiles: load one and derive what the real tools would compute.

A profile (``lab/sandbox/profiles/<name>.yaml``) describes one machine: its NUMA nodes,
its PCI tree (host bridges, root ports, switch ports with their ACS flags), the GPUs
and NICs hanging off that tree, NVLink, P2P rules and a few platform facts. From the
tree this module derives, the way NVML does, the ``nvidia-smi topo -m`` link codes
(PIX, PXB, PHB, NODE, SYS, NV#), and, the way Linux does, the IOMMU groups.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import yaml

from . import paths

P2P_CAPS = ("r", "w", "n", "a", "p")
BRIDGE_KINDS = ("host_bridge", "root_port", "switch_upstream", "switch_downstream")
PORT_KINDS = ("root_port", "switch_downstream")

# Default lspci names per kind, used when the profile gives none.
DEFAULT_LABELS = {
    "host_bridge": ("0600", "1022", "14a4", "Advanced Micro Devices, Inc. [AMD] Genoa/Bergamo Root Complex"),
    "root_port": ("0604", "1022", "14ab", "Advanced Micro Devices, Inc. [AMD] Genoa/Bergamo GPP Bridge"),
    "switch_upstream": ("0604", "1000", "c030", "Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0)"),
    "switch_downstream": ("0604", "1000", "c030", "Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0)"),
    "nic": ("0207", "15b3", "1021", "Mellanox Technologies MT2910 Family [ConnectX-7]"),
    "audio": ("0403", "10de", "22e8", "NVIDIA Corporation Device 22e8 (rev a1)"),
    "other": ("0300", "1a03", "2000", "ASPEED Technology, Inc. ASPEED Graphics Family (rev 52)"),
}
CLASS_NAMES = {
    "0300": "VGA compatible controller",
    "0302": "3D controller",
    "0403": "Audio device",
    "0600": "Host bridge",
    "0604": "PCI bridge",
    "0200": "Ethernet controller",
    "0207": "Infiniband controller",
}
ACS_OFF = "SrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-"
ACS_CAP = "SrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans+"


class ProfileError(Exception):
    pass


@dataclass
class PciDev:
    bdf: str  # 0000:01:00.0
    kind: str
    parent: str | None
    class_code: str
    vendor: str
    device: str
    label: str
    numa_node: int = -1
    acs_ctl: str | None = None
    acs_cap: str | None = None
    link: str = ""  # "32GT/s x16"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def short(self) -> str:
        return self.bdf[5:]


@dataclass
class Gpu:
    index: int  # nvidia-smi index (visible GPUs only, PCI order)
    bdf: str
    uuid: str
    numa_node: int
    cpu_affinity: str
    visible: bool
    spec: dict[str, Any]

    @property
    def bus_id(self) -> str:
        """nvidia-smi's 8-hex-digit domain form: 00000000:01:00.0."""
        dom, rest = self.bdf.split(":", 1)
        return f"{int(dom, 16):08X}:{rest.upper()}"

    def __getitem__(self, key: str) -> Any:
        return self.spec[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.spec.get(key, default)


class Profile:
    def __init__(self, data: dict[str, Any], source: str = "<memory>"):
        self.data = data
        self.source = source
        self.name: str = data.get("name", os.path.basename(source).removesuffix(".yaml"))
        self.system: dict[str, Any] = data.get("system") or {}
        self.numa = {int(n["id"]): n for n in self.system.get("numa_nodes") or [{"id": 0, "cpus": "0-15"}]}
        self.pci: dict[str, PciDev] = {}
        self._build_pci()
        self.all_gpus = self._build_gpus()
        self.gpus = [g for g in self.all_gpus if g.visible]
        self.nics = self._build_nics()

    # ---------------------------------------------------------------- building
    def _add(self, dev: PciDev) -> None:
        if dev.bdf in self.pci:
            raise ProfileError(f"{self.source}: PCI address {dev.bdf} listed twice")
        if dev.parent and dev.parent not in self.pci:
            raise ProfileError(f"{self.source}: {dev.bdf} has unknown parent {dev.parent}")
        self.pci[dev.bdf] = dev

    def _entry(self, e: dict[str, Any], kind: str) -> PciDev:
        cls, ven, dev, label = DEFAULT_LABELS.get(kind, DEFAULT_LABELS["other"])
        numa = e.get("numa_node")
        if numa is None and e.get("parent") in self.pci:
            numa = self.pci[e["parent"]].numa_node
        acs_ctl = e.get("acs_ctl")
        if kind in PORT_KINDS and acs_ctl is None:
            acs_ctl = ACS_OFF
        return PciDev(
            bdf=e["bdf"],
            kind=kind,
            parent=e.get("parent"),
            class_code=str(e.get("class", cls)),
            vendor=str(e.get("vendor", ven)),
            device=str(e.get("device", dev)),
            label=e.get("label", label),
            numa_node=-1 if numa is None else int(numa),
            acs_ctl=acs_ctl,
            acs_cap=e.get("acs_cap", ACS_CAP if kind in PORT_KINDS else None),
            link=e.get("link", ""),
            extra={k: v for k, v in e.items() if k not in ("bdf", "kind", "parent")},
        )

    def _build_pci(self) -> None:
        for e in self.data.get("pci") or []:
            self._add(self._entry(e, e.get("kind", "other")))

    def _build_gpus(self) -> list[Gpu]:
        model = dict(self.data.get("gpu_model") or {})
        out: list[Gpu] = []
        entries = sorted(self.data.get("gpus") or [], key=lambda e: e["bdf"])
        index = 0
        for e in entries:
            spec = {**model, **{k: v for k, v in e.items() if k not in ("bdf", "parent")}}
            dev = self._entry(
                {
                    "bdf": e["bdf"],
                    "parent": e.get("parent"),
                    "class": spec.get("pci_class", "0300"),
                    "vendor": "10de",
                    "device": spec.get("pci_device_id", "2b85"),
                    "label": f"NVIDIA Corporation {spec.get('chip', 'Device')} [{spec.get('lspci_name', spec['name'])}]"
                    + f" (rev {spec.get('pci_rev', 'a1')})",
                    "link": spec.get("pcie_link", "32GT/s x16"),
                },
                "gpu",
            )
            dev.extra["gpu"] = True
            integrated = bool(spec.get("integrated", False))  # Jetson: the GPU is not on PCI
            if not integrated:
                if e.get("parent") is None:
                    raise ProfileError(f"{self.source}: GPU {e['bdf']} needs a parent bridge")
                self._add(dev)
            if spec.get("audio_device") and not integrated:
                fn = e["bdf"][:-1] + "1"
                self._add(
                    self._entry(
                        {
                            "bdf": fn,
                            "parent": e.get("parent"),
                            "device": spec["audio_device"],
                            "label": f"NVIDIA Corporation Device {spec['audio_device']} (rev a1)",
                        },
                        "audio",
                    )
                )
            numa = dev.numa_node if dev.numa_node >= 0 else int(e.get("numa_node", 0))
            visible = bool(e.get("visible", True))
            out.append(
                Gpu(
                    index=index if visible else -1,
                    bdf=e["bdf"],
                    uuid=e["uuid"],
                    numa_node=numa,
                    cpu_affinity=e.get("cpu_affinity") or str(self.numa.get(numa, {}).get("cpus", "")),
                    visible=visible,
                    spec=spec,
                )
            )
            if visible:
                index += 1
        return out

    def _build_nics(self) -> list[dict[str, Any]]:
        nics = []
        for e in self.data.get("nics") or []:
            self._add(self._entry({**e, "kind": "nic"}, "nic"))
            nics.append(e)
        return sorted(nics, key=lambda n: n["name"])

    # ---------------------------------------------------------------- facts
    @property
    def driver(self) -> dict[str, Any]:
        return self.data.get("driver") or {}

    @property
    def jetson(self) -> dict[str, Any] | None:
        return self.data.get("jetson")

    @property
    def secure_boot(self) -> bool:
        return bool(self.system.get("secure_boot", False))

    @property
    def nouveau_capable(self) -> bool:
        return any(g.get("nouveau", False) for g in self.all_gpus)

    @property
    def has_nvidia_gpu_on_pci(self) -> bool:
        """An NVIDIA display-class (03xx) function; NVIDIA bridges (Jetson root ports) do not count."""
        return any(d.vendor == "10de" and d.class_code.startswith("03") for d in self.pci.values())

    def gpu_by_bus_id(self, bus_id: str) -> Gpu | None:
        for g in self.gpus:
            if g.bus_id.lower() == bus_id.lower() or g.bdf.lower() == bus_id.lower():
                return g
        return None

    # ---------------------------------------------------------------- topology
    def ancestors(self, bdf: str) -> list[str]:
        chain = []
        cur = self.pci[bdf].parent
        while cur:
            chain.append(cur)
            cur = self.pci[cur].parent
        return chain

    def host_bridge(self, bdf: str) -> str | None:
        for a in self.ancestors(bdf):
            if self.pci[a].kind == "host_bridge":
                return a
        return None

    def numa_of(self, bdf: str) -> int:
        hb = self.host_bridge(bdf)
        return self.pci[hb].numa_node if hb else self.pci[bdf].numa_node

    def pcie_link(self, a: str, b: str) -> str:
        """The PCIe part of NVML's topology level between two devices."""
        if a == b:
            return "X"
        hb_a, hb_b = self.host_bridge(a), self.host_bridge(b)
        if hb_a is None or hb_b is None or hb_a != hb_b:
            return "NODE" if self.numa_of(a) == self.numa_of(b) else "SYS"
        anc_a, anc_b = self.ancestors(a), self.ancestors(b)
        common = next(x for x in anc_a if x in anc_b)
        if self.pci[common].kind == "host_bridge":
            return "PHB"
        path = anc_a[: anc_a.index(common)] + [common] + anc_b[: anc_b.index(common)]
        switches = set()
        for node in path:
            d = self.pci[node]
            if d.kind == "switch_upstream":
                switches.add(node)
            elif d.kind == "switch_downstream" and d.parent:
                switches.add(d.parent)
        return "PIX" if len(switches) <= 1 else "PXB"

    def nvlinks(self, ga: Gpu, gb: Gpu) -> int:
        nv = self.data.get("nvlink") or {}
        for pair in nv.get("pairs") or []:
            if {ga.index, gb.index} == set(pair["gpus"]):
                return int(pair["links"])
        return int(nv.get("all", 0))

    def gpu_link(self, ga: Gpu, gb: Gpu, pcie_only: bool = False) -> str:
        if ga.bdf == gb.bdf:
            return "X"
        n = 0 if pcie_only else self.nvlinks(ga, gb)
        return f"NV{n}" if n else self.pcie_link(ga.bdf, gb.bdf)

    def p2p(self, ga: Gpu, gb: Gpu, cap: str) -> str:
        if ga.bdf == gb.bdf:
            return "X"
        rules = self.data.get("p2p") or {}
        for pair in rules.get("pairs") or []:
            if {ga.index, gb.index} == set(pair["gpus"]) and cap in pair:
                return pair[cap]
        link = self.gpu_link(ga, gb)
        by_link = rules.get("by_link") or {}
        key = "NV#" if link.startswith("NV") else link
        if key in by_link and cap in by_link[key]:
            return by_link[key][cap]
        default = {"r": "OK", "w": "OK", "n": "NS", "a": "OK", "p": "OK"}
        default.update(rules.get("default") or {})
        if cap == "n" and link.startswith("NV"):
            return (rules.get("default") or {}).get("n_nvlink", "OK")
        return default[cap]

    # ---------------------------------------------------------------- IOMMU
    def iommu_groups(self) -> dict[str, int]:
        """bdf -> group number, the way Linux groups devices behind ACS.

        A device is isolated at the nearest port above it whose ACS control has
        request and completion redirect on (ReqRedir+ CmpltRedir+); everything
        below a port without that isolation shares one group up to the next
        isolating port or the host bridge. Host bridges get a group each.
        Empty when the profile says the IOMMU is off.
        """
        if not self.system.get("iommu", True):
            return {}
        keys: dict[str, str] = {}
        for bdf, dev in self.pci.items():
            if dev.kind == "host_bridge" or (dev.kind in PORT_KINDS and acs_isolates(dev.acs_ctl)):
                keys[bdf] = bdf
                continue
            key, below = bdf, bdf
            for a in self.ancestors(bdf):
                ad = self.pci[a]
                if ad.kind in PORT_KINDS and acs_isolates(ad.acs_ctl):
                    # isolated here: alone (with its other functions) or with its subtree
                    key = "dev:" + bdf.rsplit(".", 1)[0] if below == bdf else "sub:" + below
                    break
                if ad.kind == "host_bridge":
                    key = "hb:" + a
                    break
                below = a
            keys[bdf] = key
        order: dict[str, int] = {}
        out = {}
        for bdf in sorted(keys):
            k = keys[bdf]
            if k not in order:
                order[k] = len(order)
            out[bdf] = order[k]
        return out


def acs_isolates(ctl: str | None) -> bool:
    return bool(ctl) and "ReqRedir+" in ctl and "CmpltRedir+" in ctl


def load(path: str | None = None) -> Profile:
    path = path or paths.profile_path()
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    except FileNotFoundError as exc:
        raise ProfileError(f"no hardware profile at {path}") from exc
    return Profile(data, path)


def load_or_none(path: str | None = None) -> Profile | None:
    try:
        return load(path)
    except ProfileError:
        return None
