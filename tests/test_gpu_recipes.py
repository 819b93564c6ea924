"""The GPU recipes (tests/real_kernels_gpu) run in CI as far as a CPU machine can (#38 item 11):
every script parses, none hands ``tail`` an obsolete bare count (``tail -5 a b c`` is "option used
in invalid context"), and prepare.sh's LMCache line — run as written — fetches the pinned sdist
by URL with its sha256, which extracts as lmcache_suite.sh extracts it."""

import hashlib
import os
import re
import subprocess
import sys
import tarfile

import pytest

from .real_kernels_gpu import lmcache_sdist
from .suite_runs import ROOT

RECIPES = ROOT / "tests" / "real_kernels_gpu"
SCRIPTS = sorted(RECIPES.glob("*.sh")) + sorted((ROOT / "tests" / "vllm_gpu").glob("*.sh"))


def test_there_are_recipe_scripts_to_check():
    assert {"prepare.sh", "run.sh", "lmcache_suite.sh"} <= {s.name for s in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.name)
def test_every_recipe_script_parses(script):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.name)
def test_no_recipe_gives_tail_a_bare_count(script):
    bare = [f"{script.name}:{n}: {line.strip()}" for n, line in enumerate(script.read_text().splitlines(), 1) if re.search(r"\btail -\d", line)]
    assert not bare, "tail -N is obsolete syntax; with several files it fails: write tail -n N\n" + "\n".join(bare)


def test_prepare_fetches_the_lmcache_sdist_the_cpu_tests_pin(tmp_path):
    fetching = [line for line in (RECIPES / "prepare.sh").read_text().splitlines()  # the line that fetches LMCache's sdist
                if re.search(r"lmcache(_sdist|==)", line) and not line.lstrip().startswith("#")]
    assert len(fetching) == 1, fetching
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", f'py={sys.executable}; carry={tmp_path}\n{fetching[0]}'],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 and "failed" in proc.stderr and os.environ.get("KVCONFORM_REQUIRE_LMCACHE") != "1":
        pytest.skip(f"no package registry here: {proc.stderr.strip()[-300:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    sdist = tmp_path / lmcache_sdist.NAME
    assert hashlib.sha256(sdist.read_bytes()).hexdigest() == lmcache_sdist.SHA256
    with tarfile.open(sdist) as tar:  # lmcache_suite.sh: tar -xzf SDIST -C WORK; tree=WORK/lmcache-0.5.6; setup.py build_ext there
        assert "lmcache-0.5.6/setup.py" in tar.getnames()
