"""The benchmarks' pure parts, checked without any sandbox host.

The benchmark scripts import their shared helper as ``import _sandbox`` (as scripts,
their own folder is first on sys.path). Here they are loaded by file path under names of
their own, with the helper registered first: putting lab/measure/ on sys.path would let
lab/measure/model_weights.py shadow plugins/modules/model_weights.py for the other tests.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "lab" / "measure"


def _load(name: str, module: str):
    spec = importlib.util.spec_from_file_location(module, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[module] = mod
    spec.loader.exec_module(mod)
    return mod


sb = _load("_sandbox", "_sandbox")
main_job = _load("main_job", "bench_main_job")
connection_cost = _load("connection_cost", "bench_connection_cost")
model_weights = _load("model_weights", "bench_model_weights")
vllm_runtime = _load("vllm_runtime", "bench_vllm_runtime")
rollout_bench = _load("rollout", "bench_rollout")
cpu_by_command = _load("cpu_by_command", "bench_cpu_by_command")
maintain_bench = _load("maintain", "bench_maintain")
pools_bench = _load("pools", "bench_pools")
sys.modules["model_weights"] = model_weights  # lab/measure/model_peers.py imports it by that name
model_peers = _load("model_peers", "bench_model_peers")
gateway_bench = _load("gateway", "bench_gateway")


def details(n: int, port: int = 2381, prefix: str = "bench-cc-") -> list[dict]:
    """What ``fleet.py up --json`` prints for n hosts."""
    return [
        {
            "instance": f"{prefix}{i}",
            "address": "127.0.0.1",
            "port": port + i - 1,
            "user": "rigops",
            "identity_file": "/state/id_ed25519",
            "known_hosts": "/state/known_hosts",
            "container": f"rigops-{prefix}{i}",
            "profile": "nogpu",
        }
        for i in range(1, n + 1)
    ]


SSH_VARS = {
    "ansible_host": "127.0.0.1",
    "ansible_port": 2381,
    "ansible_user": "rigops",
    "ansible_become": True,
    "ansible_python_interpreter": "/usr/bin/python3",
    "ansible_ssh_private_key_file": "/state/id_ed25519",
    "ansible_ssh_common_args": "-o UserKnownHostsFile=/state/known_hosts -o StrictHostKeyChecking=yes",
}

RECAP = """
PLAY RECAP *********************************************************************
bench-mj-1                 : ok=120  changed=3    unreachable=0    failed=0    skipped=40   rescued=0    ignored=0
bench-mj-2                 : ok=118  changed=0    unreachable=0    failed=0    skipped=41   rescued=0    ignored=0
localhost                  : ok=4    changed=1    unreachable=0    failed=0    skipped=0    rescued=0    ignored=0
"""


# --------------------------------------------------------------------------- the shared helper


@pytest.mark.parametrize(
    ("text", "sizes"),
    [("1,2,4", [1, 2, 4]), ("4,1", [1, 4]), ("2,2", [2]), (" 1, 4 ", [1, 4]), ("3,", [3])],
)
def test_parse_sizes(text, sizes):
    assert sb.parse_sizes(text, 4) == sizes


@pytest.mark.parametrize(
    ("text", "why"), [("0,1", "between 1 and 4"), ("5", "between 1 and 4"), ("a", "numbers"), ("", "no host")]
)
def test_parse_sizes_refuses(text, why):
    with pytest.raises(ValueError, match=why):
        sb.parse_sizes(text, 4)


def test_ssh_vars_reach_a_host_like_the_sandbox_inventory():
    assert sb.ssh_vars(details(1)[0]) == SSH_VARS


def test_inventory_one_group_with_extra_vars():
    inv = sb.inventory("bench", details(2), {"x": 1})
    assert list(inv) == ["bench"]
    assert list(inv["bench"]["hosts"]) == ["bench-cc-1", "bench-cc-2"]
    assert inv["bench"]["hosts"]["bench-cc-1"] == {**SSH_VARS, "x": 1}
    assert inv["bench"]["hosts"]["bench-cc-2"]["ansible_port"] == 2382


def test_playbook_cmd(tmp_path):
    cmd = sb.playbook_cmd("site.yml", [tmp_path / "a.json", sb.SANDBOX_GROUPS], "-l", "r1")
    assert cmd[0].endswith("ansible-playbook")
    assert cmd[1:] == ["-i", str(tmp_path / "a.json"), "-i", str(sb.SANDBOX_GROUPS), "site.yml", "-l", "r1"]
    assert sb.SANDBOX_GROUPS.exists()


def test_changed_count_and_recap():
    assert sb.changed_count(RECAP) == 4
    assert sb.recap(RECAP) == "ok=120  changed=3    unreachable=0    failed=0"
    assert sb.changed_count("no recap here") == 0
    assert sb.recap("") == "no recap"


def test_run_playbook_times_a_run_from_the_project_root(tmp_path):
    playbook = tmp_path / "noop.yml"
    playbook.write_text("---\n- name: Nothing\n  hosts: localhost\n  gather_facts: false\n  tasks: []\n")
    run = sb.run_playbook(playbook, [tmp_path / "none.json"], "--syntax-check")
    assert run.rc == 0, run.output
    assert run.seconds > 0 and "playbook: " in run.stdout


def test_fleet_helpers_call_fleet_py(monkeypatch):
    calls = []
    monkeypatch.setattr(sb, "fleet", lambda *args: calls.append(args) or json.dumps(details(2)))
    assert sb.fleet_up([("a", "nogpu", 2381), ("b", "rtx5090x8", 2382)]) == details(2)
    sb.fleet_down(["a", "b"])
    sb.fleet_down([])
    assert calls == [
        ("up", "--json", "--host=a:nogpu:2381", "--host=b:rtx5090x8:2382"),
        ("down", "--host=a", "--host=b"),
    ]


# --------------------------------------------------------------------------- the benchmarks keep their inventories


def test_model_weights_inventory():
    inv = json.loads(model_weights.inventory(details(1, 2355, "bench-mw"), "controller"))
    host = inv["bench"]["hosts"]["bench-mw1"]
    assert {k: host[k] for k in SSH_VARS} == {**SSH_VARS, "ansible_port": 2355}
    (instance,) = host["vllm_instances"]
    assert instance["model"] == {
        "id": model_weights.MODEL_ID,
        "revision": "main",
        "source": "controller",
        "hub": "huggingface",
    }
    inv = json.loads(model_weights.inventory(details(1, 2355, "bench-mw"), "hub"))
    assert inv["bench"]["hosts"]["bench-mw1"]["vllm_instances"][0]["model"]["source"] == "huggingface"
    inv = json.loads(model_weights.inventory(details(1, 2355, "bench-mw"), "fleet_cache"))
    model = inv["bench"]["hosts"]["bench-mw1"]["vllm_instances"][0]["model"]
    assert model["source"] == "fleet_cache" and model["hub"] == "huggingface"
    assert model_weights.CACHE[2] not in model_weights.PORTS and len(set(model_weights.PORTS)) == 8


def test_model_weights_ratio_and_floor_against_one_host_of_the_same_path_and_connection():
    def run(hosts, path, seconds, cpu, connection="ssh"):
        return {
            "hosts": hosts,
            "path": path,
            "connection": connection,
            "seconds": seconds,
            "cpu_seconds": cpu,
            "hub_bytes": 0,
            "hub_file_gets": 0,
            "rc": 0,
        }

    runs = [
        run(1, "fleet_cache", 10.0, 12.0),
        run(8, "fleet_cache", 30.0, 50.0),
        run(8, "hub", 40.0, None),
        run(1, "fleet_cache", 5.0, 6.0, "mitogen"),
        run(8, "fleet_cache", 20.0, 30.0, "mitogen"),
    ]
    model_weights.add_ratios(runs, 2)
    # 8 hosts: 3.00x one host's 10 s; their 50 CPU-s take at least 25 s on 2 cores: a floor of 2.50x
    assert (runs[1]["vs_one_host"], runs[1]["floor"]) == (3.0, 2.5)
    assert runs[2]["vs_one_host"] is None and runs[2]["floor"] is None  # no 1-host run of that path
    assert runs[1]["over_floor"] == 1.2 and runs[0]["over_floor"] == 1.0  # 3.00 / 2.50; one host: 1x its own floor
    assert runs[2]["over_floor"] is None
    # under mitogen, against one host under mitogen (5 s), not over SSH: 4.00x, floor 30 / 2 / 5 = 3.00x
    assert (runs[4]["vs_one_host"], runs[4]["floor"], runs[4]["over_floor"]) == (4.0, 3.0, 1.33)
    text = "\n".join(model_weights.format_runs(runs, 2))
    assert "3.00x    50.0   2.50x       1.20x  " in text and "machine's 2 cores" in text and "<= 1.15x" in text
    assert "fleet_cache mitogen" in text and text.count("fleet_cache mitogen") == 2


def test_model_weights_cache_pull_figures_per_host_and_in_all():
    gib = 1 << 30
    each = [{"start": 100.0, "pulled": 101.5, "done": 102.0}, {"start": 100.2, "pulled": 103.2, "done": 104.2}]
    row = model_weights.pull_row(gib, each)
    assert row["hosts"] == 2 and row["pull_s"] == 3.0 and row["verify_s"] == 1.0 and row["wall_s"] == 4.2
    # each host: 8 * 2^30 bits over its own 2 s and 4 s; in all: twice that from 100.0 to 104.2
    assert (row["host_gbps_max"], row["host_gbps_min"], row["all_gbps"]) == (4.29, 2.15, 4.09)
    text = "\n".join(model_weights.format_pull({"megabytes": 1024, "rows": [row]}))
    assert "a 1024 MiB file" in text and "2.15-4.29" in text
    # the code the hosts run is the role's: the script imports the pull and the check model_weights uses
    assert (
        "from ansible_collections.rigops.fleet.plugins.module_utils.model_weights import cache_pull"
        in model_weights.PULL_SCRIPT
    )
    assert "verify_files(" in model_weights.PULL_SCRIPT


def test_vllm_runtime_inventory():
    inv = json.loads(vllm_runtime.inventory(details(1, 2349, "bench-vr")[0]))
    assert inv == {"bench": {"hosts": {"bench-vr1": {**SSH_VARS, "ansible_port": 2349}}}}


def test_main_job_inventory_serves_what_rig_5090_serves():
    inv = main_job.inventory(details(1, 2391, "bench-mj-"))
    host = inv["gpu-rigs"]["hosts"]["bench-mj-1"]
    assert host["gpu_topology_expected_gpus"] == 8
    assert [i["name"] for i in host["vllm_instances"]] == ["chat"]
    assert host["ansible_port"] == 2391


@pytest.mark.parametrize(
    "name",
    [
        "main_job",
        "model_weights",
        "vllm_runtime",
        "connection_cost",
        "sandbox_runtime",
        "gateway",
        "rollout",
        "maintain",
        "pools",
        "demo",
    ],
)
def test_each_benchmark_runs_as_a_script(name):
    """``./rigops measure <name>`` finds the helper (only --help: no host)."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / f"{name}.py"), "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage:")


# --------------------------------------------------------------------------- main_job: every row from bare rigs


def fake_fleet(monkeypatch, site_rcs=None):
    """Record fleet.py calls and site.yml runs; each row's runs answer rc from site_rcs."""
    log = []
    up = {}

    def fleet_down(names):
        names = list(names)
        log.append(("down", names))
        for n in names:
            up.pop(n, None)

    def fleet_up(hosts):
        hosts = list(hosts)
        log.append(("up", hosts))
        created = [h for h in hosts if h[0] not in up]
        up.update({h[0]: h for h in hosts})
        return [
            {**d, "instance": h[0], "port": h[2], "created": h in created}
            for h, d in zip(hosts, details(len(hosts), 2391, "bench-mj-"), strict=True)
        ]

    rcs = iter(site_rcs or [])

    def site(workdir, limit, containers, connection="ssh", root=sb.ROOT):
        rigs = limit.split(",")
        assert containers == [f"rigops-{r}" for r in rigs]
        log.append(("site", rigs) if connection == "ssh" else ("site", rigs, connection))
        if root != sb.ROOT:
            log[-1] += (root.name,)
            return {"seconds": 40.0, "rc": next(rcs, 0), "changed": 0, "tasks": 300 * len(rigs),
                    "cpu": {"controller": 30.0, "rigs": 9.0}, "others": 0.2, "report": {"hosts": []}}  # fmt: skip
        report = {"hosts": [{"host": r, "stage_seconds": {"driver": 1.0}} for r in rigs]}
        scale = 1.0 if connection == "ssh" else 0.5
        cpu = {"controller": 5.0 * len(rigs) * scale, "rigs": 3.0 * len(rigs) * scale}
        return {"seconds": 10.0 * len(rigs) * scale, "rc": next(rcs, 0), "changed": 0, "tasks": 50 * len(rigs),
                "cpu": cpu, "others": 0.2, "report": report}  # fmt: skip

    monkeypatch.setattr(sb, "fleet_down", fleet_down)
    monkeypatch.setattr(sb, "fleet_up", fleet_up)
    monkeypatch.setattr(main_job, "site", site)
    return log


def test_main_job_every_row_starts_from_n_fresh_bare_rigs(monkeypatch, tmp_path):
    log = fake_fleet(monkeypatch)
    results = main_job.measure([1, 2, 4], tmp_path)
    rows = [log[i : i + 4] for i in range(0, len(log), 4)]
    assert len(rows) == 3
    for size, (down, upcall, first, rerun) in zip([1, 2, 4], rows, strict=True):
        # all of the benchmark's rigs are removed, then exactly N created, with no converged stage
        assert down == ("down", main_job.NAMES)
        names = [f"bench-mj-{i}" for i in range(1, size + 1)]
        assert upcall == ("up", [(n, "rtx5090x8", 2390 + i) for i, n in enumerate(names, 1)])
        assert first == rerun == ("site", names)
    assert list(results["sizes"]) == [1, 2, 4]
    assert results["sizes"][4]["rerun"]["cpu"] == {"controller": 20.0, "rigs": 12.0}
    assert results["sizes"][4]["rerun"]["tasks"] == 200
    assert results["stages"] == {"bench-mj-1": {"driver": 1.0}}
    written = json.loads((tmp_path / "inventory.json").read_text())
    assert list(written["gpu-rigs"]["hosts"]) == ["bench-mj-1", "bench-mj-2", "bench-mj-3", "bench-mj-4"]


def test_main_job_mitogen_reruns_after_the_ssh_rerun_and_gets_its_own_ratio(monkeypatch, tmp_path):
    log = fake_fleet(monkeypatch)
    results = main_job.measure([1, 4], tmp_path, mitogen=True)
    assert [e for e in log if e[0] == "site"] == [
        ("site", ["bench-mj-1"]), ("site", ["bench-mj-1"]), ("site", ["bench-mj-1"], "mitogen"),
        ("site", [f"bench-mj-{i}" for i in range(1, 5)]), ("site", [f"bench-mj-{i}" for i in range(1, 5)]),
        ("site", [f"bench-mj-{i}" for i in range(1, 5)], "mitogen"),
    ]  # fmt: skip
    assert results["sizes"][4]["rerun_mitogen"]["cpu"] == {"controller": 10.0, "rigs": 6.0}
    assert results["rerun_ratio"]["value"] == results["rerun_mitogen_ratio"]["value"] == 4.0
    assert results["rerun_mitogen_ratio"]["cpu_seconds"] == 16.0
    text = main_job.format_results(results)
    assert "  no-op rerun under mitogen, 4 rigs: 20.0s, changed 0, CPU 10.0s + 6.0s" in text
    assert "  controller CPU per task per rig, mitogen rerun of 4 rigs: 0.050s (200 host tasks)" in text
    assert "  no-op rerun under mitogen, 4 rigs / 1 rig: 4.00x" in text
    assert "  floor on this machine: the rerun under mitogen of 4 rigs took 16.0 CPU-s" in text
    over = results["rerun_mitogen_ratio"]["over_floor"]
    assert f"  wall over the floor (at least 1x): {over:.2f}x (goal <= 1.15x: missed)" in text


def test_main_job_baseline_runs_first_on_the_same_rigs_and_sits_beside_head(monkeypatch, tmp_path):
    log = fake_fleet(monkeypatch)
    monkeypatch.setattr(main_job, "checkout", lambda commit, workdir: ("ab" * 20, workdir / "baseline-tree"))
    results = main_job.measure([1], tmp_path, baseline="HEAD~3")
    # one fresh rig: the baseline's first run and rerun from its own tree, then HEAD's run and rerun
    assert log[2:] == [("site", ["bench-mj-1"], "baseline-tree")] * 2 + [("site", ["bench-mj-1"])] * 2
    assert results["baseline"] == "ab" * 20
    assert results["sizes"][1]["baseline"]["rerun"]["tasks"] == 300
    text = main_job.format_results(results)
    assert "  baseline abababababab first, on the same rigs (HEAD's first run is over what it left):" in text
    assert "  HEAD's run over the baseline's per stage on bench-mj-1: driver 1.0s" in text
    assert (
        "  no-op rerun over SSH, 1 rig: baseline 40.0s (300 host tasks per rig), HEAD 10.0s (50 host tasks per rig)"
        " = 0.25x (goal <= 0.5x: met)"
    ) in text


def test_main_job_runs_a_baseline_tree_with_its_own_config(monkeypatch, tmp_path):
    """./rigops exports ANSIBLE_CONFIG for the checkout: a baseline's run must use its own tree's, or its
    playbooks would find HEAD's collection."""
    seen = {}

    def run_playbook(playbook, inventories, *extra, env=None, cwd=None):
        seen.update(env=env, cwd=cwd, inventories=list(inventories))
        return sb.Run(1.0, 0, "", "")

    monkeypatch.setattr(sb, "run_playbook", run_playbook)
    monkeypatch.setattr(sb, "hosts_cpu_seconds", lambda containers: 0.0)
    main_job.site(tmp_path, "bench-mj-1", ["rigops-bench-mj-1"], root=tmp_path / "tree")
    assert seen["cwd"] == tmp_path / "tree"
    assert seen["env"]["ANSIBLE_CONFIG"] == str(tmp_path / "tree" / "ansible.cfg")
    assert seen["inventories"][1] == tmp_path / "tree" / "inventories" / "sandbox" / "groups.yml"


def test_main_job_baseline_must_be_a_commit_and_is_the_tree_at_it(tmp_path):
    with pytest.raises(ValueError, match="--baseline no-such-ref: not a commit of this repository"):
        main_job.checkout("no-such-ref", tmp_path)
    full, tree = main_job.checkout("HEAD", tmp_path)
    assert len(full) == 40 and (tree / "site.yml").is_file() and (tree / "inventories/sandbox/groups.yml").is_file()
    assert (tree / ".collections/ansible_collections/rigops/fleet").is_symlink()


def test_benchmarks_set_their_own_connection(monkeypatch):
    """What the caller exported (RIGOPS_MITOGEN=1 ./rigops ...) never decides a row's connection."""
    caller = {"PATH": "/bin", "ANSIBLE_STRATEGY": "mitogen_linear", "ANSIBLE_STRATEGY_PLUGINS": "/x"}
    assert sb.connection_env("ssh", caller) == {"PATH": "/bin"}
    mitogen = sb.connection_env("mitogen", caller)
    assert mitogen["ANSIBLE_STRATEGY"] == "mitogen_linear"
    assert mitogen["ANSIBLE_STRATEGY_PLUGINS"] == str(ROOT / "strategy_plugins")


def test_main_job_stops_after_a_failed_row(monkeypatch, tmp_path):
    log = fake_fleet(monkeypatch, site_rcs=[0, 0, 2, 0])
    results = main_job.measure([1, 2, 4], tmp_path)
    assert list(results["sizes"]) == [1, 2]
    assert results["sizes"][2]["first"]["rc"] == 2
    assert "rerun_ratio" not in results  # only one row ran cleanly
    assert [e for e in log if e[0] == "up"][-1][1][-1][0] == "bench-mj-2"


def row(first, rerun, changed=0, rc=0, cpu=(20.0, 6.0), tasks=250):
    return {
        "first": {"seconds": first, "rc": rc, "changed": 9},
        "rerun": {"seconds": rerun, "rc": rc, "changed": changed, "tasks": tasks,
                  "cpu": {"controller": cpu[0], "rigs": cpu[1]}},
    }  # fmt: skip


def test_main_job_rerun_ratio_and_table():
    sizes = {1: row(276.7, 77.3), 2: row(300.2, 90.0), 4: row(400.0, 100.5, cpu=(80.5, 24.0))}
    results = {"sizes": sizes, "stages": {"bench-mj-1": {"driver": 38.44, "runtime": 136.7}}}
    results["rerun_ratio"] = main_job.rerun_ratio(sizes, cores=2)
    # the floor: the 4-rig rerun's 104.5 CPU-s on 2 cores take at least 52.25 s, 0.68x the 1-rig rerun
    assert results["rerun_ratio"] == {
        "rigs": 4, "against": 1, "value": 1.3, "cores": 2, "cpu_seconds": 104.5, "floor_seconds": 52.2, "floor": 0.68,
        "over_floor": 1.3,
    }  # fmt: skip
    text = main_job.format_results(results)
    assert "  first run per stage on bench-mj-1: driver 38.4s, runtime 136.7s" in text
    assert "  rigs   first run   no-op rerun  rerun changed  rerun CPU: controller + rigs" in text
    assert "     4      400.0s        100.5s              0                 80.5s + 24.0s" in text
    assert "  no-op rerun, 4 rigs / 1 rig: 1.30x" in text
    # the floor is under 1x: four rigs in parallel take at least one rig's time, so 1.30x is over a floor of 1x
    assert "  wall over the floor (at least 1x): 1.30x (goal <= 1.15x: missed)" in text
    assert "  controller CPU per task per rig, rerun of 1 rig: 0.080s (250 host tasks)" in text
    assert "  floor on this machine: the rerun of 4 rigs took 104.5 CPU-s, at least 52.2s on its 2 cores" in text
    sizes[4] = row(400.0, 120.0)
    results["rerun_ratio"] = main_job.rerun_ratio(sizes, cores=2)
    assert "4 rigs / 1 rig: 1.55x" in main_job.format_results(results)


def test_main_job_flags_a_ratio_measured_on_a_busy_machine():
    """Other processes' CPU during a rerun of the ratio (the rigs share the controller's cores) above a tenth
    of the rerun's own: the ratio is flagged, whichever rerun it slowed; below, nothing is said."""
    sizes = {1: row(100.0, 60.0), 2: row(100.0, 45.0), 4: row(300.0, 80.0, cpu=(50.0, 95.0))}
    sizes[1]["rerun"]["others"], sizes[4]["rerun"]["others"] = 13.0, 3.0  # 1 rig: 13 of 26 CPU-s; 4: 3 of 145
    ratio = main_job.rerun_ratio(sizes, cores=2)
    assert ratio["busy"] == {1: {"others_seconds": 13.0, "share": 0.5}}
    text = main_job.format_results({"sizes": sizes, "rerun_ratio": ratio})
    assert "  no-op rerun, 4 rigs / 1 rig: 1.33x" in text
    assert text.splitlines()[-1] == (
        "  NOT IDLE: other processes took 13.0 CPU-s during the no-op rerun of 1 rig (50% of its own): "
        "this ratio does not hold; measure on an idle machine"
    )
    sizes[1]["rerun"]["others"] = 2.5  # under a tenth of 26
    ratio = main_job.rerun_ratio(sizes, cores=2)
    assert "busy" not in ratio and "NOT IDLE" not in main_job.format_results({"sizes": sizes, "rerun_ratio": ratio})


def test_run_playbook_takes_the_machines_cpu_too(monkeypatch):
    """The machine's busy CPU during a run, from /proc/stat: at least what the run itself took."""
    burn = "import time; t = time.process_time(); [0 for _ in iter(lambda: time.process_time() - t > 0.3, True)]"
    monkeypatch.setattr(sb, "playbook_cmd", lambda *args: [sys.executable, "-c", burn])
    run = sb.run_playbook("x.yml", [])
    assert run.rc == 0 and run.cpu_seconds >= 0.3
    assert run.machine_seconds >= run.cpu_seconds - 0.05


def test_main_job_ratio_of_other_sizes_has_no_goal():
    sizes = {1: row(1.0, 10.0), 2: row(1.0, 12.0, cpu=(30.0, None))}
    text = main_job.format_results({"sizes": sizes, "rerun_ratio": main_job.rerun_ratio(sizes, cores=2)})
    # the rigs' CPU could not be read: no floor, and the table says so
    assert text.splitlines()[-1] == "  no-op rerun, 2 rigs / 1 rig: 1.20x"
    assert "30.0s + ?" in text
    assert "(failed, see above)" in main_job.format_results({"sizes": {1: row(1.0, 2.0, rc=1)}})
    assert main_job.rerun_ratio({1: row(1.0, 2.0)}, cores=2) is None


@pytest.mark.parametrize("layout", ["v1", "v2", "missing"])
def test_hosts_cpu_seconds_reads_each_containers_cgroup(monkeypatch, tmp_path, layout):
    paths = {"rigops-a": "/machine/libpod-aaa", "rigops-b": "/machine/libpod-bbb"}
    for n, path in enumerate(paths.values(), 1):
        if layout == "v1":
            folder = tmp_path / "cpuacct" / path.lstrip("/")
            folder.mkdir(parents=True)
            (folder / "cpuacct.usage").write_text(f"{n * 1_500_000_000}\n")
        elif layout == "v2" or n == 1:
            folder = tmp_path / path.lstrip("/")
            folder.mkdir(parents=True)
            (folder / "cpu.stat").write_text(f"usage_usec {n * 2_000_000}\nuser_usec 1\nsystem_usec 1\n")
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "\n".join(paths[c] for c in cmd[4:]) + "\n", "")

    monkeypatch.setattr(sb, "CGROUP_ROOT", tmp_path)
    monkeypatch.setattr(sb.subprocess, "run", run)
    got = sb.hosts_cpu_seconds(["rigops-a", "rigops-b"])
    assert calls == [["podman", "inspect", "--format", "{{.State.CgroupPath}}", "rigops-a", "rigops-b"]]
    assert got == {"v1": 4.5, "v2": 6.0, "missing": None}[layout]
    assert sb.hosts_cpu_seconds([]) == 0.0


def test_task_count_sums_what_each_host_ran():
    out = (
        "PLAY RECAP ****\n"
        "rig-a : ok=182  changed=0    unreachable=0    failed=0    skipped=67   rescued=0    ignored=0\n"
        "rig-b : ok=100  changed=2    unreachable=0    failed=1    skipped=9    rescued=0    ignored=0\n"
    )
    assert sb.task_count(out) == 182 + 67 + 100 + 1 + 9
    assert sb.task_count("no recap") == 0


def test_main_job_arguments():
    assert main_job.parse_args([]).sizes == [1, 2, 4]
    assert main_job.parse_args(["--rigs", "4,1", "--down", "--json"]).sizes == [1, 4]
    assert main_job.parse_args(["--mitogen"]).mitogen and not main_job.parse_args([]).mitogen
    for bad in (["--rigs", "5"], ["--rigs", "x"], ["--fresh"]):
        with pytest.raises(SystemExit):
            main_job.parse_args(bad)


# --------------------------------------------------------------------------- connection_cost


@pytest.mark.parametrize("count", [1, 2, 3, 40, 41])
def test_the_play_has_exactly_the_tasks_asked_for(count):
    (play,) = yaml.safe_load(connection_cost.playbook(count))
    assert play["hosts"] == "bench" and play["gather_facts"] is False and play["become"] is True
    tasks = play["tasks"]
    assert len(tasks) == count
    assert len({t["name"] for t in tasks}) == count
    modules = [next(k for k in t if k != "name") for t in tasks]
    assert set(modules) <= {"ansible.builtin.file", "ansible.builtin.copy"}
    assert tasks[0]["ansible.builtin.file"] == {"path": connection_cost.TARGET, "state": "directory", "mode": "0755"}


def test_the_play_changes_nothing_once_run():
    """Every file task names a file an earlier copy made (state=file would fail on a missing one)."""
    tasks = connection_cost.tasks(40)
    assert sum("ansible.builtin.copy" in t for t in tasks) == 20
    assert sum("ansible.builtin.file" in t for t in tasks) == 20
    copied = set()
    for t in tasks[1:]:
        if "ansible.builtin.copy" in t:
            args = t["ansible.builtin.copy"]
            assert args["dest"].startswith(connection_cost.TARGET + "/") and args["mode"] == "0644"
            assert args["dest"] not in copied
            copied.add(args["dest"])
        else:
            args = t["ansible.builtin.file"]
            assert args["state"] == "file" and args["path"] in copied and args["mode"] == "0644"


def test_the_play_is_valid_ansible(tmp_path):
    (tmp_path / "bench.yml").write_text(connection_cost.playbook(40))
    inv = sb.write_json(tmp_path / "inv.json", connection_cost.inventory("ssh", details(1)))
    run = sb.run_playbook(tmp_path / "bench.yml", [inv], "--list-tasks")
    assert run.rc == 0, run.output
    assert "Task 40 | copy file-40" in run.stdout


def test_connection_inventories():
    podman = connection_cost.inventory("podman", details(2))
    assert podman["bench"]["hosts"]["bench-cc-2"] == {
        "ansible_connection": "containers.podman.podman",
        "ansible_host": "rigops-bench-cc-2",
        "ansible_become": True,
        "ansible_python_interpreter": "/usr/bin/python3",
    }
    for connection in ("ssh", "mitogen"):
        host = connection_cost.inventory(connection, details(1))["bench"]["hosts"]["bench-cc-1"]
        assert host == {**SSH_VARS, "ansible_connection": "ssh"}


def test_environment_sets_its_own_strategy():
    caller = {
        "PATH": "/bin",
        "ANSIBLE_STRATEGY": "mitogen_linear",
        "ANSIBLE_STRATEGY_PLUGINS": "/x",
        "CONTAINERS_CONF": "c",
    }
    for connection in ("podman", "ssh"):
        env = connection_cost.environment(connection, caller)
        assert "ANSIBLE_STRATEGY" not in env and "ANSIBLE_STRATEGY_PLUGINS" not in env
        assert env["ANSIBLE_CONFIG"] == str(ROOT / "ansible.cfg") and env["CONTAINERS_CONF"] == "c"
    env = connection_cost.environment("mitogen", caller)
    assert env["ANSIBLE_STRATEGY"] == "mitogen_linear"
    assert env["ANSIBLE_STRATEGY_PLUGINS"] == str(ROOT / "strategy_plugins")
    assert connection_cost.environment("ssh")["CONTAINERS_CONF"].endswith("lab/sandbox/podman/containers.conf")


def test_the_mitogen_strategy_loads_from_the_project_folder():
    """strategy_plugins/mitogen_linear.py (what RIGOPS_MITOGEN=1 and the role scenarios use) is
    mitogen's strategy, from the package requirements.txt pins."""
    assert connection_cost.mitogen_installed()
    spec = importlib.util.spec_from_file_location("shim", ROOT / "strategy_plugins" / "mitogen_linear.py")
    shim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shim)
    import ansible_mitogen.affinity  # noqa: PLC0415 (what the shim changes)
    from ansible_mitogen.strategy import StrategyMixin  # noqa: PLC0415 (what the shim must hand over)

    assert issubclass(shim.StrategyModule, StrategyMixin)
    # no CPU pinning: mitogen's FixedPolicy would put a 2-CPU controller's whole run on CPU 1
    assert type(ansible_mitogen.affinity.policy) is ansible_mitogen.affinity.Policy


def test_connection_cost_arguments(tmp_path):
    args = connection_cost.parse_args([])
    assert (args.sizes, args.tasks, args.connection_list, args.json, args.keep) == (
        [1, 4],
        40,
        ["podman", "ssh", "mitogen"],
        None,
        False,
    )
    args = connection_cost.parse_args(["--hosts", "4,1,2", "--tasks", "10", "--connections", "ssh,mitogen", "--keep"])
    assert (args.sizes, args.tasks, args.connection_list, args.keep) == ([1, 2, 4], 10, ["ssh", "mitogen"], True)
    assert connection_cost.parse_args(["--json", str(tmp_path / "cc.json")]).json == tmp_path / "cc.json"
    for bad in (["--hosts", "9"], ["--tasks", "0"], ["--connections", "telnet"], ["--connections", ","]):
        with pytest.raises(SystemExit):
            connection_cost.parse_args(bad)


def test_connection_cost_ports_are_its_own():
    """2381-2388: no Molecule scenario, the sandbox inventory or another benchmark uses them."""
    ports = set(range(connection_cost.FIRST_PORT, connection_cost.FIRST_PORT + connection_cost.MAX_HOSTS))
    used = set()
    for path in [*ROOT.glob("molecule/*/molecule.yml"), ROOT / "inventories" / "sandbox" / "hosts.yml"]:
        text = path.read_text()
        used |= {int(p) for p in re.findall(r"(?:port|ansible_port):\s*(\d+)", text)}
    used |= set(range(main_job.FIRST_PORT, main_job.FIRST_PORT + main_job.MAX_RIGS))
    used |= set(model_weights.PORTS) | {2349}
    assert used and not ports & used


def test_connection_cost_table():
    rows = [
        {"connection": "podman", "hosts": 1, "seconds": 49.5, "per_task_per_host": 1.238, "changed": 0, "rc": 0},
        {"connection": "ssh", "hosts": 4, "seconds": 28.0, "per_task_per_host": 0.175, "changed": 0, "rc": 0},
        {"connection": "ssh", "hosts": 1, "seconds": None, "per_task_per_host": None, "changed": None, "rc": 4},
        {"connection": "mitogen", "hosts": 1, "skipped": "mitogen not installed"},
    ]
    lines = connection_cost.format_table(rows).splitlines()
    assert lines[0].split() == ["connection", "hosts", "wall", "s", "s/task/host", "changed"]
    assert lines[1].split()[-4:] == ["1", "49.50", "1.238", "0"]
    assert lines[1].startswith("  containers.podman.podman")
    assert lines[2].split()[-4:] == ["4", "28.00", "0.175", "0"]
    assert lines[3].endswith("failed (rc 4), see above")
    assert lines[4].endswith("skipped: mitogen not installed")


# --------------------------------------------------------------------------- rollout: wall time against board time


def test_rollout_figures_from_a_runner_report(tmp_path, capsys):
    """The runner's report of a recorded rollout (tests/unit/fixtures/rollout/events-batches.jsonl)."""
    sys.path.insert(0, str(ROOT / "commands"))
    import rollout  # noqa: PLC0415

    state = rollout.Rollout("fixture", clock=iter(range(0, 10**6, 7)).__next__)
    for line in (ROOT / "tests/unit/fixtures/rollout/events-batches.jsonl").read_text().splitlines():
        state.handle(json.loads(line))
    state.finish(2, "failed")
    report = state.report()
    figures = rollout_bench.figures(report)
    assert figures["host_seconds_sum"] == round(sum(h["host_seconds"] for h in report["hosts"]), 1)
    assert figures["wall_seconds"] == report["wall_seconds"] and figures["ratio"] is not None
    assert figures["batches"]["1"]["boards"] == 1 and figures["batches"]["2"]["boards"] == 3
    text = rollout_bench.format_figures(figures)
    assert text.startswith(f"rollout fixture: wall {report['wall_seconds']:.1f}s against ")
    assert "jet-2" in text and "rolled_back" in text and "batch 2: 3 board(s), slowest" in text
    (tmp_path / "report.json").write_text(json.dumps(report))
    assert rollout_bench.main(["--report", str(tmp_path / "report.json")]) == 0
    assert "of board time" in capsys.readouterr().out


def test_rollout_bench_uses_ports_of_its_own():
    ports = {rollout_bench.FIRST_PORT + i for i in range(rollout_bench.MAX_BOARDS)}
    molecule = yaml.safe_load((ROOT / "molecule/jetson/molecule.yml").read_text())["platforms"]
    assert ports.isdisjoint({p["port"] for p in molecule})
    assert ports.isdisjoint(range(2381, 2399))
    assert rollout_bench.lock_line("idna").startswith("idna==")


def test_every_sandbox_host_has_its_own_ssh_port():
    """Scenarios of both lanes and the demo fleet run side by side: an SSH port shared would cross hosts."""
    seen = {}
    owners = [
        (p, [pl["port"] for pl in yaml.safe_load(p.read_text())["platforms"]])
        for p in ROOT.glob("molecule/*/molecule.yml")
    ]
    demo = ROOT / "inventories" / "sandbox" / "hosts.yml"
    owners.append((demo, [int(p) for p in re.findall(r"ansible_port:\s*(\d+)", demo.read_text())]))
    for path, ports in owners:
        for port in ports:
            assert port not in seen, f"port {port}: {seen.get(port)} and {path.relative_to(ROOT)}"
            seen[port] = str(path.relative_to(ROOT))
    assert len(seen) >= 20 and not set(seen) & set(model_weights.PORTS)


# --------------------------------------------------------------------------- cpu_by_command

ACCT = ROOT / "tests" / "fixtures" / "acct"


def test_accounting_records_read_as_lastcomm_reads_them():
    """The kernel's records (a real capture) give lastcomm's names, fork flags and CPU seconds."""
    processes = cpu_by_command.parse((ACCT / "pacct").read_bytes())
    reference = []
    for line in (ACCT / "lastcomm.txt").read_text().splitlines()[::-1]:  # lastcomm: newest first
        # name, flags (S F C D X, spaced in columns), user, tty, CPU seconds, start
        m = re.match(r"^(\S+)\s+(.*?)\s+(\S+)\s+(\S+)\s+([0-9.]+) secs", line)
        assert m, line
        reference.append((m.group(1), "F" in m.group(2), float(m.group(5))))
    assert [(p.name, p.forked, round(p.cpu_s, 2)) for p in processes] == reference
    assert len(processes) == 64 and {p.name for p in processes} >= {"ansible-playboo", "python3", "nvpmodel"}


def test_the_summary_adds_up_per_name_and_user():
    processes = cpu_by_command.parse((ACCT / "pacct").read_bytes())
    rows = cpu_by_command.summarise(processes)
    assert sum(r["processes"] for r in rows) == 64
    assert abs(sum(r["cpu_s"] for r in rows) - sum(p.cpu_s for p in processes)) < 0.05
    assert rows == sorted(rows, key=lambda r: -r["cpu_s"])
    workers = next(r for r in rows if r["name"] == "ansible-playboo*")
    forked = sum(p.forked and p.name == "ansible-playboo" for p in processes)
    assert workers["user"] == "root" and workers["processes"] == forked > 0


def test_comp_t_and_a_foreign_record_version():
    assert cpu_by_command.comp_t(0x1FFF) == 8191 and cpu_by_command.comp_t((2 << 13) | 5) == 5 * 64
    record = bytearray((ACCT / "pacct").read_bytes()[:64])
    record[1] = 2  # version 2: another kernel's layout
    with pytest.raises(ValueError, match="version 2, not 3"):
        cpu_by_command.parse(bytes(record))
    with pytest.raises(ValueError, match="whole number"):
        cpu_by_command.parse(bytes(record[:10]))


def test_maintain_windows_count_failures_and_latency_percentiles():
    lines = [{"t": 10 + i, "s": 0.1 * (i + 1), "code": 200} for i in range(10)]
    lines += [{"t": 30, "s": 2.0, "code": 503}, {"t": 31, "s": 0.0, "code": 0, "err": "RemoteDisconnected()",
                                                  "reused": True}]  # fmt: skip
    before = maintain_bench.window(lines, 0, 14.5)
    assert before["requests"] == 5 and before["failed"] == 0 and before["p50_ms"] == 300.0
    during = maintain_bench.window(lines, 14.5, 40)
    assert during["requests"] == 7 and during["failed"] == 2 and during["codes"] == {"0": 1, "200": 5, "503": 1}
    assert during["p99_ms"] == 1000.0  # only answered requests make the latency
    assert during["failures"] == [{"at_s": 15.5, "code": 503, "err": None, "reused": None},
                                  {"at_s": 16.5, "code": 0, "err": "RemoteDisconnected()", "reused": True}]  # fmt: skip
    assert maintain_bench.window([], 0, 1)["p50_ms"] is None


def test_maintain_inventory_two_rigs_one_gateway():
    hosts = [{"instance": n, "address": "127.0.0.1", "port": p, "user": "u", "identity_file": "k", "known_hosts": "h"}
             for n, p in (("bench-mt-1", 2421), ("bench-mt-2", 2422), ("bench-mt-gw", 2423))]  # fmt: skip
    inv = maintain_bench.inventory(hosts[:2], hosts[2])
    assert list(inv["gpu-rigs"]["hosts"]) == ["bench-mt-1", "bench-mt-2"]
    assert inv["gpu-rigs"]["vars"]["nvidia_driver_branch"] == "590"
    assert inv["gpu-rigs"]["vars"]["vllm_instances"][0]["model"]["served_name"] == maintain_bench.SERVED
    assert list(inv["gateways"]["hosts"]) == ["bench-mt-gw"]
    # the loop's client may ask faster than the default rate
    assert inv["gateways"]["vars"]["llm_gateway_clients"][0]["rate"] == "1000r/s"
    # the gateway, on a host of its own, reaches each rig's instance at the rig's container name (an
    # instance bound to loopback it could not reach: the main job's gateway stage failed so)
    from ansible_collections.rigops.fleet.plugins.filter import llm_gateway as gw  # noqa: PLC0415

    rig = {**inv["gpu-rigs"]["hosts"]["bench-mt-1"], **inv["gpu-rigs"]["vars"]}
    addresses = {"bench-mt-1": "rigops-bench-mt-1"}  # inventories/sandbox/group_vars/gateways/llm_gateway.yml
    (entry,) = gw.backends(["bench-mt-1"], {"bench-mt-1": rig}, "bench-mt-gw", addresses)
    assert entry["problem"] is None and [(i["problem"], i["connect"]) for i in entry["instances"]] == [
        (None, "rigops-bench-mt-1:8000")
    ]
    loopback = dict(rig, vllm_instances=[{k: v for k, v in i.items() if k != "host"} for i in rig["vllm_instances"]])
    (entry,) = gw.backends(["bench-mt-1"], {"bench-mt-1": loopback}, "bench-mt-gw", addresses)
    assert "binds 127.0.0.1" in entry["instances"][0]["problem"]


# --------------------------------------------------------------------------- pools and the gateway's replicas

METRICS = """# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="qwen3.5-9b"} 5120.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="qwen3.5-9b"} 4608.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="qwen3.5-9b"} 3.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="qwen3.5-9b"} 9.0
vllm:request_success_created{engine="0",finished_reason="stop",model_name="qwen3.5-9b"} 1.7e+09
"""


def test_pools_reads_each_replicas_counters_and_its_inventory_pools_them(monkeypatch):
    monkeypatch.setattr(sb, "podman_exec", lambda container, *argv, check=False: METRICS)
    assert pools_bench.metrics("rigops-bench-pl") == {
        n: {"queries": 5120.0, "hits": 4608.0, "requests": 12.0} for n in pools_bench.REPLICAS
    }
    (rig,) = details(1, 2431, "bench-pl")
    inv = pools_bench.inventory(dict(rig, instance="bench-pl"))
    rig_vars = {**inv["gpu-rigs"]["hosts"]["bench-pl"], **inv["gpu-rigs"]["vars"]}
    assert list(inv["gateways"]["hosts"]) == ["bench-pl"]
    from ansible_collections.rigops.fleet.plugins.filter import llm_gateway as gw  # noqa: PLC0415

    (entry,) = gw.backends(["bench-pl"], {"bench-pl": rig_vars}, "bench-pl")
    spec = {"backends": [entry], "keys_present": [i["ref"] for i in entry["instances"]], "gateway_port": 8443}
    (pool,) = gw.table(spec)["pools"]
    assert pool["refs"] == ["bench-pl/a", "bench-pl/b"] and pool["policy"] == "session"
    assert pools_bench.HOST[2] not in {2421, 2422, 2423, 2389}


def test_pools_arguments_and_table():
    args = pools_bench.parse_args(["--policies", "session,least_busy", "--sessions", "2"])
    assert args.policies == ["session", "least_busy"] and args.sessions == 2 and args.turns == 12
    with pytest.raises(SystemExit):
        pools_bench.parse_args(["--policies", "random"])
    row = {"policy": "session", "hit_rate": 0.9, "per_replica": {"a": 20, "b": 28}, "ttft_p50_ms": 40.0,
           "ttft_p90_ms": 90.0, "output_tokens_per_s": 55.5, "failed": 0, "wall_s": 12.0}  # fmt: skip
    text = pools_bench.format_figures({"sessions": 8, "turns": 8, "policies": [row]})
    assert "session" in text and "20/28" in text and "0.9" in text


def test_gateway_bench_replicas_each_with_a_key_and_a_port():
    assert gateway_bench.replicas(18001, 1) == [("echo", 18001, gateway_bench.UPSTREAM_KEY)]
    two = gateway_bench.replicas(18001, 2)
    assert [(n, p) for n, p, _k in two] == [("echo-1", 18001), ("echo-2", 18002)]
    assert len({k for _n, _p, k in two}) == 2
    served = {i["model"]["served_name"] for i in gateway_bench.rig_vars(18001, 2)["vllm_instances"]}
    assert served == {gateway_bench.MODEL}
    assert gateway_bench.gateway_vars(8443, "round_robin")["llm_gateway_default_policy"] == "round_robin"


def test_model_peers_batches_are_the_serial_list_cut_to_the_fleet():
    assert model_peers.batches("1,3,4", 8) == [1, 3, 4]
    assert model_peers.batches("1,3,4", 4) == [1, 3]
    assert model_peers.batches("1,3,4", 2) == [1, 1]
    assert model_peers.batches("1,3,4", 1) == [1]
    assert model_peers.batches("1,3", 8) == [1, 3, 4]  # the last batch takes what is left
