# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Compatibility logic of the vllm_runtime role: plain data in, plain data out.

The role's matrix (roles/vllm_runtime/vars/matrix.yml) lists, per flavour and build,
what a runtime needs from its host: CPU architecture, Python versions, the CUDA build's
minimum driver, the GPU compute capabilities the wheels carry, the JetPack release, disk
space. ``evaluate`` compares one build with what a host has and returns every mismatch
as a row (what the host has, what the build needs, which variable to change), and
``render_table`` turns those rows into the text the play stops with.
"""

from __future__ import annotations

import re

# vLLM's ModelScope path (VLLM_USE_MODELSCOPE=true) is broken before this release.
MODELSCOPE_MIN_VLLM = "0.6.3"

FLAVOURS = ("cuda", "jetson", "cpu")


def version_tuple(text):
    """'580.65.06' -> (580, 65, 6); '2.13.0+cpu' -> (2, 13, 0); None or '' -> None."""
    if text is None:
        return None
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(text))
    if not m:
        return None
    return tuple(int(p) for p in m.group(1).split("."))


def version_ge(have, need):
    """True when version ``have`` >= ``need`` (missing trailing parts count as 0)."""
    a, b = version_tuple(have), version_tuple(need)
    if a is None or b is None:
        return False
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)) >= b + (0,) * (width - len(b))


def python_minor(text):
    """'Python 3.11.2' or '3.11.2' -> '3.11'; None when unreadable."""
    m = re.search(r"(\d+)\.(\d+)", str(text or ""))
    return f"{m.group(1)}.{m.group(2)}" if m else None


def parse_jetpack(nv_tegra_release):
    """JetPack major.minor from /etc/nv_tegra_release ('# R38 (release), REVISION: 2.0, ...').

    L4T R36 is JetPack 6, R38 is JetPack 7 (L4T 36.4 -> JetPack 6.1+, 38.2 -> 7.0). Only
    the major release is mapped; the minor is reported as 0 when unknown.
    """
    m = re.search(r"R(\d+)\s*\(release\),\s*REVISION:\s*(\d+)(?:\.(\d+))?", str(nv_tegra_release or ""))
    if not m:
        return None
    l4t_major = int(m.group(1))
    jetpack_major = {35: 5, 36: 6, 38: 7}.get(l4t_major)
    if jetpack_major is None:
        return None
    return f"{jetpack_major}.0"


def select_build(matrix, flavour, build=None):
    """The matrix entry of ``flavour``/``build`` (the flavour's default build when ``build`` is empty).

    Returns (name, entry) or raises ValueError with the choices.
    """
    if flavour not in matrix:
        raise ValueError(
            f"unknown flavour {flavour!r}; choose one of {', '.join(sorted(matrix))} (vllm_runtime_flavour)"
        )
    builds = matrix[flavour].get("builds", {})
    name = build or matrix[flavour].get("default_build")
    if name not in builds:
        raise ValueError(
            f"flavour {flavour!r} has no build {name!r}; choose one of {', '.join(sorted(builds))} (vllm_runtime_build)"
        )
    return name, builds[name]


def _uses_modelscope(instances):
    for inst in instances or []:
        model = inst.get("model") if isinstance(inst, dict) else None
        if isinstance(model, dict) and str(model.get("source", "")).lower() == "modelscope":
            return True
    return False


def uses_modelscope(instances):
    """True when any instance takes its model from ModelScope (model.source == 'modelscope')."""
    return _uses_modelscope(instances)


def _gpu_label(gpu):
    sm = str(gpu.get("compute_capability", "?")).replace(".", "")
    return f"GPU{gpu.get('index', '?')} {gpu.get('name', '?')} (sm_{sm})"


def evaluate(flavour, build_name, build, host, instances=None, vllm_version=None):
    """Judge one build against one host.

    ``build``: the matrix entry. ``host``: {arch, python, driver_version, gpus: [{index,
    name, compute_capability}], jetpack, disk_free_bytes, nvidia_smi (bool: the GPU facts
    could be read)}. Keys that are missing or None are "unknown". ``vllm_version``: the
    vLLM version to be installed (defaults to the build's).

    Returns {"ok": bool, "problems": [row, ...]}, each row {"check", "host_has",
    "build_needs", "variable"}.
    """
    problems = []
    host = host or {}
    vllm_version = vllm_version or (build.get("vllm") or {}).get("version")
    label = f"{flavour}/{build_name}"

    def refuse(check, has, needs, variable):
        problems.append({"check": check, "host_has": has, "build_needs": needs, "variable": variable})

    archs = build.get("architectures") or []
    if archs and host.get("arch") not in archs:
        refuse("architecture", host.get("arch") or "unknown", " or ".join(archs), "vllm_runtime_flavour")

    pythons = [str(p) for p in build.get("python") or []]
    have_py = python_minor(host.get("python"))
    if pythons and have_py not in pythons:
        refuse(
            "python",
            f"Python {have_py}" if have_py else "no readable Python",
            "Python " + ", ".join(pythons),
            "vllm_runtime_python",
        )

    if build.get("requires_gpu"):
        gpus = host.get("gpus") or []
        if not host.get("nvidia_smi") and flavour != "jetson":
            refuse(
                "driver",
                "no NVIDIA driver (nvidia-smi missing)",
                f"driver >= {build.get('min_driver')}",
                "vllm_runtime_flavour (cpu) or run the nvidia_driver role first",
            )
        elif flavour == "cuda" and not gpus:
            refuse("gpus", "0 GPUs", "at least 1 NVIDIA GPU", "vllm_runtime_flavour")
        min_driver = build.get("min_driver")
        driver = host.get("driver_version")
        if min_driver and host.get("nvidia_smi") and not version_ge(driver, min_driver):
            refuse(
                "driver",
                f"driver {driver or 'unknown'}",
                f"driver >= {min_driver} (CUDA {build.get('cuda')})",
                "nvidia_driver_branch (upgrade the driver) or vllm_runtime_build",
            )
        supported = [str(c) for c in build.get("compute_capabilities") or []]
        bad = [g for g in gpus if str(g.get("compute_capability")) not in supported]
        if supported and bad:
            refuse(
                "compute capability",
                ", ".join(_gpu_label(g) for g in bad),
                f"{label} (CUDA {build.get('cuda')}) carries sm_" + ", sm_".join(c.replace(".", "") for c in supported),
                "vllm_runtime_build",
            )

    min_jetpack = build.get("min_jetpack")
    if min_jetpack:
        jp = host.get("jetpack")
        if not version_ge(jp, min_jetpack):
            refuse(
                "jetpack",
                f"JetPack {jp}" if jp else "no JetPack (/etc/nv_tegra_release unreadable)",
                f"JetPack >= {min_jetpack}",
                "vllm_runtime_build",
            )

    need_gb = build.get("disk_gb")
    free = host.get("disk_free_bytes")
    if need_gb and free is not None and free < float(need_gb) * 1024**3:
        refuse(
            "disk",
            f"{free / 1024**3:.1f} GiB free under {host.get('root', 'the releases root')}",
            f"{need_gb} GiB for the venv",
            "vllm_runtime_root (or free space)",
        )

    if _uses_modelscope(instances) and not version_ge(vllm_version, MODELSCOPE_MIN_VLLM):
        refuse(
            "modelscope",
            f"vLLM {vllm_version} with a ModelScope instance",
            f"vLLM >= {MODELSCOPE_MIN_VLLM} (VLLM_USE_MODELSCOPE is broken before)",
            "vllm_runtime_build (or model.source)",
        )

    return {"ok": not problems, "problems": problems}


def render_table(host_name, flavour, build_name, problems):
    """The refusal as a fixed-width table: check | host has | build needs | change."""
    header = ("check", "host has", "build needs", "change")
    rows = [(p["check"], p["host_has"], p["build_needs"], p["variable"]) for p in problems]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(4)]

    def line(r):
        return " | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()

    out = [
        f"vllm_runtime preflight refused {flavour}/{build_name} on {host_name} "
        f"({len(problems)} problem(s)); nothing was changed:",
        line(header),
        "-+-".join("-" * w for w in widths),
    ]
    out.extend(line(r) for r in rows)
    return "\n".join(out)


def release_id(flavour, build_name, build, python, content_sha256):
    """Directory name of a release: flavour, build, versions, Python and the lock's hash."""
    vllm = (build.get("vllm") or {}).get("version", "none")
    torch = build.get("torch", "none")
    raw = f"{flavour}-{build_name}-vllm{vllm}-torch{torch}-py{python_minor(python)}-{content_sha256[:12]}"
    return re.sub(r"[^A-Za-z0-9._+-]", "_", raw)


def lock_pins(text):
    """{normalised name: version} of the ``name==version`` lines of a requirements/lock text."""
    pins = {}
    for raw in str(text or "").splitlines():
        line = raw.split("#", 1)[0].strip()
        m = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*==\s*([^\s;\\]+)", line)
        if m:
            pins[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
    return pins


def compose_requirements(build, lock_text=None, extras=None, modelscope=False, modelscope_version=None):
    """The requirements file of a release, and the problems that make it unusable.

    With a lock: ``extras`` first (a missing wheel fails before the big downloads), then
    the lock as it is; the lock must pin the build's vLLM distribution and torch, and
    ``modelscope`` when an instance needs it. Without a lock: the build's pins.
    Returns (text, problems) with problems as rows for ``render_table``.
    """
    extras = [str(e).strip() for e in extras or [] if str(e).strip()]
    vllm = build.get("vllm") or {}
    dist, vllm_version, torch = vllm.get("distribution", "vllm"), vllm.get("version"), build.get("torch")
    problems = []
    if lock_text:
        pins = lock_pins(lock_text)
        for name, want in ((dist, vllm_version), ("torch", torch)):
            have = pins.get(name.lower())
            if want and have != str(want):
                problems.append(
                    {
                        "check": "lock",
                        "host_has": f"lock pins {name}=={have}" if have else f"lock lacks {name}",
                        "build_needs": f"{name}=={want}",
                        "variable": "vllm_runtime_lock_url (or vllm_runtime_build)",
                    }
                )
        if modelscope and "modelscope" not in pins:
            problems.append(
                {
                    "check": "modelscope",
                    "host_has": "lock without modelscope",
                    "build_needs": "modelscope (an instance uses model.source: modelscope)",
                    "variable": "vllm_runtime_lock_url",
                }
            )
        body = "\n".join(extras + [str(lock_text).rstrip("\n")])
    else:
        lines = [f"{dist}=={vllm_version}", f"torch=={torch}"]
        if modelscope:
            lines.append(f"modelscope=={modelscope_version}" if modelscope_version else "modelscope")
        body = "\n".join(lines + extras)
    return body + "\n", problems
