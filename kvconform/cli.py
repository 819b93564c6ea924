"""The ``kvconform`` command.

    kvconform test [--backend a,b] [--out DIR] [-- PYTEST ARGS]              (the installed suite in one pytest process)
    kvconform run --backend a,b,c [--kvc-timeout S] [-j N] [-- PYTEST ARGS]   (one process per backend)
    kvconform report html|merge|matrix …                                      (results JSON → reports)
    kvconform coverage [RUN.json …] [-o FILE]                                 (the coverage table; no runs: the built-ins')
    kvconform certify --backend a[,b] [--out DIR] [-- PYTEST ARGS]            (a certified run and its submission bundle)
    kvconform verify-submission BUNDLE [--rerun N] [--public-key PEM]         (re-check a submission bundle; rerun N of its tests here)
    kvconform sign-submission BUNDLE --key PEM                                (a detached Ed25519 signature over SHA256SUMS; kvconform[sign])
    kvconform compat PRODUCER.json CONSUMER.json                              (KV-connector handshake check)
    kvconform dashboard RESULTS… -o DIR                                       (a static site of many runs: grid, history, diffs, clauses)
    kvconform describe --backend NAME [--layout L] [--tp-size N] … [-o F]     (a backend's layout descriptors)
    kvconform backends [--all]                                                (the names --backend accepts)

``test``, ``run`` and ``certify`` start pytest in a scratch directory with kvconform's own empty
ini file, so the pytest setup of the directory they are typed in (its ``pyproject.toml``,
``pytest.ini``, ``conftest.py``) does not apply, and resolve every path given to them — after
``--`` too — against that directory (kvconform/isolation.py).
"""

from __future__ import annotations

import argparse
import json
import sys

DEFAULT_OUT = "kvconform-results"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    parser = argparse.ArgumentParser(prog="kvconform", description="kvconform: KV-cache layout conformance")
    sub = parser.add_subparsers(dest="command", required=True)
    report = sub.add_parser("report", help="render or merge result files")
    compat_parser = sub.add_parser("compat", help="may a producer's KV blocks land exactly in a consumer? (layout descriptors)")
    if chosen == "report":  # these two import torch: only when they run (`kvconform test` starts in a fraction of a second)
        from kvconform.reports import cli as report_cli

        report_cli.add_actions(report.add_subparsers(dest="action", required=True))
    if chosen == "compat":
        from kvconform import compat

        compat.add_arguments(compat_parser)
    describer = sub.add_parser("describe", help="write a backend's layout descriptors (one per TP rank) for 'kvconform compat'")
    describer.add_argument("--backend", required=True, help="a registered backend, vllm:NAME or pkg.module:attr")
    describer.add_argument("--layout", help="era:alias of one of its declared layouts (default: the first)")
    describer.add_argument("--kv-cache-dtype", default="auto")
    for flag, default in (("--tp-size", 1), ("--total-kv-heads", 8), ("--head-size", 128), ("--block-size", 16), ("--num-blocks", 1024), ("--num-layers", 1)):
        describer.add_argument(flag, type=int, default=default)
    describer.add_argument("--k-scale", type=float, default=1.0, help="checkpoint k_scale (doubled where the cache stores e4m3fnuz)")
    describer.add_argument("--v-scale", type=float, default=1.0)
    describer.add_argument("-o", "--output", help="file to write (default: stdout)")
    tester = sub.add_parser("test", help="run the installed suite in one pytest process, untouched by this directory's pytest setup")
    tester.add_argument("--backend", help="comma-separated backends (default: every built-in backend that loads here)")
    tester.add_argument("--out", default=DEFAULT_OUT, help="directory for results.json and results.html (default: %(default)s)")
    tester.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after '--': extra pytest arguments (e.g. --kvc-expectations FILE -n auto)")
    run = sub.add_parser("run", help="run each backend in its own process (fault isolation) and merge")
    run.add_argument("--backend", required=True, help="comma-separated backends")
    run.add_argument("--out", default=DEFAULT_OUT, help="directory for per-backend and merged results (default: %(default)s)")
    run.add_argument("--kvc-timeout", type=float, default=600.0, help="seconds per test before it is ended as timeout")
    run.add_argument("-j", "--jobs", type=int, default=1, help="backends run at once")
    run.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after '--': extra pytest arguments")
    coverage = sub.add_parser("coverage", help="the coverage table of result files; without files, of the built-in backends (docs/COVERAGE.md)")
    coverage.add_argument("runs", nargs="*", help="results JSON files (default: run the built-in backends as docs/COVERAGE.md says)")
    coverage.add_argument("-o", "--output", help="write the Markdown table here (default: stdout)")
    certify = sub.add_parser("certify", help="a certified run (every check, profile full, seed 0, no expectations) and its submission bundle")
    certify.add_argument("--backend", required=True, help="comma-separated backends")
    certify.add_argument("--out", default="kvconform-submission", help="the bundle directory")
    certify.add_argument("-n", "--workers", default="auto", help="pytest-xdist workers (default: auto)")
    certify.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after '--': extra pytest arguments (e.g. --kvc-standard e3)")
    for command in (tester, run, certify):
        command.add_argument("--caller-pytest-config", action="store_true",
                             help="run pytest in this directory with its pytest.ini/pyproject.toml and conftests "
                                  "(default: kvconform's own empty ini in a scratch directory)")
    dashboard = sub.add_parser("dashboard", help="a static site of many runs: backends × families, history across versions, diffs, spec clauses (docs/DASHBOARD.md)")
    dashboard.add_argument("inputs", nargs="+", metavar="RESULTS", help="results JSON files or certified bundle directories")
    dashboard.add_argument("-o", "--output", required=True, metavar="DIR", help="the site's directory (replaced as a whole when it is a dashboard)")
    listing = sub.add_parser("backends", help="the backend names --backend accepts")
    listing.add_argument("--all", action="store_true", help="also the seeded-fault backends (mutant:NAME, fault:NAME) kvconform tests itself with")
    verify = sub.add_parser("verify-submission", help="re-check a submission bundle against this kvconform's must-pass list")
    verify.add_argument("bundle")
    verify.add_argument("--rerun", type=int, default=0, metavar="N",
                        help="also run N randomly chosen recorded tests on this machine (recorded seed, backend, options) and compare outcomes")
    verify.add_argument("--public-key", metavar="PEM", help="the vendor's Ed25519 public key: the bundle's SHA256SUMS.sig must verify with it")
    signer = sub.add_parser("sign-submission", help="sign a submission bundle (detached Ed25519 signature over SHA256SUMS; needs kvconform[sign])")
    signer.add_argument("bundle")
    signer.add_argument("--key", required=True, metavar="PEM", help="Ed25519 private key (openssl genpkey -algorithm ed25519)")
    args = parser.parse_args(argv)
    if args.command == "report":
        return report_cli.run(args)
    if args.command == "coverage":
        return coverage_table(args.runs, args.output)
    if args.command == "certify":
        return certify_run(args.backend, args.out, args.workers, _after_dashes(args.pytest_args), own=not args.caller_pytest_config)
    if args.command == "verify-submission":
        return verify_submission(args.bundle, args.rerun, args.public_key)
    if args.command == "sign-submission":
        return sign_submission(args.bundle, args.key)
    if args.command == "compat":
        return compat.run(args)
    if args.command == "backends":
        return list_backends(args.all)
    if args.command == "describe":
        return describe(args)
    if args.command == "dashboard":
        from kvconform.reports import dashboard as dashboard_site

        return dashboard_site.run(args.inputs, args.output)
    from kvconform import isolation

    own = not args.caller_pytest_config
    if args.command == "test":
        backends = None if args.backend is None else [args.backend]
        return isolation.test(backends, _after_dashes(args.pytest_args), args.out, own=own)
    return isolation.run([b for b in args.backend.split(",") if b], _after_dashes(args.pytest_args), args.out, args.kvc_timeout, args.jobs, own=own)


def list_backends(everything: bool) -> int:
    from kvconform.backends_under_test import registry

    for name, target in sorted(registry.registered().items()):
        if everything or not name.startswith((registry.MUTANT_PREFIX, registry.FAULT_PREFIX)):
            print(f"{name:40} {target}")
    print("vllm:NAME[+shuffle]                      vLLM's own backends (NAME: an AttentionBackendEnum member)")
    return 0


def _after_dashes(extra: list[str]) -> list[str]:
    return extra[1:] if extra[:1] == ["--"] else extra


def coverage_table(runs: list[str], output: str | None) -> int:
    from kvconform.reports import cli as report_cli
    from kvconform.reports import coverage as C
    from kvconform.reports.matrix import SchemaError
    from kvconform.reports.results import write_atomically

    if runs:
        try:
            documents = [report_cli.load(path) for path in runs]
        except SchemaError as exc:
            print(f"kvconform: {exc}", file=sys.stderr)
            return 2
        table = C.build(documents)
        text = C.render_markdown(table, how=f"From {', '.join(runs)}.")
    else:
        from kvconform import builtin_coverage

        documents = builtin_coverage.run_all()
        table = C.build(documents)
        text = builtin_coverage.render(documents)
    if output:
        write_atomically(output, text)
        print(f"kvconform: wrote {output}")
    else:
        sys.stdout.write(text)
    for hole in table.holes:
        print(f"kvconform: HOLE {hole}", file=sys.stderr)
    return 1 if table.holes else 0


def certify_run(backend: str, out: str, workers: str, extra: list[str], own: bool = True) -> int:
    from kvconform import isolation

    status = isolation.certify(backend, out, workers, extra, DEFAULT_OUT, own=own)
    return status if status else verify_submission(out)


def sign_submission(bundle: str, key: str) -> int:
    from kvconform import signing

    try:
        path = signing.sign(bundle, key)
    except signing.SigningError as exc:
        print(f"kvconform sign-submission: {exc}", file=sys.stderr)
        return 2
    print(f"kvconform: signed {bundle} ({path})")
    return 0


def verify_submission(bundle: str, rerun: int = 0, public_key: str | None = None) -> int:
    """Re-check a bundle against this suite version: its files, what this suite collects for
    its backends (recomputed here), with ``rerun`` N of its tests executed here again, and with
    ``public_key`` its signature."""
    import os

    from kvconform import receiver
    from kvconform.conformance.harness import canary
    from kvconform.conformance.plugin.collection import must_pass
    from kvconform.reports import submission
    from kvconform.reports.terminal import printable

    if rerun < 0:
        print(f"kvconform verify-submission: --rerun {rerun}: expected a count of tests (0 or more)", file=sys.stderr)
        return 2
    given, bundle = bundle, os.path.abspath(bundle)  # the rerun runs in a scratch directory: a relative path means the caller's
    problems = submission.verify(bundle, must_pass(), collect=receiver.collect, canary=canary.bundle_problems)
    if public_key:
        from kvconform import signing

        try:
            problem = signing.signature_problem(bundle, public_key)
        except signing.SigningError as exc:
            print(f"kvconform verify-submission: --public-key: {exc}", file=sys.stderr)
            return 2
        problems += [problem] if problem else []
    lines = []
    if not problems and rerun:
        document = json.loads(open(os.path.join(bundle, "results.json"), encoding="utf-8").read())
        collected = receiver.collect(sorted(document["environment"]["backends"]), document["environment"]["standard"])
        try:
            lines, problems = receiver.rerun(bundle, document, rerun, collected)
        except receiver.ReceiverError as exc:
            problems = [f"--rerun: {exc}"]
    for line in lines:
        print(printable(f"  {line}"))
    if problems:
        print(printable(f"kvconform: REFUSED {given}: {len(problems)} problems"))
        for problem in problems:
            print(printable(f"  {problem}"))
        return 1
    checksum = submission.sha256_file(os.path.join(bundle, submission.SUMS))
    reran = f"; {len(lines)} recorded tests rerun here agree" if lines else ""
    print(printable(f"kvconform: ACCEPTED {given} (sha256 of {submission.SUMS} {checksum}{reran})"))
    return 0


def describe(args) -> int:
    from kvconform.backends_under_test.descriptors import describe_backend
    from kvconform.reports.results import write_atomically

    try:
        descriptors = describe_backend(args.backend, args.layout, kv_cache_dtype=args.kv_cache_dtype, num_blocks=args.num_blocks, block_size=args.block_size,
                                       total_kv_heads=args.total_kv_heads, head_size=args.head_size, num_layers=args.num_layers, tp_size=args.tp_size,
                                       k_scale=args.k_scale, v_scale=args.v_scale)
    except ValueError as exc:
        print(f"kvconform describe: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(descriptors if len(descriptors) > 1 else descriptors[0], indent=1) + "\n"
    if args.output:
        write_atomically(args.output, text)
    else:
        sys.stdout.write(text)
    return 0
