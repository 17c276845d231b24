# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Jetson platform logic: parsers of the board's own files and tools, and the policy decisions.

Plain functions, plain data in and out (unit-tested on real captures, tests/fixtures/jetson/):

- ``parse_nv_tegra_release(text)``: L4T release, revision, board, date of ``/etc/nv_tegra_release``,
  with the JetPack release it belongs to (``L4T_JETPACK``);
- ``parse_device_tree_model(raw)``, ``split_compatible(raw)``, ``identify_board(model, compatible)``:
  which board this is (family thor/orin/..., module SKU, the key of its power-mode table);
- ``parse_nvpmodel_query(text)``, ``reboot_required(text)``, ``nvpmodel_errors(text)``: what
  ``nvpmodel -q`` and ``nvpmodel -m`` said;
- ``resolve_power_mode(name, modes)``: a mode by name (``MAXN``, ``MODE_30W`` or ``30W``) to its id;
- ``parse_tegrastats(line)``: one ``tegrastats`` sample (RAM, SWAP, CPU, GPU load, temperatures, power);
- ``judge_platform(...)``: board, JetPack and runtime build against the boards table (a refusal table);
- ``memory_budget(instances, os_reserve)``: the instances' unified-memory shares against the OS reserve;
- ``swap_decision(...)``, ``explain_swapon_failure(...)``: whether a swap file is made, and why not.

Runs on the controller (filters) and on the hosts (modules): Python 3.8 syntax, standard library only.
"""

import re

# JetPack release of each L4T release (Jetson Linux), where a public source states it
# (tests/fixtures/jetson/SOURCES.md). An L4T release not listed gets its major's JetPack
# major only ("6"), never a guessed minor.
L4T_JETPACK = {
    "32.5.1": "4.5.1",
    "35.4.1": "5.1.2",
    "35.6.2": "5.1.5",
    "36.2.0": "6.0 DP",
    "36.3.0": "6.0",
    "36.4.0": "6.1",
    "36.4.3": "6.2",
    "36.4.4": "6.2.1",
    "38.2.0": "7.0",
    "38.4.0": "7.1",
    "39.2.0": "7.2",
    "39.2.1": "7.2.1",
}
L4T_MAJOR_JETPACK = {32: "4", 35: "5", 36: "6", 38: "7", 39: "7"}

_RELEASE = re.compile(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?")
_FIELD = re.compile(r"\b(GCID|BOARD|EABI|DATE):\s*([^,]*?)\s*(?=,\s*[A-Z_]+:|$)")


def parse_nv_tegra_release(text):
    """The first ``# R<major> (release), REVISION: <minor>.<patch>, ...`` line of /etc/nv_tegra_release.

    Returns None when no such line is there. ``l4t`` is "major.minor.patch" (36.4.0),
    ``jetpack`` the JetPack release from L4T_JETPACK or, failing that, its major only, with
    ``jetpack_exact`` telling which.
    """
    text = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text or "")
    for line in text.splitlines():
        m = _RELEASE.search(line)
        if not m:
            continue
        major, minor = int(m.group(1)), int(m.group(2))
        patch = int(m.group(3)) if m.group(3) is not None else 0
        l4t = f"{major}.{minor}.{patch}"
        fields = {k.lower(): v.strip() for k, v in _FIELD.findall(line[m.end() :])}
        variant = re.search(r"^#\s*KERNEL_VARIANT:\s*(\S+)", text, re.M)
        exact = L4T_JETPACK.get(l4t)
        return {
            "l4t": l4t,
            "l4t_release": f"R{major}.{minor}.{patch}",
            "major": major,
            "minor": minor,
            "patch": patch,
            "gcid": fields.get("gcid"),
            "board": fields.get("board"),
            "date": fields.get("date"),
            "kernel_variant": variant.group(1) if variant else None,
            "jetpack": exact or L4T_MAJOR_JETPACK.get(major),
            "jetpack_exact": exact is not None,
            "jetpack_major": int((exact or L4T_MAJOR_JETPACK.get(major) or "0").split(".")[0]) or None,
        }
    return None


def _text(raw):
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    return str(raw or "")


def parse_device_tree_model(raw):
    """/proc/device-tree/model: a NUL-terminated string ('NVIDIA Jetson AGX Thor Developer Kit\\0')."""
    return _text(raw).split("\0", maxsplit=1)[0].strip() or None


def split_compatible(raw):
    """/proc/device-tree/compatible: NUL-separated strings, most specific first."""
    return [part.strip() for part in _text(raw).split("\0") if part.strip()]


# Module part numbers (the "p3701-0005" of the device tree's compatible strings) of the boards
# the role knows. AGX Orin 64GB and 32GB modules take different nvpmodel configurations
# (anduril/jetpack-nixos issue 287): their power-mode tables differ.
SKUS = {
    "p3834-0008": ("thor", "agx-thor", "Jetson AGX Thor (T5000)"),
    "p3701-0005": ("orin", "agx-orin-64gb", "Jetson AGX Orin 64GB"),
    "p3701-0000": ("orin", "agx-orin-32gb", "Jetson AGX Orin 32GB"),
    "p3701-0004": ("orin", "agx-orin-32gb", "Jetson AGX Orin 32GB"),
    "p3701-0008": ("orin", "agx-orin-industrial", "Jetson AGX Orin Industrial"),
    "p3767-0000": ("orin", "orin-nx-16gb", "Jetson Orin NX 16GB"),
    "p3767-0001": ("orin", "orin-nx-8gb", "Jetson Orin NX 8GB"),
    "p3767-0003": ("orin", "orin-nano-8gb", "Jetson Orin Nano 8GB"),
    "p3767-0004": ("orin", "orin-nano-4gb", "Jetson Orin Nano 4GB"),
    "p3767-0005": ("orin", "orin-nano-8gb", "Jetson Orin Nano 8GB (devkit)"),
}
SOCS = {"tegra264": "thor", "tegra234": "orin", "tegra194": "xavier", "tegra186": "tx2", "tegra210": "nano"}


def identify_board(model, compatible=None):
    """{family, key, label, soc, sku, model} of the board, from the device tree.

    The SoC compatible string gives the family (tegra264: thor, tegra234: orin, ...); the module
    part number gives the board key of the power-mode tables. Without a device tree the model
    name is read ('Thor', 'Orin'); unknown boards get family None.
    """
    compatible = compatible or []
    if isinstance(compatible, (str, bytes)):
        compatible = split_compatible(compatible)
    soc = next((c.split(",", 1)[1] for c in compatible if c.startswith("nvidia,tegra")), None)
    family = SOCS.get(soc or "")
    sku = None
    for entry in compatible:
        for part in re.findall(r"p\d{4}-\d{4}", entry):
            if part in SKUS:
                sku = part
                break
        if sku:
            break
    model = model or ""
    if family is None:
        low = model.lower()
        family = "thor" if "thor" in low else "orin" if "orin" in low else "xavier" if "xavier" in low else None
    key, label = None, model or None
    if sku and SKUS[sku][0] == (family or SKUS[sku][0]):
        family, key, label = SKUS[sku]
    elif family == "thor":
        key, label = "agx-thor", "Jetson AGX Thor"
    elif family == "orin" and "agx" in model.lower():
        # an AGX Orin whose module SKU the device tree did not name: the 64GB table is the
        # developer kit's; a 32GB module must set jetson_platform_board
        key, label = "agx-orin-64gb", "Jetson AGX Orin"
    return {"family": family, "key": key, "label": label, "soc": soc, "sku": sku, "model": model or None}


# ----------------------------------------------------------------------------------- nvpmodel


def parse_nvpmodel_query(text):
    """``nvpmodel -q`` (or ``-q --verbose``): {"name", "id", "errors", "warnings"}.

    The mode name follows ``NV Power Mode:`` (also inside a ``NVPM VERB: Current mode:`` line),
    its id is the next line that holds only a number. Lines with ``NVPM ERROR`` (a query as a
    normal user cannot read some sysfs files) and ``NVPM WARN`` are kept apart.
    """
    lines = _text(text).splitlines()
    name, mode_id = None, None
    for index, line in enumerate(lines):
        m = re.search(r"NV Power Mode:\s*(.+?)\s*$", line)
        if not m:
            continue
        name = m.group(1)
        for nxt in lines[index + 1 :]:
            if nxt.strip().isdigit():
                mode_id = int(nxt.strip())
                break
            if "NV Power Mode:" in nxt:
                break
        break
    return {"name": name, "id": mode_id, "errors": nvpmodel_errors(text), "warnings": _lines(text, "NVPM WARN")}


def _lines(text, marker):
    return [ln.strip() for ln in _text(text).splitlines() if marker in ln]


def nvpmodel_errors(text):
    """The ``NVPM ERROR`` lines of nvpmodel's output."""
    return _lines(text, "NVPM ERROR")


def reboot_required(text):
    """The mode id nvpmodel says needs a reboot ('Reboot required for changing to this power mode: 2'), else None."""
    m = re.search(r"Reboot required for changing to this power mode:\s*(\d+)", _text(text))
    return int(m.group(1)) if m else None


def normalise_mode_name(name):
    """MODE_30W, 30w, 'mode 30W' -> 30W; MAXN, maxn -> MAXN."""
    text = re.sub(r"[\s_-]+", "_", str(name or "").strip().upper())
    return re.sub(r"^MODE_", "", text)


def resolve_power_mode(name, modes):
    """(id, canonical name) of a mode given by name in ``modes`` ({name: id}); ValueError with the names."""
    want = normalise_mode_name(name)
    for mode_name, mode_id in (modes or {}).items():
        if normalise_mode_name(mode_name) == want:
            return int(mode_id), mode_name
    known = ", ".join(f"{n} ({i})" for n, i in sorted((modes or {}).items(), key=lambda kv: int(kv[1])))
    raise ValueError("power mode {!r} is not one of this board's modes: {}".format(name, known or "none known"))


def mode_name_of(mode_id, modes):
    for name, value in (modes or {}).items():
        if int(value) == int(mode_id):
            return name
    return None


# ---------------------------------------------------------------------------------- tegrastats

_TS = re.compile(r"^\s*(\d\d-\d\d-\d{4} \d\d:\d\d:\d\d)\s+")
_RAM = re.compile(r"\bRAM (\d+)/(\d+)MB(?: \(lfb (\d+)x(\d+)MB\))?")
_SWAP = re.compile(r"\bSWAP (\d+)/(\d+)MB(?: \(cached (\d+)MB\))?")
_CPU = re.compile(r"\bCPU \[([^\]]*)\]")
_EMC = re.compile(r"\bEMC_FREQ (\d+)%(?:@(\d+))?")
_GR3D = re.compile(r"\bGR3D_FREQ (?:(\d+)%)?(?:@\[?([\d,]+)\]?)?")
_TEMP = re.compile(r"(?<![\w.])([A-Za-z][A-Za-z0-9_]*)@(-?\d+(?:\.\d+)?)C\b")
_POWER = re.compile(r"\b([A-Z][A-Z0-9_]+) (-?\d+)(mW)?/(-?\d+)(mW)?(?=\s|$)")
# Rails that measure the whole module's input (the first one present is the board's power).
INPUT_RAILS = ("VIN", "VDD_IN", "VIN_SYS_5V0", "POM_5V_IN")
# A sensor that is powered off reads -256C (seen on AGX Orin: CV0@-256C GPU@-256C).
SENSOR_OFF = -256.0


def parse_tegrastats(line):
    """One tegrastats line as plain data; None when it is not one (no RAM field).

    {"time", "ram_used_mb", "ram_total_mb", "swap_used_mb", "swap_total_mb", "swap_cached_mb",
     "cpu": [{"load_percent", "freq_mhz"} or {"online": False}], "cpu_load_percent" (mean of the
     online cores), "emc_load_percent", "gpu_load_percent" (None when tegrastats prints only clocks,
     as JetPack 7.0 on Thor does), "gpu_freq_mhz": [...], "temperatures_c": {sensor: C} (sensors
     that are off left out), "power_mw": {rail: {"current", "average"}}, "input_power_mw"}.
    """
    text = _text(line).strip()
    ram = _RAM.search(text)
    if not ram:
        return None
    out = {"time": None, "ram_used_mb": int(ram.group(1)), "ram_total_mb": int(ram.group(2))}
    ts = _TS.match(text)
    if ts:
        out["time"] = ts.group(1)
    swap = _SWAP.search(text)
    out["swap_used_mb"] = int(swap.group(1)) if swap else None
    out["swap_total_mb"] = int(swap.group(2)) if swap else None
    out["swap_cached_mb"] = int(swap.group(3)) if swap and swap.group(3) else None
    cpus = []
    cpu = _CPU.search(text)
    for entry in cpu.group(1).split(",") if cpu else []:
        entry = entry.strip()
        m = re.match(r"(\d+)%(?:@(\d+))?$", entry)
        if m:
            cpus.append({"load_percent": int(m.group(1)), "freq_mhz": int(m.group(2)) if m.group(2) else None})
        elif entry:
            cpus.append({"online": False})
    out["cpu"] = cpus
    online = [c["load_percent"] for c in cpus if "load_percent" in c]
    out["cpu_load_percent"] = round(sum(online) / len(online), 1) if online else None
    emc = _EMC.search(text)
    out["emc_load_percent"] = int(emc.group(1)) if emc else None
    gr3d = _GR3D.search(text)
    out["gpu_load_percent"] = int(gr3d.group(1)) if gr3d and gr3d.group(1) is not None else None
    out["gpu_freq_mhz"] = [int(f) for f in gr3d.group(2).split(",") if f] if gr3d and gr3d.group(2) else []
    temps = {}
    for name, value in _TEMP.findall(text):
        if float(value) > SENSOR_OFF:
            temps[name.lower()] = float(value)
    out["temperatures_c"] = temps
    power = {}
    for name, current, _unit_c, average, _unit_a in _POWER.findall(text):
        if name in ("RAM", "SWAP", "EMC_FREQ", "GR3D_FREQ"):
            continue
        power[name] = {"current": int(current), "average": int(average)}
    out["power_mw"] = power
    rail = next((r for r in INPUT_RAILS if r in power), None)
    out["input_power_mw"] = power[rail]["current"] if rail else None
    out["input_rail"] = rail
    return out


def health_summary(sample):
    """The figures the report shows of one tegrastats sample (None stays None)."""
    if not sample:
        return {}
    temps = sample.get("temperatures_c") or {}
    return {
        "ram_used_mb": sample.get("ram_used_mb"),
        "ram_total_mb": sample.get("ram_total_mb"),
        "swap_used_mb": sample.get("swap_used_mb"),
        "swap_total_mb": sample.get("swap_total_mb"),
        "cpu_load_percent": sample.get("cpu_load_percent"),
        "gpu_load_percent": sample.get("gpu_load_percent"),
        "gpu_temp_c": temps.get("gpu"),
        "max_temp_c": max(temps.values()) if temps else None,
        "input_power_mw": sample.get("input_power_mw"),
    }


# ------------------------------------------------------------------------ board, JetPack, build


def _row(check, has, needs, variable):
    return {"check": check, "host_has": has, "board_needs": needs, "variable": variable}


def judge_platform(board, release, flavour, build, boards, python=None, accept_cpu=True):
    """Problems of this board, its L4T/JetPack and the runtime build the inventory chose.

    ``boards``: the role's table ({family: {label, jetpack_major, cuda, sm, python, builds}}).
    ``flavour``/``build``: vllm_runtime_flavour and vllm_runtime_build (empty: the family's first
    build). The ``cpu`` flavour runs vLLM on the board's CPU without its GPU and is accepted on
    any supported board when ``accept_cpu`` (the sandbox's choice: its containers have no CUDA);
    a ``cuda`` build is never: a desktop CUDA stack does not run on L4T.
    Returns {"problems": [rows], "expects": the board's row, "build": the build judged}.
    """
    problems = []
    family = (board or {}).get("family")
    expects = boards.get(family) if family else None
    if expects is None:
        known = ", ".join("{} ({})".format(v.get("label"), k) for k, v in sorted(boards.items()))
        problems.append(
            _row(
                "board",
                (board or {}).get("model") or "no Jetson device tree model",
                "one of: " + known,
                "none: this role supports these boards only (jetson_platform_boards)",
            )
        )
        return {"problems": problems, "expects": None, "build": None}
    if release is None:
        problems.append(
            _row(
                "l4t",
                "no readable /etc/nv_tegra_release",
                "L4T of JetPack {}".format(expects["jetpack_major"]),
                "jetson_platform_release_file",
            )
        )
    elif release.get("jetpack_major") != expects["jetpack_major"]:
        problems.append(
            _row(
                "jetpack",
                "L4T {} (JetPack {})".format(release["l4t_release"], release.get("jetpack")),
                "JetPack {} ({})".format(expects["jetpack_major"], expects.get("l4t", "")),
                "reflash the board with JetPack {}".format(expects["jetpack_major"]),
            )
        )
    chosen = None
    if flavour == "jetson":
        chosen = build or (expects.get("builds") or [None])[0]
        if chosen not in (expects.get("builds") or []):
            problems.append(
                _row(
                    "build",
                    f"vllm_runtime_build {chosen}",
                    "{} (CUDA {}, sm_{})".format(
                        " or ".join(expects.get("builds") or []), expects["cuda"], expects["sm"].replace(".", "")
                    ),
                    "vllm_runtime_build",
                )
            )
        if python and expects.get("python") and ".".join(str(python).split(".")[:2]) != str(expects["python"]):
            problems.append(
                _row(
                    "python",
                    f"Python {python}",
                    "Python {} (JetPack {})".format(expects["python"], expects["jetpack_major"]),
                    "vllm_runtime_python",
                )
            )
    elif flavour == "cpu":
        chosen = "cpu"
        if not accept_cpu:
            problems.append(
                _row(
                    "build",
                    "vllm_runtime_flavour cpu",
                    "vllm_runtime_flavour jetson ({})".format(" or ".join(expects.get("builds") or [])),
                    "vllm_runtime_flavour or jetson_platform_accept_cpu",
                )
            )
    else:
        chosen = "{}/{}".format(flavour, build or "default")
        problems.append(
            _row(
                "build",
                f"vllm_runtime_flavour {flavour}",
                "vllm_runtime_flavour jetson ({}): the GPU driver and CUDA come with L4T, never a desktop stack".format(
                    " or ".join(expects.get("builds") or [])
                ),
                "vllm_runtime_flavour",
            )
        )
    return {"problems": problems, "expects": expects, "build": chosen}


def render_table(host, board, problems, boards):
    """The refusal: what was judged, one row per problem, then the table of supported boards."""
    lines = [
        f"jetson_platform refused {(board or {}).get('label') or (board or {}).get('model') or 'this machine'} on "
        f"{host} ({len(problems)} problem(s)); nothing was changed:"
    ]
    rows = [("check", "host has", "board needs", "change")] + [
        (p["check"], p["host_has"], p["board_needs"], p["variable"]) for p in problems
    ]
    widths = [max(len(str(r[i])) for r in rows) for i in range(4)]
    for index, r in enumerate(rows):
        lines.append(" | ".join(str(c).ljust(widths[i]) for i, c in enumerate(r)).rstrip())
        if index == 0:
            lines.append("-+-".join("-" * w for w in widths))
    lines.append("supported boards:")
    for _family, row in sorted(boards.items()):
        lines.append(
            "  {}: JetPack {}, CUDA {}, sm_{}, Python {}, vllm_runtime_build {} (or vllm_runtime_flavour cpu)".format(
                row.get("label"),
                row["jetpack_major"],
                row["cuda"],
                str(row["sm"]).replace(".", ""),
                row.get("python"),
                " or ".join(row.get("builds") or []),
            )
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------ unified memory


def memory_budget(instances, os_reserve):
    """The instances' share of the board's unified memory against what the OS keeps.

    ``instances``: merged instances (their engine.gpu_memory_utilization filled in). On a Jetson
    the GPU's memory is the system's: every instance's fraction comes out of one pool, so their
    sum must leave ``os_reserve`` to the OS: two models on one Thor with 0.2 reserved each get
    at most 0.4. Returns {"ok", "total", "limit", "shares": [[name, share], ...], "fair_share"}.
    """
    shares = []
    for inst in instances or []:
        util = ((inst or {}).get("engine") or {}).get("gpu_memory_utilization")
        try:
            shares.append([str(inst.get("name")), float(util)])
        except (TypeError, ValueError):
            continue
    total = round(sum(s for _name, s in shares), 4)
    limit = round(1.0 - float(os_reserve), 4)
    fair = round(limit / len(shares), 2) if shares else limit
    return {"ok": total <= limit + 1e-9, "total": total, "limit": limit, "shares": shares, "fair_share": fair}


# ------------------------------------------------------------------------------------------ swap


def parse_proc_swaps(text):
    """/proc/swaps as [{"path", "type", "size_kb", "used_kb", "zram"}]."""
    out = []
    for line in _text(text).splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 4 and parts[2].isdigit():
            out.append(
                {
                    "path": parts[0],
                    "type": parts[1],
                    "size_kb": int(parts[2]),
                    "used_kb": int(parts[3]) if parts[3].isdigit() else 0,
                    "zram": "/zram" in parts[0],
                }
            )
    return out


def swap_decision(mem_total_mb, swaps, want_gb, ram_below_gb, path, file_bytes=None, file_is_swap=False):
    """What the role does about swap: a swap file of ``want_gb`` GiB at ``path`` when RAM is short.

    Why a file on disk and not (more) zram: on a Jetson the GPU allocates from the same RAM, and
    zram keeps its compressed pages in that RAM; a model's load peak (weights read, converted,
    copied) needs memory that is not taken from the GPU. JetPack's own zram (nvzramconfig on Orin)
    is left as it is and reported.

    ``swaps``: parse_proc_swaps; ``file_bytes``: size of the file at ``path`` (None when absent);
    ``file_is_swap``: it carries a swap signature. Returns {"action", "reason", ...} with action
    one of: off (want_gb 0), not_needed (RAM at or above ram_below_gb GiB), enough (other disk swap
    of at least want_gb), ok (our file active, right size), activate (ours, right size, inactive),
    create (no file), recreate (wrong size or no signature).
    """
    want_bytes = int(want_gb) * 1024**3
    active = [s for s in swaps or [] if s["path"] == path]
    disk = [s for s in swaps or [] if not s["zram"] and s["path"] != path]
    zram_mb = sum(s["size_kb"] for s in swaps or [] if s["zram"]) // 1024
    facts = {
        "path": path,
        "want_gb": int(want_gb),
        "ram_mb": mem_total_mb,
        "zram_mb": zram_mb,
        "other_disk_swap_mb": sum(s["size_kb"] for s in disk) // 1024,
    }
    if int(want_gb) <= 0:
        return dict(facts, action="off", reason="jetson_platform_swap_gb is 0: no swap file managed")
    if mem_total_mb is not None and mem_total_mb >= int(ram_below_gb) * 1024:
        return dict(
            facts,
            action="not_needed",
            reason=f"{mem_total_mb} MiB of RAM is not short (at least jetson_platform_swap_ram_below_gb "
            f"{ram_below_gb} GiB)",
        )
    if sum(s["size_kb"] for s in disk) * 1024 >= want_bytes:
        return dict(
            facts, action="enough", reason=f"other disk swap of {facts['other_disk_swap_mb']} MiB is there already"
        )
    if file_bytes is None:
        return dict(facts, action="create", reason=f"no swap file yet; RAM is short ({mem_total_mb} MiB)")
    if file_bytes != want_bytes or not file_is_swap:
        return dict(
            facts,
            action="recreate",
            reason=f"{path} holds {file_bytes} bytes{'' if file_is_swap else ' without a swap signature'}, "
            f"want {want_bytes}",
        )
    if active:
        return dict(facts, action="ok", reason=f"{path} is active ({active[0]['size_kb'] // 1024} MiB)")
    return dict(facts, action="activate", reason=f"{path} is there but not active")


def explain_swapon_failure(stderr, fstype=None):
    """Why swapon refused the file, in words, and whether that is the filesystem's doing."""
    text = _text(stderr).strip()
    low = text.lower()
    if fstype in ("overlay", "tmpfs", "nfs", "nfs4", "9p", "fuse", "btrfs") or "invalid argument" in low:
        return {
            "filesystem": True,
            "reason": "the kernel refuses a swap file on this filesystem ({}): {}".format(fstype or "unknown", text),
        }
    if "operation not permitted" in low or "permission denied" in low:
        return {"filesystem": False, "reason": f"swapon is not permitted here (no CAP_SYS_ADMIN?): {text}"}
    return {"filesystem": False, "reason": text or "swapon failed without a message"}
