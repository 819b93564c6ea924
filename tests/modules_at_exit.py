"""A pytest plugin for kvconform's own tests (``-p tests.modules_at_exit``): at the session's end,
writes the name of every module the run imported, one a line, to the file ``$KVC_MODULES_OUT``."""

import os
import sys
from pathlib import Path


def pytest_sessionfinish(session):
    Path(os.environ["KVC_MODULES_OUT"]).write_text("\n".join(sorted(sys.modules)) + "\n")
