"""Subprocesses that own tests read, started as soon as collection ends instead of when their
fixture first runs.

Some fixtures run a subprocess that waits on the disk more than on the CPU (the vLLM venv's
Python imports vLLM: ~30 s of wall for ~10 s of CPU on the 2-core CI machine). Started when
collection ends, it runs beside the tests before it; the fixture then only reads its result. A
job starts only when a test of a module that reads it was collected; a fixture whose job did not
start (a test selected some other way) starts it then.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import tempfile
from pathlib import Path


@dataclasses.dataclass
class Job:
    argv: list[str]
    cwd: Path
    env: dict
    readers: tuple[str, ...]  # the test modules (file names) that read it
    proc: subprocess.Popen | None = None
    files: tuple | None = None

    def start(self) -> None:
        if self.proc is None:
            self.files = (tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+"))
            self.proc = subprocess.Popen(self.argv, cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL,
                                         stdout=self.files[0], stderr=self.files[1], text=True)

    def result(self, timeout: float) -> subprocess.CompletedProcess:
        """As ``subprocess.run(argv, capture_output=True, text=True, timeout=timeout)``, the
        timeout counted from now."""
        self.start()
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        out, err = (self._read(f) for f in self.files)
        return subprocess.CompletedProcess(self.argv, code, out, err)

    @staticmethod
    def _read(file) -> str:
        file.seek(0)
        return file.read()


JOBS: dict[str, Job] = {}


def register(name: str, argv: list[str], *, cwd, env: dict | None = None, readers: tuple[str, ...]) -> None:
    JOBS.setdefault(name, Job(list(argv), Path(cwd), {**os.environ, **(env or {})}, readers))


def start_for(items) -> None:
    """Start every job that a collected test's module reads."""
    modules = {Path(str(item.path)).name for item in items}
    for job in JOBS.values():
        if modules & set(job.readers):
            job.start()


def result(name: str, timeout: float) -> subprocess.CompletedProcess:
    return JOBS[name].result(timeout)


def stop_all() -> None:
    """At the session's end: a job no test read (a run stopped early) does not outlive it."""
    for job in JOBS.values():
        if job.proc is not None and job.proc.poll() is None:
            job.proc.kill()
            job.proc.wait()
