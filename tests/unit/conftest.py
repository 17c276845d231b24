"""Shared fixtures for the unit tests of our modules and module_utils."""

import json
from pathlib import Path

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

REAL = Path(__file__).resolve().parent.parent / "fixtures" / "nvidia-smi" / "real"


class ModuleExit(Exception):
    """Raised instead of exit_json/fail_json so a test can inspect the result."""

    def __init__(self, failed, result):
        super().__init__(json.dumps(result, default=str)[:200])
        self.failed = failed
        self.result = result


@pytest.fixture
def real():
    """Read a real captured fixture by file name."""

    def _read(name):
        return (REAL / name).read_text(encoding="utf-8")

    return _read


@pytest.fixture
def real_path():
    def _path(name):
        return str(REAL / name)

    return _path


@pytest.fixture
def run_module(monkeypatch):
    """Run a module's main() with args; return (failed, result) without exiting."""

    def _exit_json(self, **kwargs):
        raise ModuleExit(False, kwargs)

    def _fail_json(self, msg, **kwargs):
        kwargs["msg"] = msg
        raise ModuleExit(True, kwargs)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", _exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", _fail_json)

    def _run(main, args):
        with patch_module_args(args):
            with pytest.raises(ModuleExit) as info:
                main()
        return info.value.failed, info.value.result

    return _run


# Synthetic, minimal lspci -vvv blocks (no real full capture with Bus: lines and ACSCtl
# was found); the format follows pciutils' output.
LSPCI_VVV = """\
00:01.1 PCI bridge: Advanced Micro Devices, Inc. [AMD] Device 14ab (prog-if 00 [Normal decode])
\tBus: primary=00, secondary=01, subordinate=02, sec-latency=0
\tCapabilities: [2a0 v1] Access Control Services
\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans+
\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-
01:00.0 PCI bridge: PLX Technology, Inc. PEX 8747 48-Lane, 5-Port PCI Express Gen 3 (8.0 GT/s) Switch (rev ca)
\tBus: primary=01, secondary=02, subordinate=02, sec-latency=0
\t\tACSCtl:\tSrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-
02:00.0 VGA compatible controller: NVIDIA Corporation Device 2b85 (rev a1) (prog-if 00 [VGA controller])
\tKernel driver in use: nvidia
40:01.1 PCI bridge: Advanced Micro Devices, Inc. [AMD] Device 14ab (prog-if 00 [Normal decode])
\tBus: primary=40, secondary=41, subordinate=41, sec-latency=0
\t\tACSCtl:\tSrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-
41:00.0 3D controller: NVIDIA Corporation Device 2b85 (rev a1)
"""


@pytest.fixture
def lspci_vvv_synthetic():
    return LSPCI_VVV
