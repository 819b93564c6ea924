"""kvconform as a vendor uses it: the wheel and the example vendor package
(examples/vendor_backend) installed into a fresh venv, the suite run from the vendor's own
repository — which has its own ``reference``/``reports`` packages and a conftest that owns
``--device`` — through ``pytest --pyargs kvconform.conformance`` and ``kvconform run``.

The fresh venv gets only the two wheels; torch, pytest and the other dependencies are borrowed
from the test's own environment through a ``.pth`` line (its ``.pth`` files — the editable
kvconform among them — are not processed), so the test costs seconds, not a second torch install.
"""

from __future__ import annotations

import json
import shlex
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from .fresh_venv import checked, sh
from .suite_runs import ROOT

EXAMPLE = ROOT / "examples" / "vendor_backend"
EXPECTATIONS = EXAMPLE / "kvconform-expectations.txt"


VENDOR_CONFTEST = '''
def pytest_addoption(parser):
    parser.addoption("--device", default="cpu", help="ACME's own option")
'''
VENDOR_TEST = '''
import reference, reports

def test_the_vendors_own_packages_and_options_are_theirs(pytestconfig):
    assert reference.OWNER == reports.OWNER == "acme"
    assert pytestconfig.getoption("device") == "npu"
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh venv holding the kvconform and acme-kv wheels, and a vendor repository."""
    tmp = tmp_path_factory.mktemp("installed")
    wheels = tmp / "wheels"
    checked(sh(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheels, ROOT, EXAMPLE))
    venv.create(tmp / "venv", with_pip=False)
    python = tmp / "venv" / "bin" / "python"
    checked(sh(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", *sorted(wheels.glob("*.whl"))))
    site = Path(checked(sh(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")).stdout.strip())
    (site / "zz_borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    repo = tmp / "acme-repo"
    for package in ("reference", "reports"):
        (repo / package).mkdir(parents=True)
        (repo / package / "__init__.py").write_text('OWNER = "acme"\n')
    (repo / "conftest.py").write_text(VENDOR_CONFTEST)
    (repo / "tests").mkdir()
    (repo / "tests" / "test_own.py").write_text(VENDOR_TEST)
    (repo / EXPECTATIONS.name).write_text(EXPECTATIONS.read_text())  # vendors keep theirs in their repo
    return {"python": python, "site": site, "repo": repo, "wheels": wheels, "tmp": tmp}


def suite_in(installed, out, *args, python=None, cwd=None, env=None):
    proc = sh(python or installed["python"], "-m", "pytest", "--pyargs", "kvconform.conformance", "-p", "no:cacheprovider",
              "--kvc-json", out / "results.json", *args, cwd=cwd or installed["repo"], env=env)
    document = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else None
    return proc, document


def test_the_wheel_installs_nothing_but_the_kvconform_namespace(installed):
    record = next(installed["site"].glob("kvconform-*.dist-info")) / "RECORD"
    paths = [line.split(",")[0] for line in record.read_text().splitlines() if line]
    tops = {p.split("/")[0] for p in paths if not p.startswith("../")}  # "../../../bin/kvconform": the console script
    assert tops == {"kvconform", record.parent.name}, tops
    assert not list(ROOT.glob("*.egg-info")) and not (ROOT / "build").exists(), "building the wheel left files in the checkout"


def test_the_wheel_marks_the_package_typed_for_the_vendors_type_checker(installed):
    record = next(installed["site"].glob("kvconform-*.dist-info")) / "RECORD"
    assert "kvconform/py.typed" in [line.split(",")[0] for line in record.read_text().splitlines()]  # PEP 561: one marker covers the subpackages
    assert (installed["site"] / "kvconform" / "py.typed").is_file()


def test_the_vendors_own_tests_are_untouched_by_the_installed_plugin(installed):
    proc = sh(installed["python"], "-m", "pytest", "-p", "no:cacheprovider", "tests", "--device", "npu", cwd=installed["repo"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not (installed["repo"] / "kvconform-results").exists()


def test_installed_suite_gates_the_vendor_backend_on_its_expectations(installed, tmp_path):
    proc, document = suite_in(installed, tmp_path, "--backend", "acme", "--expectations", EXPECTATIONS.name, "-n", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    outcomes = {r["outcome"] for r in document["tests"]}
    assert "passed" in outcomes and "expected-failure" in outcomes and not outcomes & {"failed", "error", "crashed"}
    assert "another plugin or conftest owns --device" in proc.stdout
    assert not list(installed["site"].rglob(".hypothesis")) and not (installed["repo"] / ".hypothesis").exists()


def test_a_broken_vendor_backend_fails_its_family_with_a_repro_line_that_runs_anywhere(installed, tmp_path):
    proc, document = suite_in(installed, tmp_path, "--backend", "acme_broken", "--expectations", EXPECTATIONS.name)
    assert proc.returncode == 1
    failed = [r for r in document["tests"] if r["outcome"] == "failed"]
    families = {r["family"] for r in failed}
    assert "write" in families and families <= {"write", "equivalence"}, families  # golden cases pad with -1 too
    repro = shlex.split(failed[0]["repro"])
    assert repro[0] == "pytest"
    again = sh(installed["python"], "-m", *repro, "-p", "no:cacheprovider", "--kvc-json", tmp_path / "again" / "r.json", cwd=tmp_path)
    records = json.loads((tmp_path / "again" / "r.json").read_text())["tests"]
    assert again.returncode == 1 and [r["nodeid"] for r in records] == [failed[0]["nodeid"]]


def test_kvconform_run_uses_the_installed_suite_from_any_directory(installed, tmp_path):
    kvconform = installed["python"].parent / "kvconform"
    proc = sh(kvconform, "run", "--backend", "acme", "--out", tmp_path, "--", "--kvc-expectations", installed["repo"] / EXPECTATIONS.name, cwd=installed["repo"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = json.loads((tmp_path / "results.json").read_text())["tests"]
    assert {r["backend"] for r in records} == {"acme"} and "passed" in {r["outcome"] for r in records}


def test_kvconform_run_reports_a_suite_that_cannot_start_as_a_harness_error(installed, tmp_path):
    kvconform = installed["python"].parent / "kvconform"
    proc = sh(kvconform, "run", "--backend", "acme", "--out", tmp_path, "--", "--kvc-profile", "no-such-profile", cwd=installed["repo"])
    assert proc.returncode == 3 and "HARNESS ERROR" in proc.stderr and "usage error" in proc.stderr
    assert not (tmp_path / "results.json").exists()


def test_one_expectations_file_gates_a_checkout_run_and_an_installed_run_alike(installed, tmp_path):
    """Test ids do not depend on how the suite was started: same ids, same verdicts."""
    acme_site = tmp_path / "acme-site"
    checked(sh(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", acme_site, *installed["wheels"].glob("acme_kv-*.whl")))
    args = ("--backend", "acme", "--expectations", EXPECTATIONS, "-m", "write or swap")
    checkout = sh(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "conformance", "--kvc-json", tmp_path / "checkout.json", *args,
                  cwd=ROOT, env={"PYTHONPATH": str(acme_site)})
    installed_proc, document = suite_in(installed, tmp_path / "installed", *args)
    assert checkout.returncode == installed_proc.returncode == 0, checkout.stdout[-2000:] + installed_proc.stdout[-2000:]
    verdicts = lambda doc: {r["nodeid"]: r["outcome"] for r in doc["tests"]}  # noqa: E731
    assert verdicts(json.loads((tmp_path / "checkout.json").read_text())) == verdicts(document)
