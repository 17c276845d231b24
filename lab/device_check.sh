#!/usr/bin/env bash
# What the project reads from a real NVIDIA driver, checked on a machine with a GPU: a rig, or a
# session's lent device machine (run it whenever one is lent).
#
#   lab/device_check.sh [FOLDER]        FOLDER: default $OUT, else ./device-check
#
# 1. captures nvidia-smi -q -x, --query-gpu=index,uuid,name,memory.total,driver_version,compute_cap,
#    persistence_mode (csv,noheader,nounits), topo -m and topo -p2p r into FOLDER, as fixtures with a
#    header naming the machine and the date (in the XML a comment after its declaration);
# 2. parses them with the project's parsers (plugins/module_utils/nvidia_smi.py, nvidia_topology.py: python3 and
#    its standard library only) and checks that they agree;
# 3. runs the modules nvidia_gpu_facts and gpu_topology against the driver through Ansible (localhost, the
#    project's ansible.cfg). They need ansible-core (AnsibleModule, AnsiballZ): without `ansible` the step
#    is skipped; carry ansible-core's wheels to a bare machine to run it there;
# 4. renders the vllm_service unit and devices drop-in of a cuda instance on GPU 0 (lab/render_units.yml,
#    the minor number from the capture) and checks them with systemd-analyze verify (no message) and
#    security --offline=yes (exposure at most 2.0). Needs ansible-playbook with the project's requirements
#    (tomli-w) and systemd-analyze: skipped without them;
# 5. prints ONE summary line (also FOLDER/summary.txt); the details go to FOLDER/checks.log.
# Exits 1 when a step fails; a skipped step is no failure, the summary says why it was skipped.
#
# NVIDIA_SMI: the nvidia-smi to run (default: the one on PATH). PYTHON: the python3 to use (default python3).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-${OUT:-$PWD/device-check}}
smi=${NVIDIA_SMI:-nvidia-smi}
py=${PYTHON:-python3}
# nvidia-smi's output is parsed in the C locale; Ansible wants a UTF-8 one.
export LC_ALL=C.UTF-8 LANG=C.UTF-8 ANSIBLE_CONFIG="$root/ansible.cfg" ANSIBLE_FORCE_COLOR=0
nvsmi() { LC_ALL=C LANG=C "$smi" "$@"; }
mkdir -p "$out"
log="$out/checks.log"
: >"$log"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stamp="$(uname -n) ($(uname -m), kernel $(uname -r)) at $(date -u +%Y-%m-%dT%H:%M:%SZ) by lab/device_check.sh"
failed=0
fail() { printf 'FAILED: %s\n' "$*" >>"$log"; failed=1; }

# 1. The captures.
capture() { # FILE ARGS...: a '#' header, then what nvidia-smi prints
    local file=$1
    shift
    { printf '# nvidia-smi %s\n# on %s\n' "$*" "$stamp" && nvsmi "$@"; } >"$out/$file" 2>>"$log" || fail "nvidia-smi $*"
}
if nvsmi -q -x >"$work/q.xml" 2>>"$log"; then
    { head -n 1 "$work/q.xml" && printf '<!-- nvidia-smi -q -x on %s -->\n' "$stamp" && tail -n +2 "$work/q.xml"; } \
        >"$out/nvidia-smi-q-x.xml"
else
    fail "nvidia-smi -q -x"
fi
capture query-gpu.csv --query-gpu=index,uuid,name,memory.total,driver_version,compute_cap,persistence_mode \
    --format=csv,noheader,nounits
capture topo-m.txt topo -m
capture topo-p2p-r.txt topo -p2p r

captured=$((1 - failed)) # without the captures the driver cannot be read: steps 3 and 4 are skipped

# 2. The project's parsers on the captures (standard library only): one line of figures, or the problems.
parsed=$(PYTHONPATH="$root/.collections" "$py" - "$out" 2>>"$log" <<'PY' || true
import json, sys
from ansible_collections.rigops.fleet.plugins.module_utils.nvidia_smi import (
    QUERY_GPU_FIELDS, build_gpu_facts, parse_query_gpu_csv, parse_smi_xml)
from ansible_collections.rigops.fleet.plugins.module_utils.nvidia_topology import (
    link_rank, parse_p2p_matrix, parse_topo_matrix)

def read(name):
    with open(f"{sys.argv[1]}/{name}") as fh:
        return fh.read()

xml = parse_smi_xml(read("nvidia-smi-q-x.xml"))
rows = parse_query_gpu_csv(read("query-gpu.csv"), fields=QUERY_GPU_FIELDS[:7])
facts = build_gpu_facts(xml, rows)
topo, p2p = parse_topo_matrix(read("topo-m.txt")), parse_p2p_matrix(read("topo-p2p-r.txt"))
n, problems = facts["gpu_count"], []
if not n or len(xml["gpus"]) != len(rows) or topo["gpu_count"] != n:
    problems.append(f"GPUs: -q -x {len(xml['gpus'])}, --query-gpu {len(rows)}, topo -m {topo['gpu_count']}")
problems += [f"GPU {g['index']}: no minor number" for g in facts["gpus"] if g["minor_number"] is None]
links, codes = list(topo["links"].values()), list(p2p["status"].values())
# one GPU has no pair: no link, and a p2p "matrix" of one X cell
problems += ["topo -m: a link not readable"] * (None in links) + ["topo -p2p r: no matrix"] * (n > 1 and not codes)
worst = max(links, key=link_rank) if links and None not in links else "n/a"
p2p_text = ",".join(f"{c}x{codes.count(c)}" for c in sorted(set(map(str, codes)))) or "n/a"
names = sorted({g["name"] for g in facts["gpus"]})
print(json.dumps(facts, indent=1), file=sys.stderr)
print(f"GPUs={n} ({'; '.join(map(str, names))}, cc {','.join(sorted({str(g['compute_capability']) for g in facts['gpus']}))},"
      f" minors {','.join(str(g['minor_number']) for g in facts['gpus'])}) driver={facts['driver_version']}"
      f" CUDA={facts['cuda_version']} worst_link={worst} p2p={p2p_text}"
      + (" parse=FAILED(" + "; ".join(problems) + ")" if problems else " parse=ok"))
PY
)
[[ -n $parsed && $parsed != *parse=FAILED* ]] || fail "parsers: ${parsed:-no result}"

# 3. The modules against the driver, through Ansible.
modules="skipped(no ansible)"
[[ $captured == 1 ]] || modules="skipped(nvidia-smi failed)"
if [[ $captured == 1 ]] && command -v ansible >/dev/null; then
    modules=ok
    # gpu_topology reports its check's findings; it fails here only when it cannot read the topology.
    for call in "rigops.fleet.nvidia_gpu_facts" "rigops.fleet.gpu_topology -a {\"fail_on\":[\"topology_unreadable\"]}"; do
        read -r -a words <<<"$call"
        (cd "$root" && ansible localhost -i localhost, -c local -e "ansible_python_interpreter=$py" \
            -m "${words[@]}") >>"$log" 2>&1 || { modules=FAILED && fail "module ${words[0]}"; }
    done
fi

# 4. A GPU unit for GPU 0, rendered as the role writes it, checked by systemd.
unit="skipped(no ansible-playbook or systemd-analyze)"
[[ $captured == 1 ]] || unit="skipped(nvidia-smi failed)"
if [[ $captured == 1 ]] && command -v ansible-playbook >/dev/null && command -v systemd-analyze >/dev/null; then
    instance='{"vllm_service_flavour": "cuda", "vllm_instances": [{"name": "gpu0", "port": 8000, "gpus": [0],
               "model": {"source": "local", "path": "/srv/rigops/models/device-check"}}]}'
    units="$work/etc/systemd/system"
    if (cd "$root" && ansible-playbook -i localhost, -c local lab/render_units.yml -e "$instance" \
        -e "rigops_render_root=$work" -e "rigops_render_smi_xml=$out/nvidia-smi-q-x.xml" \
        -e "ansible_python_interpreter=$py") >>"$log" 2>&1; then
        cp "$units/vllm@.service" "$out/vllm@gpu0.service"
        cp "$units/vllm@gpu0.service.d/devices.conf" "$out/vllm@gpu0.devices.conf"
        verify=$(SYSTEMD_UNIT_PATH="$units:" systemd-analyze verify vllm@gpu0.service 2>&1) || verify="rc=$? $verify"
        verify=${verify//$'\n'/; }
        exposure=$(SYSTEMD_UNIT_PATH="$units:" systemd-analyze security --offline=yes --no-pager vllm@gpu0.service \
            2>>"$log" | sed -n 's/.*Overall exposure level for vllm@gpu0.service: \([0-9.]*\).*/\1/p')
        printf 'systemd-analyze verify: %s\nexposure: %s\n' "${verify:-no message}" "${exposure:-none}" >>"$log"
        unit="ok(verify silent, exposure ${exposure:-none})"
        if [[ -n $verify ]] || ! awk -v e="${exposure:-99}" 'BEGIN { exit !(e <= 2.0) }'; then
            unit="FAILED(verify: ${verify:-silent}, exposure ${exposure:-none})" && fail "unit: $unit"
        fi
    else
        unit=FAILED && fail "rendering the unit (lab/render_units.yml)"
    fi
fi

line="device_check: $(uname -n) ${parsed:-parse=FAILED} modules=$modules unit=$unit$([[ $failed == 0 ]] || echo ' FAILED')"
echo "$line" | tee "$out/summary.txt"
exit "$failed"
