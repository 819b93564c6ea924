"""The verdict is the last thing a run prints (#38 item 9): Triton's exit-time leak report
(``nanobind: leaked 514 functions!`` and ~60 lines) never reaches the terminal or a CI log, and
everything else the run wrote to stderr still does."""

import os
import subprocess
import sys
import textwrap

from kvconform.conformance.plugin.collection import suite_command

from .suite_runs import ROOT

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
