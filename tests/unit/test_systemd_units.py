"""What systemd says of units (plugins/module_utils/systemd_units.py)."""

from ansible_collections.rigops.fleet.plugins.module_utils.systemd_units import active_units


def test_one_state_per_unit_in_order():
    units = ["vllm@chat.service", "vllm@code.service", "vllm@old.service", "vllm@new.service"]
    # what systemctl is-active printed for them (one line each; its exit code is 3 when one is not active)
    out = "active\nfailed\ninactive\nactivating\n"
    assert active_units(units, out) == ["vllm@chat.service"]
    assert active_units(units, "") == []
    assert active_units([], "active\n") == []
