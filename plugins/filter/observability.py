# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the observability role, run on the controller.

- ``facts | observability_target(host, settings)``: what Prometheus scrapes on one host, from that
  host's variables (its instances, runtime flavour, overrides): its address, node exporter, the
  metrics proxy and which instances behind it, GPU facts, DCGM. The rig's own tasks use the same
  decision, so what Prometheus expects is what the rig serves.
- ``targets | observability_prometheus_config(settings)``: /etc/prometheus/prometheus.yml as data.

Instances are read through their public view (name, port, served name): no key reaches here.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError


def _flag(value, auto):
    """A variable that is true, false, or "auto" (decided by `auto`)."""
    if isinstance(value, bool):
        return value
    if value is None or str(value).strip().lower() in ("", "auto"):
        return bool(auto)
    text = str(value).strip().lower()
    if text in ("true", "yes", "1", "on"):
        return True
    if text in ("false", "no", "0", "off"):
        return False
    raise AnsibleFilterError(f"observability: {value!r} is not true, false or auto")


def target(facts, host, settings=None):
    """facts: instances (vllm_instances), flavour (vllm_runtime_flavour), metrics_proxy, gpu_metrics,
    dcgm (observability_* of that host: bool or "auto"), address (observability_address),
    address_by_value (the value of the variable named by observability_address_by)."""
    facts, settings = dict(facts or {}), dict(settings or {})
    instances = []
    for inst in facts.get("instances") or []:
        if not isinstance(inst, dict) or not inst.get("name") or inst.get("port") in (None, ""):
            raise AnsibleFilterError(f"observability: {host}: an instance without name or port: {inst!r}")
        model = inst.get("model") or {}
        bind = str(inst.get("host") or "127.0.0.1")
        instances.append(
            {
                "name": str(inst["name"]),
                "port": int(inst["port"]),
                # the proxy reaches the instance on the rig's loopback whatever it binds
                "host": "127.0.0.1" if bind in ("0.0.0.0", "::", "*") else bind,
                "served_name": str(model.get("served_name") or inst["name"]),
            }
        )
    flavour = facts.get("flavour") or "cuda"
    gpu = _flag(facts.get("gpu_metrics"), flavour == "cuda")
    proxy = _flag(facts.get("metrics_proxy"), bool(instances) or gpu)
    address = facts.get("address") or facts.get("address_by_value") or host
    return {
        "host": host,
        "address": str(address),
        "node_exporter": _flag(facts.get("node_exporter"), True),
        "metrics_proxy": proxy,
        "instances": instances if proxy else [],
        "gpu": gpu and proxy,
        "dcgm": _flag(facts.get("dcgm"), False),
    }


def _hostport(address, port):
    return f"[{address}]:{port}" if ":" in address and not address.startswith("[") else f"{address}:{port}"


def prometheus_config(targets, settings):
    """settings: listen, scrape_interval, evaluation_interval, rule_files, alertmanagers, node_port, proxy_port,
    dcgm_port, gateway_targets."""
    s = dict(settings or {})
    node, vllm, gpu, dcgm = [], [], [], []
    for t in targets or []:
        if t.get("node_exporter", True):
            node.append({"targets": [_hostport(t["address"], s["node_port"])], "labels": {"host": t["host"]}})
        for inst in t.get("instances") or []:
            vllm.append(
                {
                    "targets": [_hostport(t["address"], s["proxy_port"])],
                    "labels": {
                        "host": t["host"],
                        "vllm_instance": inst["name"],
                        "served_name": inst["served_name"],
                        # the proxy's path for this instance (multi-target: one proxy, a path per instance)
                        "__metrics_path__": f"/vllm/{inst['name']}/metrics",
                    },
                }
            )
        if t.get("gpu"):
            gpu.append({"targets": [_hostport(t["address"], s["proxy_port"])], "labels": {"host": t["host"]}})
        if t.get("dcgm"):
            dcgm.append({"targets": [_hostport(t["address"], s["dcgm_port"])], "labels": {"host": t["host"]}})
    # a listener's own address, as Prometheus reaches itself
    listen = str(s["listen"])
    self_target = listen.replace("0.0.0.0:", "127.0.0.1:") if listen.startswith("0.0.0.0:") else listen
    jobs = [
        {"job_name": "prometheus", "static_configs": [{"targets": [self_target]}]},
        {"job_name": "node", "static_configs": node},
        {"job_name": "vllm", "static_configs": vllm},
        {"job_name": "rigops_gpu", "metrics_path": "/gpu/metrics", "static_configs": gpu},
        {"job_name": "dcgm", "static_configs": dcgm},
    ]
    if s.get("gateway_targets"):
        jobs.append(
            {"job_name": "gateway", "static_configs": [{"targets": [str(x) for x in s["gateway_targets"]]}]},
        )
    config = {
        "global": {
            "scrape_interval": s["scrape_interval"],
            "evaluation_interval": s["evaluation_interval"],
            "external_labels": {"monitor": "rigops"},
        },
        "rule_files": list(s["rule_files"]),
        "scrape_configs": [j for j in jobs if j["static_configs"]],
    }
    if s.get("alertmanagers"):
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": list(s["alertmanagers"])}]}]}
    return config


def proxy_config(target_, settings):
    """/etc/rigops/metrics-proxy.json of one host, from its target."""
    s = dict(settings or {})
    return {
        "listen": s["listen"],
        "port": int(s["port"]),
        "timeout": float(s.get("timeout", 5)),
        "gpu": bool(target_.get("gpu")),
        "nvidia_smi": s.get("nvidia_smi", "nvidia-smi"),
        "instances": {i["name"]: {"host": i["host"], "port": i["port"]} for i in target_.get("instances") or []},
    }


class FilterModule:
    def filters(self):
        return {
            "observability_target": target,
            "observability_prometheus_config": prometheus_config,
            "observability_proxy_config": proxy_config,
        }
