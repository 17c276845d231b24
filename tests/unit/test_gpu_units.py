"""The vllm_service units of the GPU flavours: each instance opens only its own GPUs.

The role's own preflight, variables and templates render, through ansible-playbook on the
controller (lab/render_units.yml), the unit, the drop-ins and config.toml of three hosts into
a scratch folder: a cuda rig whose instance `chat` owns GPUs 4-7 (minor numbers read by the real
nvidia_gpu_facts module from an nvidia-smi -q -x built on a real A100 capture, the minors in
another order than the indices), a Jetson board and a cpu box. systemd-analyze then verifies the
units and scores them (--offline), and the launcher's environment for `chat` is asserted whole.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.rigops.fleet.plugins.module_utils import vllm_devices
from ansible_collections.rigops.fleet.plugins.module_utils.nvidia_smi import build_gpu_facts, parse_smi_xml
from ansible_collections.rigops.fleet.plugins.module_utils.vllm_config import build_env, load, validate
from ansible_run import LOCALHOST, ansible_playbook

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "fixtures" / "nvidia-smi" / "real"
A100 = REAL / "x01_telegraf_a100_sxm4_80gb_mig_v12.xml"
FIX = Path(__file__).resolve().parent / "fixtures" / "vllm_service"
LAUNCHER = ROOT / "roles" / "vllm_service" / "files" / "rigops-vllm-launch"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd = pytest.mark.needs("systemd-analyze")

# 8 GPUs on the bus in this order (nvidia-smi's indices 0-7); the driver numbered their nodes otherwise.
BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
MINORS = (2, 3, 0, 1, 6, 7, 4, 5)
CHAT = {
    "name": "chat",
    "port": 8000,
    "gpus": [4, 5, 6, 7],
    "engine": {"tensor_parallel_size": 4},
    "model": {"source": "local", "path": "/srv/rigops/models/chat"},
}
VLM = {"name": "vlm", "port": 8001, "gpus": [0], "model": {"source": "local", "path": "/srv/rigops/models/vlm"}}
TINY = {"name": "tiny", "port": 8002, "model": {"source": "local", "path": "/srv/rigops/models/tiny"}}
HOSTS = {"cuda": ("cuda-rig", CHAT), "jetson": ("jetson-board", VLM), "cpu": ("cpu-box", TINY)}
SLACK = 100_000_000  # the board's vllm_service_timer_slack_nsec (ns); the others keep the default, 0
# What the launcher sets for `chat` (on top of what systemd gives it), every variable and value; the key aside.
CHAT_ENV = {
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    "CUDA_VISIBLE_DEVICES": "4,5,6,7",
    "HOME": "/var/cache/vllm/chat",
    "XDG_CACHE_HOME": "/var/cache/vllm/chat",
    "VLLM_CACHE_ROOT": "/var/cache/vllm/chat",
    "HF_HOME": "/var/cache/vllm/chat/huggingface",
    "MODELSCOPE_CACHE": "/var/cache/vllm/chat/modelscope",
    "CUDA_CACHE_PATH": "/var/cache/vllm/chat/nv/ComputeCache",
    "TRITON_CACHE_DIR": "/var/cache/vllm/chat/triton",
    "TORCHINDUCTOR_CACHE_DIR": "/var/cache/vllm/chat/torchinductor",
    "TORCH_HOME": "/var/cache/vllm/chat/torch",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "NO_PROXY": "127.0.0.1,localhost,::1",
    "no_proxy": "127.0.0.1,localhost,::1",
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_LOOPBACK_IP": "127.0.0.1",
    "GLOO_SOCKET_IFNAME": "lo",
    "TMPDIR": "/tmp",
    "VLLM_RPC_BASE_PATH": "/run/vllm-chat",
}


def eight_gpu_xml():
    """nvidia-smi -q -x of 8 GPUs: the real A100 capture's <gpu> element, once per bus, with its minor."""
    text = A100.read_text()
    head, rest = text.split('    <gpu id="', 1)
    body, tail = rest.split("    </gpu>\n", 1)
    body = '    <gpu id="' + body + "    </gpu>\n"
    gpus = []
    for bus, minor in zip(BUSES, MINORS, strict=True):
        one = body.replace("00000000:01:00.0", f"00000000:{bus.upper()}:00.0")
        one = one.replace("<minor_number>1</minor_number>", f"<minor_number>{minor}</minor_number>")
        gpus.append(one.replace("1e69664bb298", f"1e69664bb2{bus}"))
    return head.replace("<attached_gpus>4</attached_gpus>", "<attached_gpus>8</attached_gpus>") + "".join(gpus) + tail


def section_lines(text, key):
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(key + "=")]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """{flavour: its render root}, all three hosts rendered by one ansible-playbook run."""
    tmp = tmp_path_factory.mktemp("units")
    (tmp / "smi.xml").write_text(eight_gpu_xml())
    hosts = {}
    for flavour, (host, instance) in HOSTS.items():
        hosts[host] = {
            "rigops_render_root": str(tmp / flavour),
            "vllm_service_flavour": flavour,
            "vllm_instances": [instance],
        }
    hosts["cuda-rig"]["rigops_render_smi_xml"] = str(tmp / "smi.xml")
    # a file the board has and one it has not: only the first is bound over
    (tmp / "nv_tegra_release").write_text("# R38 (release)\n")
    hosts["jetson-board"]["vllm_service_masked_files"] = [str(tmp / "nv_tegra_release"), str(tmp / "absent")]
    hosts["jetson-board"]["vllm_service_timer_slack_nsec"] = SLACK
    inventory = {
        "all": {
            "hosts": hosts,
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        }
    }
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory))
    proc = ansible_playbook("-i", tmp / "inventory.yml", ROOT / "lab" / "render_units.yml")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return {flavour: tmp / flavour for flavour in HOSTS}


def unit_dir(root):
    return root / "etc" / "systemd" / "system"


def dropin(root, name, conf):
    return (unit_dir(root) / f"vllm@{name}.service.d" / conf).read_text()


# ---------------------------------------------------------------- what is rendered
def test_the_cuda_instance_opens_its_own_gpus_by_minor_number_and_the_shared_nodes(rendered):
    text = dropin(rendered["cuda"], "chat", "devices.conf")
    # GPUs 4-7 are the driver's minors 6, 7, 4, 5: /dev/nvidia6 ... (not /dev/nvidia4 ... by index)
    assert section_lines(text, "DeviceAllow") == [
        "/dev/char/195:6 rwm",
        "/dev/char/195:7 rwm",
        "/dev/char/195:4 rwm",
        "/dev/char/195:5 rwm",
        "/dev/char/195:255 rwm",
        "char-nvidia-uvm rwm",
        "char-nvidia-caps r",
    ]
    assert section_lines(text, "ExecStartPre") == ["-+/usr/bin/nvidia-modprobe -c=255 -c=6 -c=7 -c=4 -c=5"]
    assert "#   GPU 4 0000:9a:00.0 NVIDIA A100-SXM4-80GB: /dev/nvidia6 (minor 6)\n" in text
    assert "ASSUMED" not in text
    assert text.startswith("#\n# Ansible managed\n#\n")


def test_the_gpu_unit_is_closed_orders_after_persistence_and_makes_the_uvm_node(rendered):
    for flavour in ("cuda", "jetson"):
        text = (unit_dir(rendered[flavour]) / "vllm@.service").read_text()
        assert section_lines(text, "DevicePolicy") == ["closed"], flavour
        assert section_lines(text, "DeviceAllow") == [], flavour  # only the instance's drop-in allows
        assert "PrivateDevices" not in "".join(line for line in text.splitlines() if not line.startswith("#"))
        assert "nvidia-persistenced.service" in section_lines(text, "After")
        assert "nvidia-persistenced.service" in section_lines(text, "Wants")
        assert section_lines(text, "ExecStartPre") == ["-+/usr/bin/nvidia-modprobe -u -c=0"]
        assert section_lines(text, "NoNewPrivileges") == ["yes"]
        assert section_lines(text, "CapabilityBoundingSet") == [""]


def test_the_cpu_unit_has_no_device_and_no_devices_dropin(rendered):
    root = rendered["cpu"]
    text = (unit_dir(root) / "vllm@.service").read_text()
    assert section_lines(text, "PrivateDevices") == ["yes"]
    for key in ("DevicePolicy", "DeviceAllow", "ExecStartPre"):
        assert section_lines(text, key) == [], key
    assert "nvidia-persistenced" not in text
    assert not (unit_dir(root) / "vllm@tiny.service.d" / "devices.conf").exists()


def test_the_jetson_instance_gets_the_boards_nodes(rendered):
    text = dropin(rendered["jetson"], "vlm", "devices.conf")
    assert section_lines(text, "DeviceAllow") == [entry for entry, _ in vllm_devices.JETSON_NODES]
    assert section_lines(text, "ExecStartPre") == []
    assert "NOT yet checked on a board" in text
    assert {"/dev/nvmap rw", "/dev/nvgpu/igpu0/ctrl rw", "/dev/char/195:0 rw", "char-nvidia-uvm rwm"} <= set(
        section_lines(text, "DeviceAllow")
    )


def test_masked_files_are_bound_over_with_dev_null_only_where_present(rendered):
    unit = (unit_dir(rendered["jetson"]) / "vllm@.service").read_text()
    release = rendered["jetson"].parent / "nv_tegra_release"
    assert section_lines(unit, "BindReadOnlyPaths") == [f"/dev/null:{release}"]
    assert section_lines((unit_dir(rendered["cpu"]) / "vllm@.service").read_text(), "BindReadOnlyPaths") == []


def test_a_timer_slack_is_set_only_where_asked(rendered):
    assert section_lines((unit_dir(rendered["jetson"]) / "vllm@.service").read_text(), "TimerSlackNSec") == [str(SLACK)]
    for flavour in ("cuda", "cpu"):  # 0: the kernel's default, no line
        assert section_lines((unit_dir(rendered[flavour]) / "vllm@.service").read_text(), "TimerSlackNSec") == []


@pytest.mark.parametrize("slack", ["2000000000", "'-100ms'"])
def test_a_timer_slack_out_of_range_is_refused_by_name(tmp_path, slack):
    proc = ansible_playbook(
        *LOCALHOST, "-e", f"rigops_render_root={tmp_path}", "-e", f"vllm_service_timer_slack_nsec={slack}",
        ROOT / "lab" / "render_units.yml",
    )  # fmt: skip
    assert proc.returncode != 0
    assert "vllm_service_timer_slack_nsec" in proc.stdout, proc.stdout[-3000:]
    assert list(tmp_path.iterdir()) == []  # refused before anything was rendered


# ---------------------------------------------------------------- systemd's view
def analyze(root, *args):
    env = dict(os.environ, SYSTEMD_UNIT_PATH=f"{unit_dir(root)}:", SYSTEMD_LOG_COLOR="0", SYSTEMD_COLORS="0")
    return subprocess.run([SYSTEMD_ANALYZE, *args], capture_output=True, text=True, env=env, check=False, timeout=120)


@needs_systemd
@pytest.mark.parametrize("flavour", sorted(HOSTS))
def test_systemd_verifies_the_units_without_a_word(rendered, flavour):
    name = HOSTS[flavour][1]["name"]
    proc = analyze(rendered[flavour], "verify", f"vllm@{name}.service")
    assert proc.returncode == 0, proc.stderr
    # systemd-analyze 252 exits 0 on unknown keys and bad values too: any message is a defect
    assert proc.stdout + proc.stderr == ""


@needs_systemd
@pytest.mark.parametrize(("flavour", "most"), [("cpu", 1.4), ("cuda", 2.0), ("jetson", 2.0)])
def test_exposure_offline(rendered, flavour, most):
    name = HOSTS[flavour][1]["name"]
    proc = analyze(rendered[flavour], "security", "--offline=yes", "--no-pager", f"vllm@{name}.service")
    assert proc.returncode == 0, proc.stderr
    score = float(re.search(r"Overall exposure level for vllm@\w+\.service: ([0-9.]+)", proc.stdout).group(1))
    assert score <= most, proc.stdout
    device_line = next((ln for ln in proc.stdout.splitlines() if "DeviceAllow=" in ln), "")
    if flavour == "cuda":  # systemd read the drop-in: the instance's GPUs, not the others
        assert "/dev/char/195:6:rwm" in device_line and "/dev/char/195:0:" not in device_line, device_line


# ---------------------------------------------------------------- the launcher's environment
def test_the_launcher_environment_of_the_4_gpu_instance_exactly(rendered):
    raw = load(rendered["cuda"] / "etc" / "vllm" / "chat" / "config.toml")
    cfg, problems = validate(raw, "chat", check_files=False)
    assert problems == []
    # what systemd would give it (RuntimeDirectory=vllm-%i), nothing inherited: exactly what the launcher sets
    assert build_env(cfg, {}, key=None, runtime_dir="/run/vllm-chat") == CHAT_ENV
    with_key = build_env(cfg, {}, key="k" * 43, runtime_dir="/run/vllm-chat")
    assert set(with_key) - set(CHAT_ENV) == {"VLLM_API_KEY"}
    # HOME and the caches win over systemd's (the instance user's home is /nonexistent)
    assert build_env(cfg, {"HOME": "/", "TRITON_CACHE_DIR": "/x"}, runtime_dir="/run/vllm-chat") == CHAT_ENV


def test_the_launcher_itself_sets_those_names(rendered, tmp_path):
    """rigops-vllm-launch --dry-run on the rendered config, as the unit runs it (a systemd-like environment)."""
    model = tmp_path / "model"
    model.mkdir()
    for name in (FIX / "model_files.txt").read_text().split():
        src = FIX / name
        (model / name).write_text(src.read_text() if src.exists() else "x")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / "lib" / "python3.11" / "site-packages" / "vllm-0.11.0.dist-info").mkdir(parents=True)
    key_file = tmp_path / "api_key"
    key_file.write_text("K" * 43 + "\n")
    smi = tmp_path / "bin" / "nvidia-smi"  # the launcher counts the GPUs the driver shows
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\nfor i in 0 1 2 3 4 5 6 7; do echo $i; done\n")
    smi.chmod(0o755)
    raw = load(rendered["cuda"] / "etc" / "vllm" / "chat" / "config.toml")
    raw["model"]["path"] = str(model)
    raw["server"]["python"] = str(venv / "bin" / "python")
    raw["server"]["key_file"] = str(key_file)
    import tomli_w

    (tmp_path / "config.toml").write_text(tomli_w.dumps(raw))
    systemd_env = {
        "PATH": f"{smi.parent}:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "RUNTIME_DIRECTORY": "/run/vllm-chat",
        "PYTHONPATH": str(ROOT / ".collections"),
    }
    proc = subprocess.run(
        [sys.executable, str(LAUNCHER), "--dry-run", str(tmp_path / "config.toml")],
        capture_output=True,
        text=True,
        env=systemd_env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["env_names"] == sorted(set(CHAT_ENV) | set(systemd_env) | {"VLLM_API_KEY"})
    assert out["secret_env_names"] == ["VLLM_API_KEY"]
    assert "K" * 43 not in proc.stdout
    assert "--tensor-parallel-size=4" in out["argv"]


# ---------------------------------------------------------------- the plan (plugins/module_utils/vllm_devices.py)
def test_a_real_capture_whose_minor_is_not_its_index():
    facts = build_gpu_facts(parse_smi_xml(A100.read_text()), None)
    assert facts["gpus"][0]["index"] == 0 and facts["gpus"][0]["minor_number"] == 1
    plan = vllm_devices.device_plan("a", "cuda", [0], facts)
    assert plan["allow"][0]["entry"] == "/dev/char/195:1 rwm"  # /dev/nvidia1, not /dev/nvidia0
    assert plan["exec_start_pre"] == ["-+/usr/bin/nvidia-modprobe -c=255 -c=1"]
    assert plan["notes"] == []


def test_without_a_minor_number_the_index_is_assumed_and_said():
    facts = {"gpus": [{"index": 0, "minor_number": None}, {"index": 1, "minor_number": 3}]}
    plan = vllm_devices.device_plan("b", "cuda", [0, 1, 2], facts)
    assert [(g["index"], g["minor"], g["minor_from"]) for g in plan["gpus"]] == [
        (0, 0, "index"),
        (1, 3, "facts"),
        (2, 2, "index"),
    ]
    (note,) = plan["notes"]
    assert "vllm@b" in note and "[0, 2]" in note and "/dev/nvidia0, /dev/nvidia2" in note
    # no facts at all (nvidia-smi missing): every GPU by index, and said
    assert "[4, 5]" in vllm_devices.device_plan("c", "cuda", [4, 5], {})["notes"][0]


def test_extra_entries_are_added_once_and_malformed_ones_refused():
    plan = vllm_devices.device_plan("d", "cuda", [0], {}, ["/dev/infiniband/uverbs0 rw", "char-nvidia-uvm rwm"])
    entries = [a["entry"] for a in plan["allow"]]
    assert entries.count("char-nvidia-uvm rwm") == 1 and entries[-1] == "/dev/infiniband/uverbs0 rw"
    for bad in ("/proc/x rw", "char-foo rwx", "nvidia0", "/dev/nvidia0 rrw", "/dev/a b rw"):
        with pytest.raises(ValueError, match="vllm_service_device_allow"):
            vllm_devices.device_plan("d", "cuda", [0], {}, [bad])
    assert vllm_devices.entry_problem("char-nvidia-caps-imex-channels rw") is None


def test_cpu_has_no_plan_and_unknown_flavours_are_refused():
    assert vllm_devices.device_plan("e", "cpu", [], {})["allow"] == []
    with pytest.raises(ValueError, match="flavour 'rocm' is unknown"):
        vllm_devices.device_plan("e", "rocm", [0], {})
