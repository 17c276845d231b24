"""Each role's variables are judged by its meta/argument_specs.yml, and its preflight keeps only what a spec
cannot say.

- rigops.fleet.argument_shapes: what Ansible's validation accepts only by converting it (a string for a list,
  text for a mapping, a list or a number for a string, a null), refused by name.
- The roles, through ansible-playbook on this machine: for every role bad values of variables its spec judges
  (refused by Ansible's validation, the role's first task) and of rules its preflight keeps, each refused with
  the variable's name before anything on the host changes. Each case is a host of its own (an alias of this
  machine), one run per role, and only the role's preflight runs (its tag), read-only.
- The specs: every variable of defaults/main.yml has an option with a type, a description and the same
  default (a list says its elements, a mapping or list of mappings its keys); every ``tasks_from`` of the
  project enters the role by an entry point of its spec, so that Ansible validates it there too.
"""

from __future__ import annotations

import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from ansible_collections.rigops.fleet.plugins.lookup.argument_shapes import shape_problems
from ansible_run import ansible_playbook

ROOT = Path(__file__).resolve().parents[2]
VALIDATION = "Validating arguments against arg spec 'main'"
# A secret some cases give: never in the output.
SECRET_VALUE = "Never-printed-k3y-0123456789abcdef"


# --------------------------------------------------------------------------- argument_shapes

OPTIONS = {
    "names": {"type": "list", "elements": "str", "default": []},
    "hosts": {"type": "list", "elements": "dict", "options": {
        "name": {"type": "str", "required": True}, "key": {"type": "str", "no_log": True},
        "note": {"type": "str"}}},
    "env": {"type": "dict", "default": {}},
    "label": {"type": "str", "default": ""},
    "secret": {"type": "str", "default": "", "no_log": True},
    "count": {"type": "int", "default": None},
    "port": {"type": "int", "default": 80},
    "flag": {"type": "bool", "default": False},
}  # fmt: skip


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ({"names": "a,b"}, 'names must be a list such as [a, b], not the string "a,b" (Ansible\'s own check would'),
        ({"names": None}, "names must be a list such as [a, b], not null (a key without a value in YAML; write []"),
        ({"names": ["a", ["b"]]}, 'names[1] must be a string, not the list ["b"]'),
        ({"env": "A=1"}, 'env must be a mapping such as {key: value}, not the string "A=1"'),
        ({"label": 595}, 'label must be a string, not the number 595 (quote it: "595")'),
        ({"label": ["x"]}, 'label must be a string, not the list ["x"]'),
        ({"label": True}, 'label must be a string, not the boolean true (quote it: "true")'),
        ({"port": None}, "port must be a whole number, not null"),
        ({"hosts": ["a=b"]}, 'hosts[0] must be a mapping such as {key: value}, not the string "a=b"'),
        ({"hosts": [{"name": None}]}, "hosts[0].name must be a string, not null (a key without a value in YAML)"),
        ({"hosts": [{"name": "a", "note": 1}]}, "hosts[0].note must be a string, not the number 1"),
    ],
)
def test_shapes_ansible_would_convert_are_refused_by_name(given, words):
    assert [words] == [p[: len(words)] for p in shape_problems(OPTIONS, given)]


def test_what_the_spec_says_passes_and_secrets_are_never_shown():
    good = {"names": ["a"], "hosts": [{"name": "a", "note": None}], "env": {"A": "1"}, "label": "x", "count": None,
            "port": "8080", "flag": "yes", "secret": "s3cret"}  # fmt: skip
    assert shape_problems(OPTIONS, good) == []
    assert shape_problems(OPTIONS, {"other": None}) == []  # not an option: not judged
    bad = shape_problems(OPTIONS, {"secret": 123456, "hosts": [{"name": "a", "key": ["k3y-value"]}]})
    assert bad == ["hosts[0].key must be a string, not the list given (not shown: no_log)",
                   "secret must be a string, not the number given (not shown: no_log)"]  # fmt: skip


# --------------------------------------------------------------------------- the roles, through ansible-playbook

# role: {case: (variables, stage, words)}; stage "spec": refused by Ansible's validation (the role's first
# task); otherwise the name of the preflight task that refuses it. Every case must name its variable.
# one task judges the kinds, then (when every kind is right) the rules between the values
SHAPES = CONSISTENT = "Preflight | Variables are of their kinds and consistent"
HUB_ASSERT = "Preflight | Endpoints are https (or http by opt-in), the hub clients are installed, the group exists"
# a role without rules of its own (llm_clients) judges the kinds alone
KINDS_ONLY = "Preflight | Variables are of the kinds meta/argument_specs.yml gives them"
CASES = {
    "fleet_cache": {
        "port not a number": ({"fleet_cache_port": "http"}, "spec", "argument 'fleet_cache_port' is of type str"),
        "wheelhouse without its lock": (
            {"fleet_cache_wheelhouses": [{"name": "cpu", "index_url": "https://pypi.org/simple"}]},
            "spec",
            "missing required arguments: lock_url found in fleet_cache_wheelhouses",
        ),
        "extra model of another hub": (
            {"fleet_cache_extra_models": [{"hub": "gitlab", "id": "a/b"}]},
            "spec",
            "value of hub must be one of: modelscope, huggingface, got: gitlab found in fleet_cache_extra_models",
        ),
        "hub clients as a string": (
            {"fleet_cache_hub_clients": "modelscope==1.40.2"},
            SHAPES,
            'fleet_cache_hub_clients must be a list such as [a, b], not the string "modelscope==1.40.2"',
        ),
        "wheelhouses left empty": (
            {"fleet_cache_wheelhouses": None},
            "spec",
            "argument 'fleet_cache_wheelhouses' is of type NoneType and we were unable to convert to list",
        ),
        "port out of range": (
            {"fleet_cache_port": 0},
            CONSISTENT,
            "fleet_cache_port must be a TCP port from 1 to 65535; got 0",
        ),
        "certificate without key": (
            {"fleet_cache_tls_certificate": "-----BEGIN CERTIFICATE-----"},
            CONSISTENT,
            "fleet_cache_tls_certificate and fleet_cache_tls_key must be both set (HTTPS) or both empty (HTTP)",
        ),
        "wheelhouse name with a slash": (
            {"fleet_cache_wheelhouses": [{"name": "../cpu", "index_url": "https://x/simple", "lock_url": "ftp://x"}]},
            "Preflight | Each wheelhouse names its build, index and lock",
            'fleet_cache_wheelhouses[0].name must be lowercase letters, digits, ".", "_" or "-" (a build such as cpu);'
            ' got "../cpu"; fleet_cache_wheelhouses[0].lock_url must be an http(s) URL; got "ftp://x"',
        ),
    },
    "nvidia_driver": {
        "source unknown": (
            {"nvidia_driver_source": "apt"},
            "spec",
            "value of nvidia_driver_source must be one of: ubuntu, cuda, got: apt",
        ),
        "mirror without its key": (
            {"nvidia_driver_archive_repo": {"url": "http://mirror/ubuntu"}},
            "spec",
            "parameters are required together: url, suite, key_url found in nvidia_driver_archive_repo",
        ),
        "modules as a string": (
            {"nvidia_driver_modules": "nvidia"},
            SHAPES,
            'nvidia_driver_modules must be a list such as [a, b], not the string "nvidia"',
        ),
        "branch as a number": (
            {"nvidia_driver_branch": 590},
            SHAPES,
            'nvidia_driver_branch must be a string, not the number 590 (quote it: "590")',
        ),
        "branch not digits": (
            {"nvidia_driver_branch": "r595"},
            CONSISTENT,
            'nvidia_driver_branch must be a driver branch, digits only such as "595" (it names the packages);'
            ' got "r595"',
        ),
    },
    "gpu_topology": {
        "link unknown": (
            {"gpu_topology_worst_link_allowed": "NVLINK"},
            "spec",
            "value of gpu_topology_worst_link_allowed must be one of: NV, PIX, PXB, PHB, NODE, SYS, got: NVLINK",
        ),
        "finding kind unknown": (
            {"gpu_topology_fail_on": ["gpu_missing", "gpu_gone"]},
            "spec",
            "value of gpu_topology_fail_on must be one or more of:",
        ),
        "env files as a string": (
            {"gpu_topology_env_files": "/etc/environment"},
            SHAPES,
            'gpu_topology_env_files must be a list such as [a, b], not the string "/etc/environment"',
        ),
        "the name before 1.0.0": (
            {"gpu_topology_fail_on_gate": False},
            CONSISTENT,
            "gpu_topology_fail_on_gate is now gpu_topology_fail_host",
        ),
        "no GPU expected": (
            {"gpu_topology_expected_gpus": 0},
            CONSISTENT,
            "gpu_topology_expected_gpus must be a positive number of GPUs, or null to skip the count check; got 0",
        ),
    },
    "gpu_health": {
        "interval as words": (
            {"gpu_health_interval": "often"},
            "spec",
            "argument 'gpu_health_interval' is of type str and we were unable to convert to int",
        ),
        "kernel log command as a string": (
            {"gpu_health_kernel_log_command": "journalctl -k"},
            SHAPES,
            'gpu_health_kernel_log_command must be a list such as [a, b], not the string "journalctl -k"',
        ),
        "no pause between rounds": (
            {"gpu_health_interval": 0},
            CONSISTENT,
            "gpu_health_interval must be 1 to 3600 seconds (got 0)",
        ),
        "a source it cannot read": (
            {"gpu_health_source": "dcgm"},
            "spec",
            "value of gpu_health_source must be one of: nvidia_smi, tegrastats, got: dcgm",
        ),
        "a thermal limit in words": (
            {"gpu_health_thermal_limits": {"gpu": "hot"}},
            CONSISTENT,
            'gpu_health_thermal_limits degrees C per sensor (got {"gpu": "hot"})',
        ),
        "dcgmi by name": (
            {"gpu_health_dcgmi": "dcgmi"},
            CONSISTENT,
            'gpu_health_dcgmi an absolute path or "" (got "dcgmi")',
        ),
    },
    "jetson_platform": {
        "power modes as a name": (
            {"jetson_platform_power_modes": "agx-thor"},
            "spec",
            "argument 'jetson_platform_power_modes' is of type str and we were unable to convert to dict",
        ),
        "reserve as words": (
            {"jetson_platform_os_reserve": "a fifth"},
            "spec",
            "argument 'jetson_platform_os_reserve' is of type str and we were unable to convert to float",
        ),
        "forbidden packages as a string": (
            {"jetson_platform_forbidden_packages": "nvidia-driver-*"},
            SHAPES,
            'jetson_platform_forbidden_packages must be a list such as [a, b], not the string "nvidia-driver-*"',
        ),
        "everything for the OS": (
            {"jetson_platform_os_reserve": 1.0},
            CONSISTENT,
            "jetson_platform_os_reserve must be a fraction from 0 up to (not including) 1; got 1.0",
        ),
        "swap file a folder": (
            {"jetson_platform_swap_file": "/var/lib/rigops/"},
            CONSISTENT,
            'jetson_platform_swap_file must be an absolute path of a file (no trailing slash); got "/var/lib/rigops/"',
        ),
    },
    "llm_clients": {
        "inline key maybe": (
            {"llm_clients_inline_key": "maybe"},
            "spec",
            "argument 'llm_clients_inline_key' is of type str and we were unable to convert to bool",
        ),
        "model as a list": (
            {"llm_clients_active_model": ["chat"]},
            KINDS_ONLY,
            'llm_clients_active_model must be a string, not the list ["chat"]',
        ),
        "gateway not in the inventory": (
            {"llm_clients_gateway": "nowhere"},
            "Preflight | A gateway to point at",
            "llm_clients_gateway must name the gateway, a host of the inventory (by default the first host of the group"
            ' gateways); got "nowhere"',
        ),
    },
    "llm_gateway": {
        "drain action unknown": (
            {"llm_gateway_drain_action": "pause"},
            "spec",
            "value of llm_gateway_drain_action must be one of: drain, undrain, got: pause",
        ),
        "client without a key": (
            {"llm_gateway_clients": [{"name": "alice", "models": "*"}]},
            "spec",
            "missing required arguments: key found in llm_gateway_clients",
        ),
        "remote with a typo": (
            {
                "llm_gateway_remotes": [
                    {
                        "name": "hosted",
                        "base_url": "https://api.example.com/v1",
                        "key": SECRET_VALUE,
                        "models": ["m"],
                        "allow-http": True,
                    }
                ]
            },
            "spec",
            "llm_gateway_remotes.allow-http. Supported parameters include: allow_http, base_url, ca_file, key, "
            "models, name",
        ),
        "path unknown": (
            {"llm_gateway_api_paths": ["chat/completions", "images"]},
            "spec",
            "value of llm_gateway_api_paths must be one or more of:",
        ),
        "listen as a string": (
            {"llm_gateway_listen": "0.0.0.0"},
            SHAPES,
            'llm_gateway_listen must be a list such as [a, b], not the string "0.0.0.0"',
        ),
        "rate without a unit": (
            {"llm_gateway_default_rate": "10"},
            CONSISTENT,
            'llm_gateway_default_rate must be an nginx rate such as "10r/s" or "600r/m"; got "10"',
        ),
        "listening nowhere": (
            {"llm_gateway_listen": []},
            CONSISTENT,
            "llm_gateway_listen must list at least one address to listen on; got []",
        ),
    },
    "model_weights": {
        "attempts as words": (
            {"model_weights_attempts": "thrice"},
            "spec",
            "argument 'model_weights_attempts' is of type str and we were unable to convert to int",
        ),
        "token as a list": (
            {"model_weights_huggingface_token": [SECRET_VALUE]},
            SHAPES,
            "model_weights_huggingface_token must be a string, not the list given (not shown: no_log)",
        ),
        "mode as a number": (
            {"model_weights_dir_mode": "750"},
            CONSISTENT,
            'model_weights_dir_mode must be a quoted octal mode such as "0750"; got "750"',
        ),
        "hub over plain http": (
            {
                "vllm_instances": [{"name": "a", "port": 8001, "model": {"source": "huggingface", "id": "org/m"}}],
                "model_weights_huggingface_endpoint": "http://hub.example",
                "model_weights_python": sys.executable,
                "model_weights_group": "no-such-group-rigops",
            },
            HUB_ASSERT,
            'model_weights_huggingface_endpoint is "http://hub.example". Hub endpoints must be full https:// URLs',
        ),
    },
    "observability": {
        "port as a name": (
            {"observability_node_exporter_port": "ssh"},
            "spec",
            "argument 'observability_node_exporter_port' is of type str and we were unable to convert to int",
        ),
        "scrape groups as a string": (
            {"observability_scrape_groups": "gpu-rigs"},
            SHAPES,
            'observability_scrape_groups must be a list such as [a, b], not the string "gpu-rigs"',
        ),
        "listen without a host": (
            {"observability_prometheus_listen_address": "9090"},
            CONSISTENT,
            'observability_prometheus_listen_address must be host:port such as "127.0.0.1:9090"; got "9090"',
        ),
        "proxy maybe": (
            {"observability_metrics_proxy": "maybe"},
            CONSISTENT,
            'observability_metrics_proxy must be true, false or auto; got "maybe"',
        ),
    },
    "vllm_runtime": {
        "flavour unknown": (
            {"vllm_runtime_flavour": "rocm"},
            "spec",
            "value of vllm_runtime_flavour must be one of: cuda, jetson, cpu, got: rocm",
        ),
        "extra requirement as a string": (
            {"vllm_runtime_extra_requirements": "flash-attn==2.8.3"},
            SHAPES,
            'vllm_runtime_extra_requirements must be a list such as [a, b], not the string "flash-attn==2.8.3"',
        ),
        "keep fewer than none": (
            {"vllm_runtime_keep_releases": -1},
            CONSISTENT,
            "vllm_runtime_keep_releases must be 0 or more releases; got -1",
        ),
    },
    "vllm_service": {
        "flavour unknown": (
            {"vllm_service_flavour": "rocm"},
            "spec",
            "value of vllm_service_flavour must be one of: cpu, cuda, jetson, got: rocm",
        ),
        "rotate keys as a string": (
            {"vllm_service_rotate_keys": "alpha"},
            SHAPES,
            'vllm_service_rotate_keys must be a list such as [a, b], not the string "alpha"',
        ),
        "devices on cpu": (
            {"vllm_service_flavour": "cpu", "vllm_service_device_allow": ["/dev/infiniband/uverbs0 rw"]},
            CONSISTENT,
            "vllm_service_device_allow must be empty on the cpu flavour, whose units have no device at all",
        ),
        "slack beyond a second": (
            {"vllm_service_timer_slack_nsec": 2000000000},
            CONSISTENT,
            "vllm_service_timer_slack_nsec must be nanoseconds from 0 (the kernel's default) to 1000000000; got"
            " 2000000000",
        ),
    },
    "bench": {
        "memory from nowhere": (
            {"bench_memory_source": "dcgm"},
            "spec",
            "value of bench_memory_source must be one of: auto, nvidia-smi, tegrastats, proc, none, got: dcgm",
        ),
        "a step of words": (
            {"bench_concurrency": [1, "many"]},
            "spec",
            "Elements value for option 'bench_concurrency' is of type str and we were unable to convert to int",
        ),
        "model names as text": (
            {"bench_model_names": "alpha=chat"},
            SHAPES,
            'bench_model_names must be a mapping such as {key: value}, not the string "alpha=chat"',
        ),
        "no step": (
            {"bench_concurrency": []},
            CONSISTENT,
            "bench_concurrency must list 1 or more steps, each 1 or more; got []",
        ),
        "sampling too often": (
            {"bench_sample_interval": 0.01},
            CONSISTENT,
            "bench_sample_interval must be 0.1 or more seconds; got 0.01",
        ),
    },
}
# Roles whose defaults read the host's facts (validation templates them).
FACTS = {"nvidia_driver", "observability"}


def host_name(role, case):
    return f"{role}--{re.sub(r'[^a-z0-9]+', '-', case)}"


def failures(output):
    """{host: (task, text)} of every host that failed: the task's name and the result's lines."""
    found, task, current = {}, None, None
    for line in output.splitlines():
        if line.startswith("TASK ["):
            task, current = re.sub(r"^TASK \[(?:[\w.]+ : )?(.*)\] \**$", r"\1", line), None
            continue
        match = re.match(r"(?:fatal|failed): \[([^\]]+)\]", line)
        if match:
            current = match.group(1)
            found[current] = (task, found[current][1] + "\n" + line if current in found else line)
        elif current and line[:1] in (" ", "\t"):
            found[current] = (found[current][0], found[current][1] + "\n" + line)
        else:
            current = None
    return found


def run_cases(tmp, role, cases):
    """One ansible-playbook of the role's preflight (its tag) on an alias of this machine per case (a play whose
    hosts all fail ends the run, so each role has its own): (rc, output, failures, changed count per host)."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = {host_name(role, case): {**local, **given} for case, (given, _, _) in cases.items()}
    (tmp / f"{role}.inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    play = {"name": role, "hosts": "all", "gather_facts": role in FACTS, "roles": [{"role": f"rigops.fleet.{role}"}]}
    (tmp / f"{role}.yml").write_text(yaml.safe_dump([play]))
    proc = ansible_playbook("-i", tmp / f"{role}.inventory.yml", tmp / f"{role}.yml", "--tags", f"{role}_preflight")
    out = proc.stdout + proc.stderr
    recap = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\S+)\s*:\s*ok=\d+\s+changed=(\d+)", out, re.M)}
    return proc.returncode, out, failures(proc.stdout), recap


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("role-arguments")
    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = {role: pool.submit(run_cases, tmp, role, cases) for role, cases in CASES.items()}
        return {role: run.result() for role, run in runs.items()}


@pytest.mark.parametrize(
    ("role", "case"), [(role, case) for role, cases in CASES.items() for case in cases], ids=lambda v: v
)
def test_a_bad_value_is_refused_by_name_before_any_change(refused, role, case):
    rc, out, failed, recap = refused[role]
    _, stage, words = CASES[role][case]
    host = host_name(role, case)
    assert rc != 0 and host in failed, out[-4000:]
    task, text = failed[host]
    assert task.startswith(VALIDATION) if stage == "spec" else task == stage, (task, text[-3000:])
    flat = " ".join(text.replace("\\n", " ").replace('\\"', '"').replace("''", "'").split())
    assert words in flat, text[-3000:]
    assert recap[host] == 0
    assert "Traceback" not in text and SECRET_VALUE not in out


# --------------------------------------------------------------------------- the specs

ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "meta" / "argument_specs.yml").exists())
# Options with no default in defaults/main.yml: a host's own value or nothing.
NO_DEFAULT = {"observability_address"}
# Option names that carry secrets (a URL or a file of a key is not one).
SECRET = re.compile(r"(^|_)(token|password|secret|api_key|tls_key)$|^key$")


def specs(role):
    return yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]


def defaults(role):
    return yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text()) or {}


def walk(options, prefix=""):
    """(path, option) of every option and sub-option."""
    for name, opt in options.items():
        yield prefix + name, opt
        yield from walk(opt.get("options") or {}, f"{prefix}{name}.")


@pytest.mark.parametrize("role", ROLES)
def test_the_spec_mirrors_the_defaults(role):
    options, given = specs(role)["main"]["options"], defaults(role)
    assert set(options) - set(given) <= NO_DEFAULT, set(options) - set(given)
    assert set(given) <= set(options), f"undocumented: {set(given) - set(options)}"
    for name, value in given.items():
        assert "default" in options[name], f"{role}: {name} has no default in its spec ({value!r})"
        spec_default = options[name]["default"]
        if isinstance(value, str):  # a template folded over lines reads the same
            value, spec_default = " ".join(value.split()), " ".join(str(spec_default).split())
        assert spec_default == value, f"{role}: {name}: spec {spec_default!r}, defaults/main.yml {value!r}"


@pytest.mark.parametrize("role", ROLES)
def test_every_option_says_what_it_is(role):
    for entry, spec in specs(role).items():
        assert spec.get("short_description") and spec.get("description"), f"{role}: entry point {entry}"
        for path, opt in walk(spec.get("options") or {}):
            where = f"{role} {entry}: {path}"
            assert opt.get("type"), f"{where} has no type"
            text = opt.get("description")
            text = " ".join(text) if isinstance(text, list) else text
            assert text and len(text) >= 20, f"{where}: a description says what it does and what values mean"
            if opt["type"] == "list":
                assert opt.get("elements"), f"{where}: a list says its elements"
            if opt.get("options"):
                assert opt["type"] == "dict" or opt.get("elements") == "dict", where
            leaf = path.rsplit(".", 1)[-1]
            if SECRET.search(leaf):
                assert opt.get("no_log") is True, f"{where} carries a secret: no_log: true"
            if opt.get("choices") and opt.get("default") is not None and "{{" not in str(opt["default"]):
                chosen = opt["default"] if isinstance(opt["default"], list) else [opt["default"]]
                assert set(chosen) <= set(opt["choices"]), where


@pytest.mark.parametrize("role", ROLES)
def test_literal_defaults_have_their_kinds(role):
    """What defaults/main.yml gives (templates aside) passes the shape check: a role never refuses itself."""
    options = specs(role)["main"]["options"]
    literal = {k: v for k, v in defaults(role).items() if not (isinstance(v, str) and "{{" in v)}
    assert shape_problems(options, literal) == []


def inventory_values():
    """Every variable set by the project's inventories and Molecule scenarios (files and host_vars)."""
    found = []
    for path in sorted((ROOT / "inventories").rglob("*.yml")):
        data = yaml.safe_load(path.read_text())
        if isinstance(data, dict) and "all" not in data:
            found.append((str(path.relative_to(ROOT)), data))
    for path in sorted((ROOT / "molecule").glob("*/molecule.yml")):
        inventory = (yaml.safe_load(path.read_text()).get("provisioner") or {}).get("inventory") or {}
        for kind in ("host_vars", "group_vars"):
            for name, data in (inventory.get(kind) or {}).items():
                found.append((f"{path.relative_to(ROOT)} {kind} {name}", data or {}))
    return found


def test_the_projects_inventories_pass_the_shape_check():
    options = {}
    for role in ROLES:
        options.update(specs(role)["main"]["options"])
    for where, data in inventory_values():
        literal = {k: v for k, v in data.items() if not (isinstance(v, str) and "{{" in v)}
        assert shape_problems(options, literal) == [], where


TASKS_FROM = re.compile(r"tasks_from[\"']?\s*[:=]\s*[\"']?([\w.-]+)")


def entries_used():
    """(file, role, tasks_from) of every include_role/import_role with tasks_from in the project."""
    used = []
    for folder in ("playbooks", "lab", "tests", "molecule", "roles", "site.yml"):
        base = ROOT / folder
        for path in [base] if base.is_file() else sorted(base.rglob("*")):
            if path.suffix not in (".yml", ".yaml", ".py") or path.name == Path(__file__).name:
                continue
            text = path.read_text()
            for match in TASKS_FROM.finditer(text):
                before = text[: match.start()]
                names = re.findall(r"[\"']?name[\"']?\s*[:=]\s*[\"']?([\w.]+)", before)
                if names:
                    used.append((str(path.relative_to(ROOT)), names[-1].rsplit(".", 1)[-1], match.group(1)))
    return used


def test_every_tasks_from_enters_by_an_entry_point_of_the_spec():
    """`tasks_from: x` is validated only against an entry point named x (not x.yml): each one used has one, its
    options are the main entry point's own definitions, and they cover the role variables its tasks read."""
    used = entries_used()
    assert used, "no tasks_from found: the pattern is wrong"
    for where, role, entry in used:
        assert role in ROLES, (where, role)
        spec = specs(role)
        assert entry in spec, f"{where}: tasks_from {entry} of {role}: no such entry point (name it without .yml)"
        for name, opt in (spec[entry].get("options") or {}).items():
            assert spec["main"]["options"].get(name) == opt, f"{role} {entry}: {name} differs from main's"
        tasks = (ROOT / "roles" / role / "tasks" / f"{entry}.yml").read_text()
        read = set(re.findall(rf"\b({role}_[a-z][a-z0-9_]*)", tasks)) & set(spec["main"]["options"])
        if "import_tasks: preflight.yml" in tasks or entry == "preflight":
            read = set(spec["main"]["options"])
        assert read <= set(spec[entry].get("options") or {}), f"{role} {entry} reads {read - set(spec[entry])}"


def test_the_runtimes_flavours_are_the_matrixs():
    matrix = yaml.safe_load((ROOT / "roles" / "vllm_runtime" / "vars" / "main" / "matrix.yml").read_text())
    assert specs("vllm_runtime")["main"]["options"]["vllm_runtime_flavour"]["choices"] == list(
        matrix["vllm_runtime__matrix"]
    )


def test_every_role_has_a_case_of_its_spec_and_of_its_preflight():
    for role in ROLES:
        stages = {stage == "spec" for _, stage, _ in CASES.get(role, {}).values()}
        assert stages == {True, False}, f"{role}: a bad value the spec refuses and one its preflight refuses"
