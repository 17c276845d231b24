"""The service accounts a role keeps, judged against this machine's user and group databases
(plugins/module_utils/accounts.py)."""

import grp
import os
import pwd

from ansible_collections.rigops.fleet.plugins.module_utils.accounts import accounts_to_fix

ME = pwd.getpwuid(os.getuid())
MY_GROUP = grp.getgrgid(ME.pw_gid).gr_name


def test_an_account_as_wanted_needs_nothing():
    me = {"name": ME.pw_name, "group": MY_GROUP, "shell": ME.pw_shell, "home": ME.pw_dir}
    assert accounts_to_fix([me], [MY_GROUP]) == {"users": [], "groups": []}
    assert accounts_to_fix([], []) == {"users": [], "groups": []}


def test_missing_accounts_and_each_difference_are_named():
    me = {"name": ME.pw_name, "group": MY_GROUP, "shell": ME.pw_shell, "home": ME.pw_dir}
    users = [
        {"name": "rigops-no-such-user", "group": MY_GROUP, "shell": "/usr/sbin/nologin", "home": "/nonexistent"},
        dict(me, shell="/bin/rigops-other-shell"),
        dict(me, home="/rigops-other-home"),
        dict(me, group="rigops-no-such-group"),
        dict(me, group=next(g.gr_name for g in grp.getgrall() if g.gr_gid != ME.pw_gid)),
    ]
    found = accounts_to_fix(users, ["rigops-no-such-group", MY_GROUP])
    assert found == {"users": ["rigops-no-such-user", ME.pw_name, ME.pw_name, ME.pw_name, ME.pw_name],
                     "groups": ["rigops-no-such-group"]}  # fmt: skip
