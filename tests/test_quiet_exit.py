"""The verdict is the last thing a run prints (#38 item 9): Triton's exit-time leak report
(``nanobind: leaked 514 functions!`` and ~60 lines) never reaches the terminal or a CI log, and
everything else the run wrote to stderr still does."""

import os
import re
import subprocess
import sys
import textwrap

from kvconform.conformance.plugin.collection import suite_command

from .suite_runs import ROOT, run_suite

LEAK = "nanobind: leaked"
# A plugin of the run's own that writes to stderr as pytest ends: it must stay visible.
LOUD_PLUGIN = textwrap.dedent('''
    import sys

    def pytest_unconfigure(config):
        print("written to stderr as pytest ends", file=sys.stderr, flush=True)
''')
# What a suite process does, alone: Triton's interpreter runs a kernel, then gc.freeze() (session.py) keeps
# what it made for the rest of the process, and nanobind reports it at exit.
TRITON_AND_FREEZE = textwrap.dedent('''
    import gc, os
    os.environ["TRITON_INTERPRET"] = "1"
    import torch, triton, triton.language as tl

    @triton.jit
    def one(x):
        tl.store(x, 1.0)

    one[(1,)](torch.zeros(1))
    gc.freeze()
''')


def test_a_process_that_ran_a_triton_kernel_reports_leaks_at_exit_unless_told_not_to():
    """The control: without kvconform's exit handler the report is there."""
    proc = subprocess.run([sys.executable, "-c", TRITON_AND_FREEZE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and LEAK in proc.stderr, proc.stderr[-2000:]


def test_a_suite_run_on_a_triton_backend_ends_with_its_verdict_and_keeps_other_stderr(tmp_path):
    (tmp_path / "loud_plugin.py").write_text(LOUD_PLUGIN)
    cmd = suite_command("-p", "loud_plugin", "-q", "--kvc-backend", "triton_flash", "-m", "write",
                        "-k", "padding_slots_leave", "--kvc-json", str(tmp_path / "results.json"))
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": os.pathsep.join((str(tmp_path), str(ROOT)))})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "written to stderr as pytest ends" in proc.stderr
    assert LEAK not in proc.stderr, proc.stderr[-3000:]
    assert "kvconform verdict: " in proc.stdout


def test_a_failing_run_prints_its_verdict_after_pytests_short_summary_and_before_only_its_count(tmp_path):
    result = run_suite(tmp_path, "--kvc-backend", "mutant:write_padding_slots", "-m", "write", "-k", "padding_slots_leave")
    out = result.proc.stdout
    assert result.returncode == 1 and "short test summary info" in out, result.output
    after_pytests_summary = out[out.index("short test summary info"):]
    assert "kvconform verdict: " in after_pytests_summary, after_pytests_summary[-3000:]
    last_section = after_pytests_summary[after_pytests_summary.index("kvconform verdict: "):]
    assert "FAILED " not in last_section and re.fullmatch(r"=+ 3 failed, .* in [0-9.]+s =+", last_section.rstrip().splitlines()[-1]), last_section
