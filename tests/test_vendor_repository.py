"""The vendor kit's commands, exactly as docs/VENDOR_CI.md and the kit's workflow spell them, run
from inside a vendor's repository (#23).

The repository is the kit (examples/vendor_backend) with what a real one has around it: its own
pytest setup in ``pyproject.toml`` (``addopts = "-p no:xdist"``: every suite command of the docs
says ``-n auto``, so a run that read it would stop), a ``conftest.py`` that owns ``--backend``
(with choices) and ``--device``, its own ``reference``, ``reports``, ``conformance`` and ``tests``
packages, and the fresh venv in ``.venv`` inside it (so the vendor's conftest sits above the
installed suite). The commands are read from the files — the fenced block after each
``<!-- vendor-repository-test: NAME -->`` of VENDOR_CI.md, every ``run:`` of the workflow with its
``env:`` — so the documents cannot drift from what works.

To keep the test to minutes, each suite run gets one filter from outside the command
(``PYTEST_ADDOPTS``: the padding check, which the broken variant fails, and the check the
expectations file lists), and ``-n auto`` runs in-process (``PYTEST_XDIST_AUTO_NUM_WORKERS=0``).
``kvconform certify`` refuses filters and a full certified run of the kit costs minutes, so its
block runs with ``--collect-only``: the commands start and name a registered backend;
tests/test_certify.py covers certification.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import subprocess
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvconform import isolation
from kvconform.conformance.harness import canary
from kvconform.backends_under_test import registry
from kvconform.backends_under_test.contract import CONNECTOR_OPS, Backend
from kvconform.backends_under_test.reference_backend import ReferenceBackend
from kvconform.conformance.plugin.options import OPTIONS

from .fresh_venv import build_wheels, checked, fresh_venv
from .suite_runs import ROOT

EXAMPLE = ROOT / "examples" / "vendor_backend"
DOC = ROOT / "docs" / "VENDOR_CI.md"
WORKFLOW = EXAMPLE / ".github" / "workflows" / "kvconform.yml"
BLOCK = re.compile(r"^<!-- vendor-repository-test: (\w+) -->\n```bash\n(.*?)^```", re.S | re.M)
FAST = {"PYTEST_ADDOPTS": "-k 'padding_slots_leave or fp8_codes_equal'", "PYTEST_XDIST_AUTO_NUM_WORKERS": "0"}  # -n auto: in-process
OWN_SETUP = "kvconform: pytest runs in a scratch directory"
VENDOR_CONFTEST_LOADED = "acme's conftest is loaded"

VENDOR_PYTEST_SETUP = '''
[tool.pytest.ini_options]
testpaths = ["tests"]
addopts = "-p no:xdist"
'''
VENDOR_CONFTEST = f'''
def pytest_addoption(parser):
    parser.addoption("--backend", choices=["acme-npu", "acme-sim"], default="acme-sim", help="ACME's own option")
    parser.addoption("--device", default="cpu", help="ACME's own option")


def pytest_report_header(config):
    return "{VENDOR_CONFTEST_LOADED}"
'''
VENDOR_TEST = '''
import conformance, reference, reports


def test_the_vendors_own_packages_and_options_are_theirs(pytestconfig):
    assert conformance.OWNER == reference.OWNER == reports.OWNER == "acme"
    assert pytestconfig.getoption("backend") == "acme-npu" and pytestconfig.getoption("device") == "npu"
'''


def doc_blocks() -> dict[str, str]:
    return dict(BLOCK.findall(DOC.read_text()))


def workflow() -> tuple[dict[str, str], list[tuple[str, str]]]:
    """The workflow's top-level ``env:`` and its ``run:`` scripts, in order, by step name."""
    text = WORKFLOW.read_text()
    env = dict(re.findall(r'^  (\w+): "([^"]*)"', text, re.M))
    steps = re.findall(r"^      - name: (.+)\n(?:        #.*\n)*        run: \|\n((?:          .*\n)+)", text, re.M)
    assert len(steps) == len(re.findall(r"^ +run:", text, re.M)), "a run: step this test does not read"
    return env, [(name, textwrap.dedent(script)) for name, script in steps]


def bash(script: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-e", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def output(proc) -> str:
    return proc.stdout + proc.stderr


def tree(repo: Path) -> set[str]:
    """Every path in the repository but its venv and the bytecode caches Python itself writes
    when it imports the vendor's package (unless PYTHONDONTWRITEBYTECODE says not to)."""
    found = set()
    for directory, subdirs, files in os.walk(repo):
        subdirs[:] = [d for d in subdirs if not (directory == str(repo) and d == ".venv") and d != "__pycache__"]
        found |= {os.path.relpath(os.path.join(directory, name), repo) for name in subdirs + files}
    return found


def assert_writes_only_under(repo: Path, before: set[str], *directories: str) -> None:
    stray = sorted(p for p in tree(repo) - before if p.split(os.sep)[0] not in directories)
    assert not stray, f"written outside {directories}: {stray}"


def records(path: Path) -> list[dict]:
    return json.loads(path.read_text())["tests"]


def assert_banner_names_the_baseline(stdout: str, *html: Path) -> None:
    """The verdict of a baselined run counts its known failures and names the expectations file,
    in the terminal and the HTML; it never says CONFORMS (#38: it said "CONFORMS — 0 new
    failures; 9 known" in green). These runs are filtered (FAST), so the word is PARTIAL RUN;
    tests/test_verdict_banner.py holds a complete one to NO NEW FAILURES."""
    verdicts = [line for line in stdout.splitlines() if line.startswith("kvconform verdict: ")]
    assert verdicts and all(re.search(r"; \d+ known failures? \(baseline \S*kvconform-expectations.txt\); 0 new failures;", v) for v in verdicts), verdicts
    assert "CONFORMS" not in stdout
    for page in html:
        banner = page.read_text().split('<p id="verdict"')[1].split("</p>")[0]
        assert "kvconform-expectations.txt)" in banner and "CONFORMS" not in banner, banner


@pytest.fixture(scope="module")
def vendor(tmp_path_factory):
    """ACME's repository with the kvconform wheel, as the workflow's install step installs it,
    in the fresh venv ``.venv`` inside it."""
    tmp = tmp_path_factory.mktemp("vendor")
    wheels = tmp / "wheels"
    build_wheels(wheels, ROOT)
    repo = tmp / "acme-kv"
    shutil.copytree(EXAMPLE, repo, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    (repo / "pyproject.toml").write_text((repo / "pyproject.toml").read_text() + VENDOR_PYTEST_SETUP)
    (repo / "conftest.py").write_text(VENDOR_CONFTEST)
    for package in ("reference", "reports", "conformance", "tests"):
        (repo / package).mkdir()
        (repo / package / "__init__.py").write_text('OWNER = "acme"\n')
    (repo / "tests" / "test_own.py").write_text(VENDOR_TEST)
    python = fresh_venv(repo / ".venv")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    env.update(PATH=f"{python.parent}{os.pathsep}{os.environ['PATH']}", VIRTUAL_ENV=str(python.parent.parent),
               PIP_FIND_LINKS=" ".join(filter(None, (os.environ.get("PIP_FIND_LINKS"), str(wheels)))))  # the wheel stands in for PyPI's
    workflow_env, steps = workflow()
    (install_step, install), (run_step, run) = steps
    assert "pip install" in install and "kvconform test" in run, steps
    checked(bash(install, repo, {**env, **workflow_env}))
    return SimpleNamespace(repo=repo, python=python, env=env, workflow_env=workflow_env, run_step=run, blocks=doc_blocks())


def in_repo(vendor, script: str, **extra) -> subprocess.CompletedProcess:
    return bash(script, vendor.repo, {**vendor.env, **extra})


# ----------------------------------------------------------------------------- the documents' commands
def commands(script: str) -> list[str]:
    """A block's commands, continuation lines joined, comments dropped."""
    return [line.split(" #")[0].strip() for line in script.replace("\\\n", " ").splitlines() if line.strip() and not line.startswith("#")]


def pytest_arguments(command: str) -> str:
    """What a command hands to pytest: all of ``python -m pytest …``, after ``--`` of ``kvconform …``."""
    if command.startswith("kvconform"):
        return command.partition(" -- ")[2]
    return command if "pytest" in command else ""


def test_the_documents_mark_every_command_this_test_runs_and_spell_kvconforms_options_with_kvc():
    blocks = doc_blocks()
    assert set(blocks) == {"install", "test", "pytest", "run", "certify"}
    given = [pytest_arguments(c) for script in [*blocks.values(), *(s for _, s in workflow()[1])] for c in commands(script)]
    short = {f"--{name}" for name, aliased, _ in OPTIONS if aliased}
    assert not short & {arg for args in given for arg in args.split()}, given


def test_every_suite_command_of_the_docs_spells_kvconforms_options_with_kvc():
    """Beyond the blocks this test runs: every pytest command line of README.md and docs/*.md
    (``pytest --pyargs``, ``pytest conformance``, ``./kvc suite``) and what every ``kvconform
    run|test|certify`` hands pytest after ``--``, so no example teaches a spelling a vendor's
    conftest may own (VENDOR_CI.md §6 did: ``--backend``, ``--expectations``)."""
    short = re.compile(r"(?<![\w-])--(" + "|".join(sorted((n for n, aliased, _ in OPTIONS if aliased), key=len, reverse=True)) + r")\b(?!-)")
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"kvconform (run|test|certify)\b.* -- ", line):
                handed = line.split(" -- ", 1)[1]
            elif re.search(r"pytest --pyargs|pytest conformance|\./kvc suite", line):
                handed = line
            else:
                continue
            found += [f"{path.relative_to(ROOT)}:{number}: {line.strip()}" for _ in short.findall(handed)[:1]]
    assert not found, "\n".join(found)


def pip_installs(script: str) -> list[str]:
    return [c.split("pip install", 1)[1].split()[0].strip('"').lower() for c in commands(script) if "pip install" in c]


def test_torch_is_installed_first_then_kvconform_then_the_vendor_package(vendor):
    """VENDOR_CI.md §2 and the workflow install in that order, and kvconform keeps the torch it finds."""
    for script in (vendor.blocks["install"], workflow()[1][0][1]):
        first, then, last = pip_installs(script)
        assert "torch" in first and "kvconform" in then and last == ".", script
    where = "python -c 'import torch; print(torch.__file__)'"
    before = checked(in_repo(vendor, where)).stdout
    checked(in_repo(vendor, vendor.blocks["install"]))
    assert checked(in_repo(vendor, where)).stdout == before and "borrowed-site-packages" in before  # the torch it found, not one pip fetched


def test_the_workflow_gates_the_kit_from_inside_the_vendor_repository(vendor):
    before = tree(vendor.repo)
    proc = in_repo(vendor, vendor.run_step, **vendor.workflow_env, **FAST, COLUMNS="1000")  # the verdict on one line
    assert proc.returncode == 0, output(proc)[-4000:]
    out = vendor.repo / "kvconform-out"
    assert {"results.json", "results.html", "junit.xml"} <= {p.name for p in out.iterdir()}  # what the upload step uploads
    outcomes = {r["outcome"] for r in records(out / "results.json")}
    assert "expected-failure" in outcomes and "passed" in outcomes and "failed" not in outcomes
    assert_banner_names_the_baseline(proc.stdout, out / "results.html")
    assert proc.stdout.count(OWN_SETUP) == 1
    assert VENDOR_CONFTEST_LOADED not in proc.stdout and "owns --backend" not in proc.stdout
    assert_writes_only_under(vendor.repo, before, "kvconform-out")


def test_the_workflow_fails_the_broken_variant_with_exit_1(vendor):
    proc = in_repo(vendor, vendor.run_step, **{**vendor.workflow_env, "BACKEND": "acme_broken"}, **FAST)
    assert proc.returncode == 1, output(proc)[-4000:]
    failed = {r["check"] for r in records(vendor.repo / "kvconform-out" / "results.json") if r["outcome"] == "failed"}
    assert "test_padding_slots_leave_cache_untouched" in failed


def test_kvconform_test_as_vendor_ci_spells_it(vendor):
    before = tree(vendor.repo)
    proc = in_repo(vendor, vendor.blocks["test"], **FAST)
    assert proc.returncode == 0, output(proc)[-4000:]
    out = vendor.repo / "kvconform-results"
    assert {"results.json", "results.html", "junit.xml"} <= {p.name for p in out.iterdir()}
    assert "expected-failure" in {r["outcome"] for r in records(out / "results.json")}
    assert proc.stdout.count(OWN_SETUP) == 1 and VENDOR_CONFTEST_LOADED not in proc.stdout
    assert_writes_only_under(vendor.repo, before, "kvconform-results")  # Hypothesis' files, if any, too: none in the tree


def test_the_plain_pytest_form_with_its_own_ini_rootdir_and_no_conftests(vendor):
    before = tree(vendor.repo)
    proc = in_repo(vendor, vendor.blocks["pytest"], **FAST)
    assert proc.returncode == 0, output(proc)[-4000:]
    assert "expected-failure" in {r["outcome"] for r in records(vendor.repo / "kvconform-out" / "results.json")}
    assert VENDOR_CONFTEST_LOADED not in proc.stdout and "owns --backend" not in proc.stdout
    assert_writes_only_under(vendor.repo, before, "kvconform-out")


def test_kvconform_run_resolves_relative_paths_against_the_callers_directory(vendor):
    before = tree(vendor.repo)
    proc = in_repo(vendor, vendor.blocks["run"], **FAST, COLUMNS="1000")  # the verdict on one line
    assert proc.returncode == 0, output(proc)[-4000:]
    out = vendor.repo / "kvconform-run"
    assert (out / "acme.json").exists() and (out / "results.html").exists()
    assert "expected-failure" in {r["outcome"] for r in records(out / "results.json")}  # the relative expectations file was read
    assert_banner_names_the_baseline(proc.stdout, out / "results.html", out / "acme.html")
    assert proc.stdout.count(OWN_SETUP) == 1
    assert_writes_only_under(vendor.repo, before, "kvconform-run")


def test_kvconform_run_prints_each_new_failures_property_diagnosis_and_repro(vendor):
    """Its pytest processes' output is not shown (#38: the matrix and check names, no failure details)."""
    proc = in_repo(vendor, "kvconform run --backend acme_broken --out broken-run", COLUMNS="1000", **FAST)
    assert proc.returncode != 0, output(proc)[-4000:]
    block = proc.stdout.split("FAIL conformance/test_write.py::test_padding_slots_leave_cache_untouched[acme_broken-", 1)[-1]
    assert "New failures (" in proc.stdout and block.startswith("E1:NHD]\nwrite: "), proc.stdout[-4000:]
    assert "where the wrong bytes came from:" in block and "padding-written" in block and "repro: pytest --pyargs" in block, block[:3000]


def test_the_certify_commands_start_and_name_a_registered_backend(vendor):
    certify, verify = [line.split("#")[0].strip() for line in vendor.blocks["certify"].splitlines() if line.strip()]
    backend = certify.split("--backend")[1].split()[0]
    registered = re.findall(r"^(\w+) = ", (EXAMPLE / "pyproject.toml").read_text().split('"kvconform.backends"]')[1].split("\n[")[0], re.M)
    assert backend in registered, f"§5 certifies {backend}; the kit registers {registered}"
    proc = in_repo(vendor, certify, PYTEST_ADDOPTS="--collect-only -q", PYTEST_XDIST_AUTO_NUM_WORKERS="0")
    assert proc.returncode == 1 and "NOT CERTIFIED" in proc.stdout, output(proc)[-4000:]  # no test ran: nothing to certify
    proc = in_repo(vendor, verify)
    assert proc.returncode == 1 and "not a bundle directory" in proc.stdout, output(proc)[-4000:]


PRINTS_THE_ORACLES_CODE_DIGEST = """
def pytest_collection_finish(session):
    from kvconform.conformance.harness import oracle_guard
    print("DIGEST", oracle_guard.code_digest())
"""


def test_a_pytest_run_of_the_installed_wheel_holds_the_oracle_a_clean_process_holds(vendor, tmp_path):
    """pytest rewrites the asserts of every module of an installed pytest11 plugin; the canary of a
    certified run compares the oracle's code with a clean process's, so one assert in the oracle
    refused every certified run of the wheel (2026-12-05: the checkout's editable install hid it)."""
    (tmp_path / "conftest.py").write_text(PRINTS_THE_ORACLES_CODE_DIGEST)
    in_pytest = bash(f"{vendor.python} -m pytest -p no:cacheprovider --co -q -s", tmp_path, vendor.env)
    clean = bash(f"{vendor.python} -m {canary.MODULE}", tmp_path, vendor.env)
    digests = [line.split()[1] for line in in_pytest.stdout.splitlines() if line.startswith("DIGEST")]
    assert digests == [json.loads(clean.stdout)["digests"][canary.CODE]], output(in_pytest)[-3000:] + output(clean)[-2000:]


ALIAS_ALONE = '''
import dataclasses

from acme_kv.kvconform_adapter import AcmeBackend


class AcmeE4m3Only(AcmeBackend):
    name = "acme_e4m3"
    capabilities = dataclasses.replace(AcmeBackend.capabilities, kv_cache_dtypes=("auto", "fp8_e4m3"))
'''


def test_a_declaration_at_odds_with_itself_is_warned_about_in_the_report(vendor):
    """fp8_e4m3 without its alias fp8 (#38: the e4m3 golden case silently not applicable)."""
    extra = vendor.repo.parent / "alias-alone"
    extra.mkdir(exist_ok=True)
    (extra / "acme_e4m3.py").write_text(ALIAS_ALONE)
    proc = in_repo(vendor, "kvconform test --backend acme_e4m3:AcmeE4m3Only --out alias-alone", PYTHONPATH=str(extra), COLUMNS="1000", **FAST)
    assert proc.returncode == 0, output(proc)[-4000:]
    assert "WARNING backend acme_e4m3@cpu declares kv_cache_dtype fp8_e4m3 without its alias fp8" in proc.stdout, proc.stdout[-4000:]
    assert "acme_e4m3@cpu declaration: declares kv_cache_dtype fp8_e4m3" in (vendor.repo / "alias-alone" / "results.html").read_text()


# ----------------------------------------------------------------------------- names of backends
def test_an_unknown_backend_suggests_the_registered_name_and_lists_no_mutants(vendor):
    proc = in_repo(vendor, "kvconform test --backend acme_kvv")
    assert proc.returncode == 4, output(proc)[-4000:]
    assert "did you mean acme" in output(proc) and not re.search(r"mutant:[a-z]", output(proc))
    listed = checked(in_repo(vendor, "kvconform backends")).stdout
    assert re.search(r"^acme ", listed, re.M) and re.search(r"^acme_broken ", listed, re.M) and "mutant:" not in listed
    assert "mutant:" in checked(in_repo(vendor, "kvconform backends --all")).stdout


def test_a_backend_named_by_its_class_goes_by_its_registered_name(vendor):
    """An expectations file written for ``acme`` gates a run of ``acme_kv.kvconform_adapter:AcmeBackend``."""
    spec = "acme_kv.kvconform_adapter:AcmeBackend"
    proc = in_repo(vendor, f"kvconform test --backend {spec} --out by-class -- --kvc-expectations kvconform-expectations.txt", **FAST)
    assert proc.returncode == 0, output(proc)[-4000:]
    document = json.loads((vendor.repo / "by-class" / "results.json").read_text())
    assert {r["backend"] for r in document["tests"]} == set(document["environment"]["backends"]) == {"acme"}
    assert all("[acme-" in r["nodeid"] and f"--kvc-backend {spec}" in r["repro"] for r in document["tests"])
    assert "expected-failure" in {r["outcome"] for r in document["tests"]}


def test_the_vendors_own_tests_still_run_with_their_own_setup(vendor):
    proc = in_repo(vendor, "python -m pytest --backend acme-npu --device npu")
    assert proc.returncode == 0 and VENDOR_CONFTEST_LOADED in proc.stdout, output(proc)[-4000:]


# ----------------------------------------------------------------------------- without an install
def test_the_readme_builds_a_wheel_from_a_clone_as_kvconforms_own_tests_do():
    """#38 item 10: the wheel build of a clone is documented, with the flags tests/fresh_venv.py builds it with."""
    readme = (ROOT / "README.md").read_text()
    assert "python -m pip wheel --no-deps -w dist ." in readme
    assert '"pip", "wheel", "-q", "--no-deps", "-w"' in (ROOT / "tests" / "fresh_venv.py").read_text() and build_wheels


def test_every_path_the_caller_gives_is_resolved_against_the_callers_directory():
    names = {"--kvc-expectations", "--kvc-json", "--kvc-html", "--kvc-compare-digests", "--kvc-export-digests",
             "--kvc-update-expectations", "--kvc-certify", "--expectations", "--compare-digests", "--export-digests",
             "--update-expectations", "--junitxml", "--junit-xml"}
    suite = {f"--{prefix}{name}" for name, aliased, attrs in OPTIONS if attrs.get("metavar") in ("PATH", "FILE", "DIR")
             for prefix in (("kvc-", "") if aliased else ("kvc-",))}
    assert names - {"--junitxml", "--junit-xml"} == suite and names <= isolation.PATH_OPTIONS
    assert not {o for o in isolation.PATH_OPTIONS - suite if o.startswith("--kvc-")}, "an option the suite no longer has"
    args = [arg for name in sorted(names) for arg in (name, "rel/x")] + ["--kvc-json=y.json", "-m", "write", "--kvc-seed", "3", "/abs/z"]
    resolved = isolation.resolve_paths(args, "/caller")
    assert resolved[: 2 * len(names)] == [arg if arg.startswith("-") else "/caller/rel/x" for arg in args[: 2 * len(names)]]
    assert resolved[2 * len(names):] == ["--kvc-json=/caller/y.json", "-m", "write", "--kvc-seed", "3", "/abs/z"]


def test_kvconform_run_refuses_a_results_path_of_its_own_before_starting_anything(tmp_path, capsys):
    """``kvconform run`` names each backend's results under ``--out``; a ``--kvc-json`` after ``--`` would make them collide."""
    assert isolation.run(["reference"], ["--kvc-json", "r.json"], str(tmp_path / "out"), 60.0, 1) == 4
    assert "--kvc-json" in capsys.readouterr().err and not (tmp_path / "out").exists()


class TinyBackend(ReferenceBackend):
    name = "tiny"


class UnnamedBackend(ReferenceBackend):
    """Inherits ``reference``, the name of another registered target: keeps its spec."""


def test_a_backend_named_by_its_target_goes_by_its_registered_or_declared_name():
    by_target = registry.load("kvconform.backends_under_test.reference_backend:ReferenceBackend")
    assert (by_target.name, by_target.spec) == ("reference", "kvconform.backends_under_test.reference_backend:ReferenceBackend")
    assert registry.load(f"{__name__}:TinyBackend").name == "tiny"
    assert registry.load(f"{__name__}:UnnamedBackend").name == f"{__name__}:UnnamedBackend"
    assert registry.load("reference").name == registry.load("reference").spec == "reference"


def test_the_adapter_argument_table_names_the_parameters_of_each_op():
    """VENDOR_CI.md's table of the adapter's arguments against contract.py's signatures."""
    section = DOC.read_text().split("### The adapter's arguments")[1].split("\n## ")[0].split("\n### ")[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in section.splitlines() if line.startswith("| `")]
    documented: dict[str, set[str]] = {}
    for op, arguments, *_ in rows:
        documented.setdefault(op.strip("`"), set()).update(re.findall(r"`(\w+)`", arguments))
    ops = {name for name, member in vars(Backend).items() if inspect.isfunction(member) and name in
           ("allocate", "split", "write", "swap_out", "swap_in", "copy_blocks", "decode")}
    assert ops == set(documented) - {"every op"}
    for op in ops:
        parameters = set(inspect.signature(getattr(Backend, op)).parameters) - {"self", "spec"}
        hints = inspect.get_annotations(getattr(Backend, op))
        assert documented[op] <= parameters, (op, documented[op] - parameters)
        assert parameters - {"cache"} <= documented[op], (op, parameters - documented[op])
        assert set(hints) >= parameters, f"{op}: parameters without a type hint: {parameters - set(hints)}"
    assert not CONNECTOR_OPS & set(documented)
