"""On a GPU machine without a package registry: unpack the carry bundle (build_bundle.py) into a
temporary site directory and run the suite against every vLLM backend that imports there.

    python tests/vllm_gpu/run.py BUNDLE.tar.xz OUT_DIR [--jobs 8] [--only NAME,NAME] [--deadline S] [-- PYTEST ARGS]

For every ``AttentionBackendEnum`` member whose class imports (members.py), one pytest process
per standard it declares — ``--standard e3`` for vLLM 0.33.0 backends, ``e1`` as well where an
E1-era class declares it — quick profile, xdist ``-n 1`` so a crashed worker costs one test.
Members the adapter finds out of scope (non-MLA sparse, quantized-only caches) share one process;
MLA members run one each, as latent-cache backends (backends_under_test/vllm_mla.py).
Writes into OUT_DIR: ``members.json``, ``<backend>-<standard>.json`` / ``.log`` per run,
``results.json`` (all runs merged), ``verdicts.txt`` (per backend: pass / n/a / fail) and ``runs.txt``
(per process: exit status, complete or why not; the runner exits 1 when any run is incomplete). Run from the
repository root; kvconform need not be installed (the root conftest.py loads the plugin).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kvconform.conformance.plugin.collection import suite_command  # noqa: E402

PLUGIN = ("-p", "tests.vllm_gpu.plugin")
FAILING = ("failed", "error", "crashed", "timeout")


def unpack(bundle: Path, into: Path) -> Path:
    with tarfile.open(bundle) as tar:
        tar.extractall(into, filter="data")
    return into / "site"


def environment(site: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled Triton: the point of the run
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def list_members(env: dict, out: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "tests.vllm_gpu.members"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    (out / "members.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"run.py: listing vLLM's backends failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    members = json.loads(proc.stdout[proc.stdout.index("{"):])
    (out / "members.json").write_text(json.dumps(members, indent=1))
    return members


OUT_OF_SCOPE = "out-of-scope"


def runs_for(members: dict, only: set[str] | None) -> list[tuple[str, str]]:
    """(members, standard) runs: e3 always (the adapter's E3 path), e1 where declared; the
    members the adapter finds out of scope (non-MLA sparse, quantized-only: every check not
    applicable) share one run, since each is only loaded and reported."""
    runs, out_of_scope = [], []
    for name, facts in members.items():
        if not facts["imports"] or (only and name not in only):
            continue
        if facts.get("out_of_scope"):
            out_of_scope.append(name)
            continue
        runs.append((name, "e3"))
        if "e1" in facts.get("standards", ()):
            runs.append((name, "e1"))
    return runs + ([(",".join(out_of_scope), "e3")] if out_of_scope else [])


def run_one(names: str, standard: str, env: dict, out: Path, deadline: float, extra: list[str]) -> Path:
    stem = f"{OUT_OF_SCOPE if ',' in names else names}-{standard}"
    json_path, log_path = out / f"{stem}.json", out / f"{stem}.log"
    backends = ",".join(f"vllm:{name}" for name in names.split(","))
    cmd = suite_command(*PLUGIN, "-q", "--kvc-backend", backends, "--kvc-standard", standard, "--kvc-profile", "quick",
                        "--kvc-json", str(json_path), "--kvc-html", str(out / f"{stem}.html"), "-n", "1", "--max-worker-restart", "100", *extra)
    started = time.monotonic()
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        try:
            subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=max(30.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.write(f"\nrun.py: ended at the deadline after {time.monotonic() - started:.0f} s\n")
    print(f"{stem}: {time.monotonic() - started:.0f} s, results {'written' if json_path.exists() else 'MISSING'}", flush=True)
    return json_path


def verdicts(document: dict) -> str:
    """One line per backend: passed / not applicable / failing records (the matrix has too many
    columns for ~45 backends), then each failing check."""
    counts, failing = {}, {}
    for r in document["tests"]:
        kind = {"passed": "pass", "not-applicable": "n/a", "expected-failure": "xfail"}.get(r["outcome"], "fail" if r["outcome"] in FAILING else r["outcome"])
        counts.setdefault(r["backend"], {}).setdefault(kind, 0)
        counts[r["backend"]][kind] += 1
        if kind == "fail":
            failing.setdefault(r["backend"], set()).add(f"{r['check']} [{r['outcome']}]")
    lines = [f"{'backend':<36} {'pass':>5} {'n/a':>5} {'xfail':>5} {'fail':>5}"]
    for backend in sorted(counts):
        c = counts[backend]
        lines.append(f"{backend:<36} {c.get('pass', 0):>5} {c.get('n/a', 0):>5} {c.get('xfail', 0):>5} {c.get('fail', 0):>5}")
    for backend, checks in sorted(failing.items()):
        lines += [f"{backend} fails:"] + [f"  {check}" for check in sorted(checks)]
    return "\n".join(lines) + "\n"


def load(paths: list[Path]) -> dict[Path, dict | None]:
    """Each run's results document (None where the run wrote none)."""
    return {path: json.loads(path.read_text()) if path.exists() else None for path in paths}


def run_status(documents: dict[Path, dict | None]) -> tuple[str, bool]:
    """One line per pytest process (exit status, complete or why not), and whether every one
    completed: a run that ended early (an internal error, the deadline) hides the verdicts of the
    checks it never reached, whatever the merged counts say."""
    lines, complete = [], True
    for path, document in documents.items():
        if document is None:
            lines.append(f"{path.stem:<34} no results (see {path.stem}.log)")
            complete = False
            continue
        completion = document.get("completion") or {}
        ok = bool(completion.get("complete"))
        complete &= ok
        why = "" if ok else " — " + "; ".join(f"{r['kind']}: {r.get('what', '')}" for r in completion.get("reasons", []))
        lines.append(f"{path.stem:<34} exit {completion.get('exit_status')} {'complete' if ok else 'INCOMPLETE'}{why}")
    return "\n".join(lines) + "\n", complete


def merge(documents: list[dict], out: Path) -> None:
    from kvconform.reports.cli import merged_document

    if not documents:
        return
    merged = merged_document(documents)
    (out / "results.json").write_text(json.dumps(merged, indent=1, default=str))
    (out / "verdicts.txt").write_text(verdicts(merged))


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The runner's options, and the pytest arguments after ``--``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--jobs", type=int, default=8, help="pytest processes at once (default 8)")
    parser.add_argument("--only", default="", help="comma-separated AttentionBackendEnum members (default: every one that imports)")
    parser.add_argument("--deadline", type=float, default=480.0, help="seconds for all runs; a run still going then is ended")
    split = argv.index("--") if "--" in argv else len(argv)
    return parser.parse_args(argv[:split]), argv[split + 1:]


def main(argv=None) -> int:
    args, extra = parse(list(sys.argv[1:] if argv is None else argv))
    deadline = time.monotonic() + args.deadline
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vllm-gpu-") as tmp:
        env = environment(unpack(args.bundle.resolve(), Path(tmp)))
        members = list_members(env, args.out)
        pairs = runs_for(members, set(filter(None, args.only.split(","))) or None)
        print(f"{len(members)} AttentionBackendEnum members, {sum(m['imports'] for m in members.values())} import; {len(pairs)} runs", flush=True)
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            paths = list(pool.map(lambda pair: run_one(*pair, env, args.out, deadline, extra), pairs))
    documents = load(paths)
    merge([d for d in documents.values() if d is not None], args.out)
    status, complete = run_status(documents)
    (args.out / "runs.txt").write_text(status)
    print(status, end="", flush=True)
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
