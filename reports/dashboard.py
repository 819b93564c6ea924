"""``kvconform dashboard RESULTS… -o DIR``: a static site of many runs (docs/DASHBOARD.md).

Inputs are results files and certified bundles (``dashboard_inputs``); the model is built once
(``dashboard_model``) and written as pages, browser data (``dashboard_pages``) and ``index.json``
(``dashboard_json``). The site is written into a fresh directory beside DIR and renamed into
place: a reader never sees half a site, and a failed build leaves DIR as it was. DIR is replaced
only when it is a kvconform dashboard already (its index.json says so) or empty.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

from kvconform.errors import InputError

from . import dashboard_json, dashboard_model
from .dashboard_inputs import load_runs
from .dashboard_pages import Writer, write_site


def build(paths: list[str], directory: str) -> dashboard_model.Dashboard:
    """Read every input, and write the site to ``directory`` (replacing an earlier dashboard)."""
    target = os.path.abspath(directory)
    _check_replaceable(target, directory)
    d = dashboard_model.build(load_runs(paths))
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    fresh = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.tmp-", dir=parent)
    try:
        os.chmod(fresh, 0o777 & ~_umask())  # mkdtemp makes it private; a site is read by whoever serves it
        writer = Writer(fresh)
        write_site(d, writer)
        writer.text("index.json", json.dumps(dashboard_json.index(d), indent=1, ensure_ascii=False) + "\n")
        _swap(fresh, target)
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise
    return d


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _check_replaceable(target: str, given: str) -> None:
    if not os.path.lexists(target):
        return
    if os.path.islink(target) or not os.path.isdir(target):
        raise InputError(f"{given}: exists and is not a directory; the dashboard is written to a directory of its own")
    if not os.listdir(target):
        return
    marker = os.path.join(target, "index.json")
    try:
        with open(marker, encoding="utf-8") as fh:
            schema = json.load(fh).get("schema")
    except (OSError, ValueError, AttributeError):
        schema = None
    if schema != dashboard_json.SCHEMA:
        raise InputError(f"{given}: a directory that is not a kvconform dashboard (no index.json of {dashboard_json.SCHEMA}); "
                         "the dashboard replaces its whole directory: give a new or empty one")


def _swap(fresh: str, target: str) -> None:
    """Put the fresh site at ``target``; an old one is renamed aside first, then removed."""
    if not os.path.exists(target):
        os.rename(fresh, target)
        return
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.old-", dir=os.path.dirname(target))
    os.rmdir(old)
    os.rename(target, old)
    os.rename(fresh, target)
    shutil.rmtree(old, ignore_errors=True)


def run(paths: list[str], directory: str) -> int:
    """The command: 0 when written, 2 (with the reason on stderr) for bad input."""
    try:
        d = build(paths, directory)
    except InputError as exc:
        print(f"kvconform dashboard: {exc}", file=sys.stderr)
        return 2
    print(f"kvconform: wrote {directory}/index.html ({len(d.runs)} runs, {len(d.entries)} backend runs, {len(d.series)} backends)")
    return 0
