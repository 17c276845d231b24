"""One task for a role's files, folders and absences (plugins/module_utils/host_files.py), on a real folder."""

import grp
import os
import pwd
import stat

import pytest
from ansible_collections.rigops.fleet.plugins.module_utils.host_files import HostFilesError, converge, normalise

ME = pwd.getpwuid(os.getuid()).pw_name
MY_GROUP = grp.getgrgid(os.getgid()).gr_name


def entries(root):
    return [
        {"path": f"{root}/etc", "state": "directory", "mode": "0755", "owner": ME, "group": MY_GROUP},
        {"path": f"{root}/etc/a.conf", "content": "a = 1\n", "mode": "0644", "owner": ME, "group": MY_GROUP},
        {"path": f"{root}/etc/old.conf", "state": "absent"},
    ]


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_first_run_makes_all_then_nothing_differs(tmp_path):
    (tmp_path / "etc").mkdir(mode=0o700)
    (tmp_path / "etc" / "old.conf").write_text("stale\n")
    changed, diffs = converge(entries(tmp_path))
    assert changed == {
        f"{tmp_path}/etc": ["mode"],
        f"{tmp_path}/etc/a.conf": ["absent"],
        f"{tmp_path}/etc/old.conf": ["present"],
    }
    assert mode(tmp_path / "etc") == 0o755 and mode(tmp_path / "etc" / "a.conf") == 0o644
    assert (tmp_path / "etc" / "a.conf").read_text() == "a = 1\n" and not (tmp_path / "etc" / "old.conf").exists()
    assert {d["after_header"]: (d["before"], d["after"]) for d in diffs} == {
        f"{tmp_path}/etc/a.conf": ("", "a = 1\n"), f"{tmp_path}/etc/old.conf": ("stale\n", ""),
    }  # fmt: skip
    assert converge(entries(tmp_path)) == ({}, [])
    assert sorted(p.name for p in (tmp_path / "etc").iterdir()) == ["a.conf"]  # no temporary file left


def test_check_mode_reports_and_changes_nothing(tmp_path):
    changed, _ = converge(entries(tmp_path), check_mode=True)
    assert set(changed) == {f"{tmp_path}/etc", f"{tmp_path}/etc/a.conf"}  # old.conf is absent already
    assert not (tmp_path / "etc").exists()


def test_drift_in_text_or_mode_is_found_and_mended(tmp_path):
    converge(entries(tmp_path))
    conf = tmp_path / "etc" / "a.conf"
    conf.write_text("a = 2\n")
    os.chmod(tmp_path / "etc", 0o777)
    changed, diffs = converge(entries(tmp_path))
    assert changed == {f"{tmp_path}/etc": ["mode"], str(conf): ["content"]}
    assert diffs == [{"before_header": str(conf), "after_header": str(conf), "before": "a = 2\n", "after": "a = 1\n"}]
    assert conf.read_text() == "a = 1\n" and mode(tmp_path / "etc") == 0o755
    os.chmod(conf, 0o600)
    assert converge(entries(tmp_path))[0] == {str(conf): ["mode"]} and mode(conf) == 0o644


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another user needs root")
def test_owner_and_group_are_mended(tmp_path):
    converge(entries(tmp_path))
    conf = tmp_path / "etc" / "a.conf"
    os.chown(conf, 65534, 65534)
    assert converge(entries(tmp_path))[0] == {str(conf): ["owner", "group"]}
    assert (conf.stat().st_uid, conf.stat().st_gid) == (os.getuid(), os.getgid())


def test_validate_keeps_the_old_file_when_the_new_one_fails(tmp_path):
    conf = tmp_path / "a.conf"
    conf.write_text("good\n")
    os.chmod(conf, 0o644)
    bad = [{"path": str(conf), "content": "bad\n", "mode": "0644", "owner": ME, "group": MY_GROUP,
            "validate": "grep -q good %s"}]  # fmt: skip
    with pytest.raises(HostFilesError, match=r"validation failed \(grep -q good %s, exit 1\)"):
        converge(bad)
    assert conf.read_text() == "good\n" and sorted(p.name for p in tmp_path.iterdir()) == ["a.conf"]
    bad[0]["content"] = "good too\n"
    assert converge(bad)[0] == {str(conf): ["content"]}


def test_a_path_of_another_kind_is_refused_and_left(tmp_path):
    (tmp_path / "a.conf").mkdir()
    with pytest.raises(HostFilesError, match=r"a.conf: should be a file but is a folder"):
        converge([{"path": f"{tmp_path}/a.conf", "content": "", "mode": "0644", "owner": ME, "group": MY_GROUP}])
    with pytest.raises(HostFilesError, match=r"a.conf: should be absent but is a folder"):
        converge([{"path": f"{tmp_path}/a.conf", "state": "absent"}])
    assert (tmp_path / "a.conf").is_dir()


def test_an_unknown_owner_names_the_path(tmp_path):
    (tmp_path / "a").write_text("")
    with pytest.raises(HostFilesError, match=r"/a: owner 'no-such-user-rigops' is not a user on this host"):
        converge([{"path": f"{tmp_path}/a", "content": "", "mode": "0644", "owner": "no-such-user-rigops"}])


def test_bad_entries_name_the_entry_and_field_and_what_is_allowed():
    with pytest.raises(HostFilesError) as caught:
        normalise([
            {"path": "etc/x", "content": "", "mode": "0644"},
            {"path": "/etc/y", "state": "link", "mode": "0644"},
            {"path": "/etc/z", "content": "", "mode": 420},
            {"path": "/etc/w", "state": "directory", "mode": "0755", "content": "x"},
            {"path": "/etc/v", "mode": "0644"},
            {"path": "/etc/u", "state": "absent", "owner_name": "root"},
            {"path": "/etc/z", "state": "absent"},
        ])  # fmt: skip
    msg = str(caught.value)
    assert "files[0] (etc/x): path must be an absolute, normalised path; got 'etc/x'" in msg
    assert "files[1] (/etc/y): state must be one of file, directory, absent; got 'link'" in msg
    assert "files[2] (/etc/z): mode must be an octal string such as '0644'; got 420" in msg
    assert "files[3] (/etc/w): content is for state file only (state is directory)" in msg
    assert "files[4] (/etc/v): a file needs its content as text; got NoneType" in msg
    assert "files[5] (/etc/u): unknown field(s) owner_name" in msg
    assert "given more than once: /etc/z" in msg


def test_a_folder_is_made_with_the_folders_on_its_way(tmp_path):
    deep = tmp_path / "lib" / "ansible_collections" / "rigops"
    changed, _ = converge([{"path": str(deep), "state": "directory", "mode": "0750", "owner": ME, "group": MY_GROUP}])
    assert changed == {str(deep): ["absent"]}
    assert mode(deep) == 0o750 and mode(deep.parent) == 0o750 and mode(tmp_path / "lib") == 0o750
