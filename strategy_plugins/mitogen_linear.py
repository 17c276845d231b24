"""Mitogen's linear strategy, from the mitogen package in the controller's virtualenv.

``ANSIBLE_STRATEGY=mitogen_linear`` finds it here (ansible.cfg's strategy_plugins, and the
Molecule base config's ANSIBLE_STRATEGY_PLUGINS, name this folder), so nobody has to work out
where pip put the package. Mitogen keeps one Python per host and its imports between tasks:
a no-op task costs a fraction of a task over SSH (README, "Connection speed"). Opt-in for
users (RIGOPS_MITOGEN=1); the scenarios of roles that never reboot run under it
(.config/molecule/config.yml says which and why).
"""

from ansible_mitogen.plugins.strategy.mitogen_linear import StrategyModule

__all__ = ["StrategyModule"]
