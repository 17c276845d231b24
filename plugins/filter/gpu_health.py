# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the gpu_health role, run on the controller.

- ``instances | gpu_health_config(gpus, previous, settings)``: ``{"config": ..., "problems": [...]}``, the
  sentinel's config for a host (plugins/module_utils/gpu_health_sentinel.build_config says how GPUs are
  expected and how an instance's GPU indices become bus ids).
- ``state | gpu_health_summary(host)``: what the run's report says of the host, from a round's state.
"""

from __future__ import annotations

from ansible_collections.rigops.fleet.plugins.module_utils import gpu_health_sentinel
from ansible_collections.rigops.fleet.plugins.plugin_utils.plain import filter_errors, plain


def gpu_health_config(instances, gpus, previous=None, settings=None):
    config, problems = gpu_health_sentinel.build_config(
        plain(instances), plain(gpus), plain(previous), plain(settings or {})
    )
    return {"config": config, "problems": problems}


def gpu_health_summary(state, host):
    return gpu_health_sentinel.summary(plain(state), str(host))


class FilterModule:
    """The gpu_health role's filters (see the module's docstring)."""

    def filters(self):
        return {
            "gpu_health_config": filter_errors(gpu_health_config),
            "gpu_health_summary": filter_errors(gpu_health_summary),
        }
