"""Mitogen's linear strategy, from the mitogen package in the controller's virtualenv, without
its CPU pinning.

``ANSIBLE_STRATEGY=mitogen_linear`` finds it here (ansible.cfg's strategy_plugins, and the
Molecule base config's ANSIBLE_STRATEGY_PLUGINS, name this folder), so nobody has to work out
where pip put the package. Mitogen keeps one Python per host and its imports between tasks:
a no-op task costs a fraction of a task over SSH (README, "Connection speed"). Opt-in for
users (RIGOPS_MITOGEN=1); the scenarios of roles that never reboot run under it
(.config/molecule/config.yml says which and why).

Pinning: by default ansible_mitogen pins its connection multiplexer to CPU 0 and, on a
controller with fewer than 4 CPUs, the strategy, every worker and every process they start
(ssh included) to CPU 1 (ansible_mitogen/affinity.py, FixedPolicy). Two runs at once, or one
run beside anything else busy, then share one core while the other idles; on this project's
2-core machine a scenario under mitogen beside the suite's other lane ran slower than over SSH.
The base Policy (no pinning) leaves placement to the kernel's scheduler.
"""

import ansible_mitogen.affinity
from ansible_mitogen.plugins.strategy.mitogen_linear import StrategyModule

ansible_mitogen.affinity.policy = ansible_mitogen.affinity.Policy()

__all__ = ["StrategyModule"]
