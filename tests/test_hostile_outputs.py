"""Nothing a user wrote is overwritten, and nothing but a regular file is read or replaced
(issue #26, items 6-9; docs/RELIABILITY.md "What is never overwritten").

The plugin checks every run's paths with one call, ``outputs.check_outputs(outputs, inputs)``
(conformance/plugin/run_plan.py ``outputs_and_inputs`` spells its arguments); these tests hold that function,
the results lock, the atomic writer and the expectations writer to their promises. To extend:
add a row to SAME_FILE or NOT_A_FILE.
"""

import json
import os
import stat
import threading

import pytest

from kvconform.conformance.plugin.outputs import OutputError, ResultsLock, check_outputs, settle_previous
from kvconform.errors import InputError
from kvconform.reports import expectations
from kvconform.reports.results import read_json, write_atomically

from .suite_runs import run_suite

FAILING_ID = "conformance/test_write.py::test_x[reference]"
BASELINE = f"bug-1 [ ] {FAILING_ID} [ Fail ]\n"




def refusal(outputs: dict, inputs: dict | None = None) -> str:
    """What check_outputs says about these paths ('' when it accepts them)."""
    try:
        check_outputs(outputs, inputs or {})
    except OutputError as exc:
        assert isinstance(exc, InputError)
        return str(exc)
    return ""


def finishes(call, seconds=10):
    """Run ``call`` in a thread; fail if it blocks (a FIFO opened for reading waits for a writer)."""
    outcome = {}

    def target():
        try:
            outcome["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{call} blocked (it opened something that is not a regular file)"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


# ----------------------------------------------------------------------------- 6: outputs differ from inputs and each other
SAME_FILE = [  # (outputs, inputs, the refusal; {t} is the test's directory)
    ({"--kvc-json": "{t}/b.txt"}, {"--kvc-expectations": "{t}/b.txt"}, "--kvc-expectations {t}/b.txt: is also --kvc-json"),
    ({"--kvc-json": "{t}/r.json", "--kvc-html": "{t}/r.json"}, {}, "--kvc-html {t}/r.json: is also --kvc-json"),
    ({"--kvc-json": "{t}/r.json", "--junitxml": "{t}/r.json"}, {}, "--junitxml {t}/r.json: is also --kvc-json"),
    ({"--kvc-html": "{t}/r.html", "--junitxml": "{t}/r.html"}, {}, "--junitxml {t}/r.html: is also --kvc-html"),
    ({"--kvc-export-digests": "{t}/d.json"}, {"--kvc-compare-digests": "{t}/d.json"}, "is also --kvc-export-digests"),
    ({"--kvc-update-expectations": "{t}/r.json", "--kvc-json": "{t}/r.json"}, {}, "is also --kvc-update-expectations"),
    ({"--kvc-json": "{t}/sub/../b.txt"}, {"--kvc-expectations": "{t}/b.txt"}, "is also --kvc-json"),
    ({"--kvc-json": "{t}/link-to-b.txt"}, {"--kvc-expectations": "{t}/b.txt"}, "is also --kvc-json"),  # resolved real paths
    ({"--kvc-json": "{t}/hard-b.txt"}, {"--kvc-expectations": "{t}/b.txt"}, "is also --kvc-json"),  # one file, two names
    ({"--kvc-json": "{t}/r.json", "--kvc-html": "{t}/r.json.lock"}, {}, "the lock of --kvc-json {t}/r.json.lock: is also --kvc-html"),
    ({"--kvc-json": "{t}/bundle/results.json", "--kvc-certify": "{t}/bundle"}, {}, "is inside the --kvc-certify directory"),
    ({"--kvc-certify": "{t}/bundle"}, {"--kvc-compare-digests": "{t}/bundle/digests.json"}, "is inside the --kvc-certify directory"),
]


@pytest.fixture
def files(tmp_path):
    (tmp_path / "b.txt").write_text(BASELINE)
    (tmp_path / "d.json").write_text("{}")
    (tmp_path / "sub").mkdir()
    (tmp_path / "link-to-b.txt").symlink_to(tmp_path / "b.txt")
    os.link(tmp_path / "b.txt", tmp_path / "hard-b.txt")
    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / "digests.json").write_text("{}")
    return tmp_path


@pytest.mark.parametrize("outputs, inputs, complaint", SAME_FILE, ids=[c[2][:40] for c in SAME_FILE])
def test_an_output_naming_an_input_or_another_output_is_refused(files, outputs, inputs, complaint):
    t = str(files)
    said = refusal({k: v.format(t=t) for k, v in outputs.items()}, {k: v.format(t=t) for k, v in inputs.items()})
    assert complaint.format(t=t) in said
    assert (files / "b.txt").read_text() == BASELINE


def test_the_expectations_file_may_be_updated_in_place(files):
    baseline = str(files / "b.txt")
    assert refusal({"--kvc-json": str(files / "r.json"), "--kvc-update-expectations": baseline}, {"--kvc-expectations": baseline}) == ""


def test_results_naming_the_expectations_file_stop_the_run_before_any_test(tmp_path):
    baseline = tmp_path / "b.txt"
    baseline.write_text(BASELINE)
    run = run_suite(tmp_path / "out", "--kvc-backend", "reference", "-m", "shape", "--kvc-expectations", str(baseline),
                    "--kvc-update-expectations", str(baseline), "--kvc-json", str(baseline))
    assert run.returncode == 4 and "is also --kvc-json" in run.proc.stderr, run.output
    assert baseline.read_text() == BASELINE


# ----------------------------------------------------------------------------- 7: outputs are regular files or absent
@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return str(path)


NOT_A_FILE = [  # (option, path; "{fifo}" is a named pipe), and what check_outputs says
    ("--kvc-json", "/dev/null", "is a character device, expected a regular file"),
    ("--kvc-json", "/dev/full", "is a character device"),
    ("--kvc-html", "{fifo}", "is a FIFO"),
    ("--junitxml", "/dev/full", "is a character device"),
    ("--kvc-export-digests", "{fifo}", "is a FIFO"),
    ("--kvc-update-expectations", "/dev/null", "is a character device"),
    ("--kvc-certify", "/dev/null", "is a character device, expected a directory"),
    ("--kvc-expectations", "/dev/zero", "is a character device, expected a regular file"),
    ("--kvc-compare-digests", "{fifo}", "is a FIFO"),
]


@pytest.mark.parametrize("option, path, complaint", NOT_A_FILE, ids=[f"{o}={p}" for o, p, _ in NOT_A_FILE])
def test_a_device_or_fifo_is_refused_never_read_or_replaced(fifo, option, path, complaint):
    path = path.format(fifo=fifo)
    before = os.stat(path)
    given = {option: path}
    inputs = {k: given.pop(k) for k in list(given) if k in ("--kvc-expectations", "--kvc-compare-digests")}
    said = finishes(lambda: refusal(given, inputs))
    assert said.startswith(f"{option} {path}: ") and complaint in said
    after = os.stat(path)
    assert (after.st_ino, stat.S_IFMT(after.st_mode)) == (before.st_ino, stat.S_IFMT(before.st_mode))


def test_the_writers_and_readers_refuse_what_is_not_a_regular_file(fifo, tmp_path):
    with pytest.raises(InputError, match="not a regular file"):
        write_atomically("/dev/null", "{}")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    for path in ("/dev/full", "/dev/zero", fifo):  # /dev/full reads without end
        with pytest.raises(InputError, match=f"{path}: not a regular file"):
            finishes(lambda: read_json(path, "kvconform results file", InputError))
    os.mkfifo(tmp_path / "r.previous.json")  # a results file set aside is read only when it is a regular file
    assert finishes(lambda: settle_previous(str(tmp_path / "r.json"), str(tmp_path / "r.html"), complete=False)) is None
    with pytest.raises(expectations.ExpectationsError, match="/dev/zero: not a regular file"):
        finishes(lambda: expectations.parse("/dev/zero"))


# ----------------------------------------------------------------------------- 8: the baseline is updated in place
def failing_record(nodeid=FAILING_ID, outcome="failed"):
    return {"nodeid": nodeid, "backend": "reference", "platform": "cpu", "arch": "", "outcome": outcome}


def test_update_expectations_writes_through_a_link_keeping_it_its_mode_and_crlf(tmp_path):
    target = tmp_path / "vendor" / "baseline.txt"
    target.parent.mkdir()
    target.write_bytes(b"# ACME\r\n" + BASELINE.replace("\n", "\r\n").encode())
    target.chmod(0o640)
    link = tmp_path / "exp.txt"
    link.symlink_to(target)
    new_id = "conformance/test_write.py::test_y[reference]"
    result = expectations.update_file(str(link), [failing_record(), failing_record(new_id)], [])
    assert result.written and result.added == 1
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert target.read_bytes() == (b"# ACME\r\n" + BASELINE.replace("\n", "\r\n").encode()
                                   + f"untriaged [ cpu ] {new_id} [ Fail ]\r\n".encode())


def test_an_unchanged_expectations_file_is_not_rewritten(tmp_path):
    baseline = tmp_path / "exp.txt"
    baseline.write_bytes(BASELINE.replace("\n", "\r\n").encode())
    before = baseline.stat()
    result = expectations.update_file(str(baseline), [failing_record()], [])  # still failing: kept as written
    after = baseline.stat()
    assert not result.written and result.kept_failing == 1
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert baseline.read_bytes() == BASELINE.replace("\n", "\r\n").encode()


def test_atomic_writes_keep_a_link_and_the_mode(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    target.chmod(0o600)
    link = tmp_path / "results.json"
    link.symlink_to(target)
    write_atomically(str(link), "new\r\n")
    assert link.is_symlink() and target.read_bytes() == b"new\r\n" and stat.S_IMODE(target.stat().st_mode) == 0o600


# ----------------------------------------------------------------------------- 9: the bundle directory and the lock
@pytest.mark.parametrize("where, complaint", [
    ("{t}/a-file/bundle", "--kvc-certify {t}/a-file/bundle: cannot write there"),
    ("{t}/a-file", "--kvc-certify {t}/a-file: is a regular file, expected a directory"),
    ("{t}/home", "--kvc-certify {t}/home: holds files that are not a submission bundle's (notes.txt)"),
])
def test_a_bundle_directory_that_cannot_hold_a_bundle_is_refused_up_front(tmp_path, where, complaint):
    (tmp_path / "a-file").write_text("")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("mine")
    assert complaint.format(t=tmp_path) in refusal({"--kvc-certify": where.format(t=tmp_path)})


def test_a_new_bundle_directory_is_probed_and_left_as_it_was(tmp_path):
    assert refusal({"--kvc-certify": str(tmp_path / "new" / "bundle")}) == ""
    assert not (tmp_path / "new").exists()


def test_an_unwritable_bundle_directory_stops_the_run_before_any_test(tmp_path):
    (tmp_path / "a-file").write_text("")
    run = run_suite(tmp_path / "out", "--kvc-backend", "reference", "--kvc-certify", str(tmp_path / "a-file" / "bundle"))
    assert run.returncode == 4 and "--kvc-certify" in run.proc.stderr and "cannot write there" in run.proc.stderr, run.output
    assert "INTERNALERROR" not in run.output and run.document is None


@pytest.mark.parametrize("make, complaint", [
    (lambda p: p.mkdir(), "is a directory, expected the JSON file a kvconform run writes"),
    (lambda p: os.mkfifo(p), "is a special file"),
    (lambda p: p.write_bytes(b"\xff\xfe not json"), "is not a kvconform lock"),
    (lambda p: p.write_text("[]"), "is not a kvconform lock"),
    (lambda p: p.write_text('{"pid": "1; rm", "host": "h"}'), "is not a kvconform lock"),
    (lambda p: p.write_text('{"pid": 0, "host": "h"}'), "is not a kvconform lock"),
], ids=["directory", "fifo", "not-utf8", "not-an-object", "pid-not-int", "pid-0"])
def test_a_lock_that_is_not_a_kvconform_lock_is_a_usage_error_naming_it(tmp_path, make, complaint):
    results = tmp_path / "results.json"
    make(tmp_path / "results.json.lock")
    with pytest.raises(OutputError) as refused:
        finishes(lambda: ResultsLock.acquire(str(results)))
    assert f"--kvc-json {results}: its lock {results}.lock" in str(refused.value) and complaint in str(refused.value)
    assert os.path.lexists(tmp_path / "results.json.lock")  # never taken over


def test_the_lock_is_never_seen_half_written(tmp_path):
    lock = ResultsLock.acquire(str(tmp_path / "results.json"))
    held = json.loads((tmp_path / "results.json.lock").read_text())
    assert held["pid"] == os.getpid() and not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    lock.release()
    assert not (tmp_path / "results.json.lock").exists()
