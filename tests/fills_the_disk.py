"""A pytest plugin (``-p tests.fills_the_disk``): the disk the results go to fills up as the run
ends — every file created there from then on fails with ENOSPC, as on a full disk. The run must
still end in a verdict line that says its outputs could not be written (issue #37 item 10)."""

import errno
import os

import pytest


@pytest.hookimpl(tryfirst=True)  # before kvconform writes its outputs
def pytest_sessionfinish(session):
    full = os.path.dirname(os.path.abspath(session.config.getoption("kvc_json")))
    real_open = os.open

    def open_on_a_full_disk(path, flags, *args, **kwargs):
        if flags & os.O_CREAT and os.path.abspath(os.fspath(path)).startswith(full + os.sep):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    os.open = open_on_a_full_disk
