# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What systemd says of units, read from its commands' output.

Host side: Python 3.8 and the standard library only.
"""


def active_units(units, is_active_output):
    """The ``units`` that ``systemctl is-active <units...>`` called ``active``: it prints one state per unit, in
    the order given (``active``, ``inactive``, ``failed``, ``activating``, ``unknown``...)."""
    states = is_active_output.split()
    return [unit for unit, state in zip(units, states) if state == "active"]
