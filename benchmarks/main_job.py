#!/usr/bin/env python3
"""Wall time of the main job, `site.yml -l gpu-rigs`, first run and no-op rerun (printed, never asserted).

    python3 benchmarks/main_job.py [--rigs 1,2,4] [--fresh] [--down] [--json]

On sandbox rigs of its own (bench-mj-1..4, profile rtx5090x8, SSH ports 2391-2394), each
serving what the sandbox's rig-5090 serves (inventories/sandbox/host_vars/rig-5090):

- first run on one rig: total wall time and the time of each stage (from the run's
  report, reports/ JSON ``stage_seconds``);
- no-op rerun on that rig: wall time and the changed count (0 expected);
- then for each larger fleet size: the first run that brings the added rigs up to date,
  and the no-op rerun over the whole fleet, to show how the rerun cost grows with rigs.

``--fresh`` recreates the rigs first (a bare machine); ``--down`` removes them at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, CONTAINERS_CONF=str(ROOT / "sandbox" / "podman" / "containers.conf"))
PROFILE = "rtx5090x8"
FIRST_PORT = 2391


def fleet(*args: str) -> str:
    cmd = [sys.executable, str(ROOT / "sandbox" / "fleet.py"), *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, env=ENV).stdout


def inventory(hosts: list[dict]) -> dict:
    served = yaml.safe_load((ROOT / "inventories/sandbox/host_vars/rig-5090/vllm_instances.yml").read_text())
    rigs = {}
    for h in hosts:
        rigs[h["instance"]] = {
            "ansible_host": h["address"],
            "ansible_port": h["port"],
            "ansible_user": h["user"],
            "ansible_become": True,
            "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_ssh_private_key_file": h["identity_file"],
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={h['known_hosts']} -o StrictHostKeyChecking=yes",
            "gpu_topology_expected_gpus": 8,
            **served,
        }
    return {"gpu-rigs": {"hosts": rigs}}


def site(workdir: Path, limit: str) -> dict:
    ansible = Path(sys.executable).parent / "ansible-playbook"
    cmd = [
        str(ansible if ansible.exists() else "ansible-playbook"),
        "-i",
        str(workdir / "inventory.json"),
        "-i",
        str(ROOT / "inventories" / "sandbox" / "groups.yml"),
        "site.yml",
        "-l",
        limit,
        "-e",
        f"rigops_report_dir={workdir / 'reports'}",
    ]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False, env=ENV)
    seconds = time.monotonic() - start
    out = proc.stdout + proc.stderr
    changed = sum(int(n) for n in re.findall(r"\bchanged=(\d+)", out))
    report_file = workdir / "reports" / "latest.json"
    report = json.loads(report_file.read_text()) if report_file.exists() else {"hosts": []}
    if proc.returncode != 0:
        print(out[-4000:], file=sys.stderr)
    return {"seconds": round(seconds, 1), "rc": proc.returncode, "changed": changed, "report": report}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rigs", default="1,2,4", help="fleet sizes, ascending (default 1,2,4)")
    parser.add_argument("--fresh", action="store_true", help="recreate the rigs first")
    parser.add_argument("--down", action="store_true", help="remove the rigs at the end")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    sizes = sorted({int(n) for n in args.rigs.split(",")})
    names = [f"bench-mj-{i}" for i in range(1, sizes[-1] + 1)]
    if args.fresh:
        fleet("down", *[f"--host={n}" for n in names])

    results: dict = {"sizes": {}}
    with tempfile.TemporaryDirectory(prefix="rigops-bench-") as tmp:
        workdir = Path(tmp)
        hosts: list[dict] = []
        for size in sizes:
            wanted = [f"--host={n}:{PROFILE}:{FIRST_PORT + i}" for i, n in enumerate(names[:size])]
            hosts = json.loads(fleet("up", "--json", *wanted))
            (workdir / "inventory.json").write_text(json.dumps(inventory(hosts)))
            limit = ",".join(h["instance"] for h in hosts)
            first = site(workdir, limit)
            rerun = site(workdir, limit)
            results["sizes"][size] = {
                "first": {k: first[k] for k in ("seconds", "rc", "changed")},
                "rerun": {k: rerun[k] for k in ("seconds", "rc", "changed")},
            }
            if size == sizes[0]:
                results["stages"] = {h["host"]: h.get("stage_seconds", {}) for h in first["report"]["hosts"]}
            if first["rc"] or rerun["rc"]:
                break
    if args.down:
        fleet("down", *[f"--host={n}" for n in names])

    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print("main job (site.yml -l gpu-rigs) on sandbox rigs, profile rtx5090x8, cpu vLLM, tiny model")
    for host, stages in results.get("stages", {}).items():
        print(f"  first run per stage on {host}: " + ", ".join(f"{k} {v:.1f}s" for k, v in stages.items()))
    print(f"  {'rigs':>4}  {'first run':>10}  {'no-op rerun':>12}  {'rerun changed':>13}")
    for size, r in results["sizes"].items():
        note = "" if r["first"]["rc"] == 0 and r["rerun"]["rc"] == 0 else "  (failed, see above)"
        print(
            f"  {size:>4}  {r['first']['seconds']:>9.1f}s  {r['rerun']['seconds']:>11.1f}s  "
            f"{r['rerun']['changed']:>13}{note}"
        )
    print("  (a larger fleet's first run only brings the added rigs up to date)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
