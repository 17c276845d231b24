"""Persistence mode, as the driver would report it.

A GPU is in persistence mode while the ``nvidia-persistenced`` stand-in runs and holds
it (all GPUs, unless started with ``--no-persistence-mode``; ``nvidia-smi -pm 0|1``
changes one GPU through the running daemon), or after the legacy ``nvidia-smi -pm 1``
without the daemon. Legacy mode is lost when the module unloads or the host reboots.
"""

from __future__ import annotations

import json
import os

from . import kmod, paths
from .profile import Gpu, Profile


def _read_json(path: str, default):
    try:
        with open(paths.p(path), encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return default


def _write_json(path: str, data) -> None:
    real = paths.p(path)
    os.makedirs(os.path.dirname(real), exist_ok=True)
    tmp = real + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, sort_keys=True)
    os.replace(tmp, real)


def daemon_state() -> dict | None:
    """The running daemon's state, or None when no live daemon holds the GPUs."""
    pid = kmod.persistenced_pid()
    if not pid:
        return None
    state = _read_json(paths.DAEMON_STATE, None)
    if not state or int(state.get("pid", 0)) != pid:
        return None
    return state


def write_daemon_state(pid: int, persistence_mode: bool) -> None:
    _write_json(paths.DAEMON_STATE, {"pid": pid, "persistence_mode": persistence_mode, "overrides": {}})


def clear_daemon_state() -> None:
    try:
        os.unlink(paths.p(paths.DAEMON_STATE))
    except FileNotFoundError:
        pass


def legacy() -> set[str]:
    return set(_read_json(paths.LEGACY_PM, []))


def enabled(gpu: Gpu) -> bool:
    if gpu.bus_id in legacy():
        return True
    state = daemon_state()
    if state is None:
        return False
    return bool(state.get("overrides", {}).get(gpu.bus_id, state.get("persistence_mode", True)))


def mode(gpu: Gpu, prof: Profile) -> str:
    if prof.jetson:
        return "N/A"
    return "Enabled" if enabled(gpu) else "Disabled"


def set_mode(gpu: Gpu, on: bool) -> str:
    """Change one GPU; return the line nvidia-smi prints."""
    word = "Enabled" if on else "Disabled"
    was = enabled(gpu)
    state = daemon_state()
    if state is not None:
        if was == on:
            return f"Persistence mode is already {word} for GPU {gpu.bus_id}."
        state.setdefault("overrides", {})[gpu.bus_id] = on
        _write_json(paths.DAEMON_STATE, state)
        if not on:
            _set_legacy(gpu, False)
        return f"{word} persistence mode for GPU {gpu.bus_id}."
    if was == on:
        return f"Persistence mode is already {word} for GPU {gpu.bus_id}."
    _set_legacy(gpu, on)
    return f"{word} Legacy persistence mode for GPU {gpu.bus_id}."


def _set_legacy(gpu: Gpu, on: bool) -> None:
    cur = legacy()
    if on:
        cur.add(gpu.bus_id)
    else:
        cur.discard(gpu.bus_id)
    _write_json(paths.LEGACY_PM, sorted(cur))
