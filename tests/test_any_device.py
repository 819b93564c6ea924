"""Any torch device (#38 item 8): ``--kvc-device`` takes whatever device torch knows (a PrivateUse1
backend's name included) and refuses one this machine lacks by name; results record a non-CUDA
device's type as the run's platform; VENDOR_CI.md documents every attribute of the adapter; and the
suite runs on a PrivateUse1 device (tests/privateuse1_stand_in.py: host memory behind it)."""

import inspect
import re
import subprocess
import sys

import pytest

from kvconform.backends_under_test import contract
from kvconform.conformance.plugin.options import OptionError, check_device
from kvconform.conformance.plugin.recorder import run_platform

from .suite_runs import ROOT, run_suite

ATTRIBUTES = ("name", "capabilities", "platform", "device", "arch", "cache_dtype", "versions", "default_timeout")
EXCEPTIONS = ("OpUnavailable", "BackendUnavailable", "BackendOutOfScope")


def test_a_device_torch_knows_that_this_machine_lacks_is_refused_by_name():
    with pytest.raises(OptionError, match=r"--kvc-device xpu:1: not available on this machine"):
        check_device("xpu:1")


def test_a_privateuse1_backends_name_is_a_device_the_option_takes():
    """Parsed as a device, not refused as a word: only its allocation fails here (no extension)."""
    script = ("import torch; torch.utils.rename_privateuse1_backend('acmenpu')\n"
              "from kvconform.conformance.plugin.options import check_device, OptionError\n"
              "try:\n    check_device('acmenpu:0')\nexcept OptionError as exc:\n    print(exc)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT).stdout
    assert out.startswith("--kvc-device acmenpu:0: not available on this machine"), out


def test_a_run_records_a_non_cuda_device_by_its_type():
    assert (run_platform("cpu"), run_platform("xpu:1"), run_platform("privateuseone:0")) == ("cpu", "xpu", "privateuseone")


def test_vendor_ci_documents_every_attribute_of_the_adapter_and_its_exceptions():
    section = (ROOT / "docs" / "VENDOR_CI.md").read_text().split("### The adapter's attributes")[1].split("\n## ")[0]
    documented = {name for row in section.splitlines() if row.startswith("| `") for name in re.findall(r"`(\w+)", row.split("|")[1])}
    assert set(ATTRIBUTES) | {*EXCEPTIONS, "NotImplementedError"} <= documented, documented
    assert all(hasattr(contract.Backend, name) or name in inspect.get_annotations(contract.Backend) for name in ATTRIBUTES)
    assert all(issubclass(getattr(contract, name), Exception) for name in EXCEPTIONS)
    assert "--kvc-device npu:0" in section and "def cache_dtype" in section and "raise OpUnavailable" in section


def test_the_suite_runs_on_a_privateuse1_device_and_catches_a_bug_there(tmp_path):
    """VENDOR_CI.md's worked example, the extension loaded with -p before --kvc-device is checked.
    On 6831dc8 every cache errored ("Unknown device type acmenpu for Dlpack") and the run said cpu."""
    run = run_suite(tmp_path, "-p", "tests.privateuse1_stand_in", "--kvc-device", "acmenpu:0", "-p", "no:randomly",
                    "--kvc-backend", "reference,mutant:write_padding_slots", "-k", "test_padding_slots_leave_cache_untouched",
                    target="kvconform.conformance.test_write")
    assert run.document["environment"]["run_platform"] == "acmenpu", run.output
    assert run.outcomes("reference") == {"passed"}, run.output
    assert run.outcomes("mutant:write_padding_slots") == {"failed"}
    assert all("padding-written" in r["message"] for r in run.records if r["outcome"] == "failed")
