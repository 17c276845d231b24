# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Compatibility logic of the vllm_runtime role: plain data in, plain data out.

The role's matrix (roles/vllm_runtime/vars/main/matrix.yml) lists, per flavour and build,
what a runtime needs from its host: CPU architecture, Python versions, the CUDA build's
minimum driver, the GPU compute capabilities the wheels carry, the JetPack release, disk
space. ``evaluate`` compares one build with what a host has and returns every mismatch
as a row (what the host has, what the build needs, which variable to change), and
``render_table`` turns those rows into the text the play stops with.

A build may carry ``audit:`` facts read from its real wheels (``plugins/module_utils/wheel_audit.py``,
tests/fixtures/wheels/SOURCES.md): the CUDA runtime its vLLM kernels link, the toolkit
that built them, vLLM's torch pin and the GPU code of vLLM's core kernels and of torch.
``evaluate`` then refuses a build whose kernels need another CUDA major than its torch or
whose pin is another torch, takes the driver the kernels need into account, and judges
every GPU against the kernels' cubins and PTX instead of the declared list.
``audit_wheelhouse`` reads the wheels themselves from a wheelhouse on the host.

Runs on managed hosts: Python 3.8 compatible, standard library only.
"""

from __future__ import annotations

import os
import re

from ansible_collections.rigops.fleet.plugins.module_utils.wheel_audit import (
    WheelAuditError,
    audit_build,
    audit_wheel,
    canonical,
    driver_problem,
    judge_facts,
    parse_wheel_filename,
    pin_matches,
    wheel_files,
)

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

    ``build``: the matrix entry. ``host``: {arch, python, driver_version, cuda_version (the
    newest CUDA the driver supports, as nvidia-smi reports it), gpus: [{index, name,
    compute_capability}], jetpack, disk_free_bytes, nvidia_smi (bool: the GPU facts could be
    read)}. Keys that are missing or None are "unknown". ``vllm_version``: the vLLM version
    to be installed (defaults to the build's).

    Returns {"ok": bool, "problems": [row, ...], "warnings": [text, ...]}, each row
    {"check", "host_has", "build_needs", "variable"}.
    """
    problems, warnings = [], []
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

    audit = build.get("audit") or {}
    if audit:
        # the build itself: vLLM's kernels and its torch pin against the build's torch
        where = f"{label} (vllm {vllm_version})"
        rows = judge_facts(audit, torch_version=str(build.get("torch")), torch_cuda=build.get("cuda"), where=where)[0]
        for row in rows:
            row["host_has"] = f"{label}: {row['host_has']}"
            row["variable"] = (
                "vllm_runtime_build (another build; this matrix entry is incoherent: vars/main/matrix.yml)"
            )
        problems.extend(rows)

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
        if min_driver and host.get("nvidia_smi"):
            if not driver:
                refuse(
                    "driver",
                    "driver unknown",
                    f"driver >= {min_driver} (CUDA {build.get('cuda')})",
                    "nvidia_driver_branch (upgrade the driver) or vllm_runtime_build",
                )
            else:
                # the newest of torch's CUDA and the CUDA that built vLLM's kernels (audit)
                cuda = audit_needs_cuda(build)
                row = driver_problem(cuda, driver, host.get("cuda_version"), min_driver)
                if row:
                    problems.append(row)
        if audit.get("archs"):
            rows, warns = judge_facts(
                {"archs": audit["archs"], "torch_wheel": audit.get("torch_wheel")},
                gpus=gpus,
                where=f"{label} (vllm {vllm_version})",
            )
            for row in rows:
                row["variable"] = "vllm_runtime_build"
            problems.extend(rows)
            warnings.extend(warns)
        supported = [str(c) for c in build.get("compute_capabilities") or []]
        bad = [g for g in gpus if str(g.get("compute_capability")) not in supported]
        if supported and bad and not audit.get("archs"):
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

    return {"ok": not problems, "problems": problems, "warnings": warnings}


def fitting_builds(matrix, flavour, host, instances=None, exclude=None):
    """Names of the flavour's builds that this host fits (none of ``evaluate``'s problems)."""
    builds = (matrix.get(flavour) or {}).get("builds") or {}
    return [
        name
        for name in sorted(builds)
        if name != exclude and evaluate(flavour, name, builds[name], host, instances)["ok"]
    ]


def suggest_builds(problems, names):
    """Add the builds that fit to the rows whose fix is another build."""
    if not names:
        return problems
    hint = f"{', '.join(names)} fit{'s' if len(names) == 1 else ''} this host"
    for row in problems:
        change = str(row.get("variable", ""))
        if change.startswith("vllm_runtime_build") or change.endswith("or vllm_runtime_build"):
            row["variable"] = f"{change} ({hint})"
    return problems


def audit_needs_cuda(build):
    """The CUDA a build needs from the driver: its torch's, or the kernels' toolkit when newer (audit)."""
    cuda = build.get("cuda")
    kcuda = (build.get("audit") or {}).get("kernels_ptx_cuda")
    if kcuda and re.fullmatch(r"\d+\.\d+", str(kcuda)) and (not cuda or version_ge(kcuda, cuda)):
        return str(kcuda)
    return str(cuda) if cuda else None


def _python_tag(python):
    minor = python_minor(python)
    return f"cp{minor.replace('.', '')}" if minor else None


def audit_wheelhouse(build_label, build, wheelhouse, host):
    """Read the build's vLLM and torch wheels from a wheelhouse on the host and judge them.

    ``wheelhouse``: a folder (or file:// URL) holding the wheels pip is about to install,
    searched two levels deep. The vLLM wheel of the build's distribution and version and the
    torch wheel the build pins (for the host's Python when there are several) are read with
    ``wheel_audit`` and judged against the host's driver and GPUs. Returns (rows, warnings,
    facts); rows name the file and the fix.
    """
    path = wheelhouse[len("file://") :] if str(wheelhouse).startswith("file://") else str(wheelhouse)
    vllm = build.get("vllm") or {}
    dist, version, torch = canonical(vllm.get("distribution", "vllm")), vllm.get("version"), str(build.get("torch"))
    fix = "vllm_runtime_audit_wheelhouse (or fill the wheelhouse from the build's pins)"
    if not os.path.isdir(path):
        return [_row("wheelhouse", f"no folder {path}", f"the wheels of {build_label}", fix)], [], None
    names = {}
    for f in wheel_files(path):
        parsed = parse_wheel_filename(f)
        if parsed:
            names.setdefault(canonical(parsed["name"]), []).append((f, parsed))
    tag = _python_tag(host.get("python"))
    vllm_files = [f for f, p in names.get(dist, []) if p["version"] == str(version)]
    torch_files = [(f, p) for f, p in names.get("torch", []) if pin_matches(torch, p["version"])]
    torch_files = [f for f, p in torch_files if tag and tag in p["python"].split(".")] or [f for f, _p in torch_files]
    rows = []
    if not vllm_files:
        rows.append(_row("wheelhouse", f"no {dist}=={version} wheel in {path}", f"{dist}=={version}", fix))
    if not torch_files:
        rows.append(
            _row("wheelhouse", f"no torch=={torch} wheel for {tag or 'this Python'} in {path}", f"torch=={torch}", fix)
        )
    if rows:
        return rows, [], None
    try:
        reports = [audit_wheel(vllm_files[0], host.get("arch") or "x86_64", python_minor(host.get("python")) or "3.12")]
        reports.append(audit_wheel(torch_files[0], host.get("arch") or "x86_64"))
    except WheelAuditError as exc:
        return [_row("wheelhouse", str(exc), "readable wheels", fix)], [], None
    gpus = host.get("gpus") or []
    verdict = audit_build(
        [],
        driver_version=host.get("driver_version") if build.get("cuda") else None,
        driver_cuda=host.get("cuda_version") if build.get("cuda") else None,
        compute_capability=gpus if build.get("cuda") else None,
        reports=reports,
    )
    for row in verdict["problems"]:
        row["check"] = f"wheel {row['check']}"
    return verdict["problems"], verdict["warnings"], verdict["facts"]


def _row(check, has, needs, variable):
    return {"check": check, "host_has": has, "build_needs": needs, "variable": variable}


def render_table(host_name, flavour, build_name, problems):
    """The refusal as a fixed-width table: check | host has | build needs | change."""
    header = ("check", "host has", "build needs", "change")
    rows = [(p["check"], p["host_has"], p["build_needs"], p["variable"]) for p in problems]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(4)]

    def line(r):
        return " | ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: B905 - Python 3.8 hosts

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


def runtime_on_host(root, marker):
    """Where ``root``/current points (its real path; None when it is no link) and the releases installed under
    ``root``/releases (folders holding ``marker``, written when a release passed its smoke test), newest marker
    first: what the switch keeps and removes."""
    current_link = os.path.join(root, "current")
    current = os.path.realpath(current_link) if os.path.islink(current_link) else None
    releases = []
    folder = os.path.join(root, "releases")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        path = os.path.join(folder, name)
        try:
            mtime = os.stat(os.path.join(path, marker)).st_mtime
        except OSError:
            continue
        releases.append((mtime, path))
    return current, [release[1] for release in sorted(releases, reverse=True)]


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
