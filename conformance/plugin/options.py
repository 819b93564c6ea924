"""The suite's command-line options, and the run options parsed from them.

Every option is registered as ``--kvc-NAME`` (dest ``kvc_NAME``), a spelling no other plugin
or conftest uses: an installed kvconform loads its plugin into every pytest of the
environment, and a vendor conftest that defines ``--device`` must keep working. The short
spellings the docs use (``--backend``, ``--seed`` …) are added as aliases once the initial
conftests have registered theirs, for each name still free (:func:`add_aliases`).
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings

from kvconform.errors import InputError


PROFILES = ("quick", "full")
STANDARDS = ("e1", "e3")
DEFAULT_JSON = "kvconform-results/results.json"
SEED_RANGE = (0, 2**32 - 1)  # data seeds are scaled (seed · 7919 + offset) inside torch's 64-bit generator range
# A backend spec: a registered name, mutant:NAME, fault:NAME, vllm:NAME[+shuffle] or pkg.module:attr.
_IDENT = r"[A-Za-z_]\w*"
BACKEND_SPEC = re.compile(rf"[\w.\-]+|(mutant|fault):\w+|vllm:\w+(\+shuffle)?|{_IDENT}(\.{_IDENT})*:{_IDENT}(\.{_IDENT})*")

# (name, short alias or None, argparse attributes)
OPTIONS = (
    ("backend", True, dict(action="append", default=[], metavar="NAME[,NAME…]",
                           help="backend(s) to check, comma-separated or repeated: a registered name, 'mutant:NAME', "
                                "'vllm:NAME[+shuffle]' or 'pkg.module:attr' (default: every built-in that loads here)")),
    ("device", True, dict(default=None, help="torch device for caches: cpu, cuda[:N], xpu, a PrivateUse1 backend's name … (default: cuda if available, else cpu)")),
    ("devices", False, dict(default=None, metavar="LIST",
                            help="devices for the checks that need several (comma list: cuda:0,cuda:1, or cpu,cpu for the CPU stand-in), "
                                 "and for the xdist workers (worker gwN on device N % count) (default: every GPU when --kvc-device is cuda "
                                 "and there are two or more, else none)")),
    ("seed", True, dict(type=int, default=0, help=f"seed for Hypothesis and all generated data, 0 to {SEED_RANGE[1]} (default 0)")),
    ("profile", True, dict(choices=PROFILES, default="quick", help="Hypothesis example budget: quick (6 examples, unshrunk) or full (80, shrunk)")),
    ("standard", True, dict(choices=STANDARDS, default=None, help="layout standard the shape/split checks hold backends to "
                                                                     "(default: the one the backends declare; e1 if none does)")),
    ("json", False, dict(default=DEFAULT_JSON, metavar="PATH", help="where to write per-test JSON results")),
    ("html", False, dict(default=None, metavar="PATH", help="where to write the HTML report (default: next to --kvc-json)")),
    ("huge", False, dict(action="store_true", help="allocate the >2^31-element probe caches in full on CPU and compare them whole "
                                                  "(needs ~10 GiB RAM; by default they are lazily mapped and only touched pages compared)")),
    ("timeout", False, dict(type=float, default=None, metavar="S",
                            help="seconds per test; a test past it ends its process (use with xdist -n, or `kvconform run`) and is reported timeout "
                                 "(default: none, or the backends' own default: vllm:* 300 s)")),
    ("export-digests", True, dict(default=None, metavar="FILE", help="write this run's equivalence digests (for --compare-digests on another machine)")),
    ("compare-digests", True, dict(default=None, metavar="FILE", help="compare this run's digests with a file written by --export-digests")),
    ("expectations", True, dict(default=None, metavar="FILE", help="vendor expectations file: known failures do not fail the run (docs/EXPECTATIONS.md)")),
    ("update-expectations", True, dict(default=None, metavar="FILE", help="write the current failures as the next expectations baseline")),
    ("fresh-workers", False, dict(action="store_true", help="start every xdist worker as a new Python (default on Linux: "
                                                          "fork each from one that has imported torch, docs/PERFORMANCE.md)")),
    ("certify", False, dict(default=None, metavar="DIR", help="a certified run: every check, profile full, seed 0, no expectations; "
                                                              "writes a submission bundle to DIR when every outcome is passed or not applicable by declaration")),
)


def dest(name: str) -> str:
    return "kvc_" + name.replace("-", "_")


def add_options(parser) -> None:
    group = parser.getgroup("kvconform", "kvconform conformance suite (pytest --pyargs kvconform.conformance)")
    for name, _, attrs in OPTIONS:
        group.addoption(f"--kvc-{name}", dest=dest(name), **attrs)


def add_aliases(parser) -> list[str]:
    """Register ``--NAME`` for every option with a short spelling that no one else took;
    returns the spellings left to their owners (use ``--kvc-NAME`` for those)."""
    taken = option_names_taken(parser)
    group = parser.getgroup("kvconform")
    skipped = []
    for name, aliased, attrs in OPTIONS:
        if not aliased:
            continue
        if taken is None or f"--{name}" in taken:
            skipped.append(f"--{name}")
            continue
        group.addoption(f"--{name}", dest=dest(name), **{**attrs, "help": f"same as --kvc-{name}"})
    return skipped


def given(config) -> list[str]:
    """The kvconform options this invocation set to something other than their defaults."""
    return [f"--kvc-{name}" for name, _, attrs in OPTIONS if config.getoption(dest(name)) != attrs.get("default", False)]


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """What one run of the suite was asked for (read once from the pytest config)."""

    backends: tuple[str, ...]
    device: str
    seed: int
    profile: str
    standard: str
    json_path: str
    html_path: str | None
    huge: bool
    timeout: float | None
    export_digests: str | None
    compare_digests: str | None
    expectations: str | None
    update_expectations: str | None
    certify: str | None = None
    devices: tuple[str, ...] = ()  # --kvc-devices, or every GPU of a cuda run with several (session.start)

    @classmethod
    def from_config(cls, config, default_device: str) -> "RunOptions":
        get = lambda name: config.getoption(dest(name))  # noqa: E731
        names = tuple(dict.fromkeys(n.strip() for value in get("backend") for n in value.split(",") if n.strip()))
        if get("backend") and not names:  # an unset $BACKEND in a CI script must not run every built-in
            raise OptionError(f"--kvc-backend {' '.join(repr(v) for v in get('backend'))}: names no backend; expected a registered name, "
                              "'mutant:NAME', 'vllm:NAME[+shuffle]' or 'pkg.module:attr' (leave the option out to run every built-in)")
        return cls(
            backends=names, device=get("device") or default_device, seed=get("seed"), profile=get("profile"),
            standard=get("standard"), json_path=get("json"), html_path=get("html"), huge=get("huge"), timeout=get("timeout"),
            export_digests=get("export-digests"), compare_digests=get("compare-digests"),
            expectations=get("expectations"), update_expectations=get("update-expectations"), certify=get("certify"),
            devices=device_list(get("devices")),
        )

    def cli_args(self) -> list[str]:
        """The options that reproduce this run's seed, profile, standard and device (canonical
        spellings: a repro line must mean the same inside any vendor repository)."""
        devices = ["--kvc-devices", ",".join(self.devices)] if self.devices else []
        return ["--kvc-seed", str(self.seed), "--kvc-profile", self.profile, "--kvc-standard", self.standard, "--kvc-device", self.device, *devices]


class OptionError(InputError):
    """A kvconform option that cannot be used as given; the message names it and what was expected."""


def device_list(value: str | None) -> tuple[str, ...]:
    """``--kvc-devices cuda:0,cuda:1`` → ``("cuda:0", "cuda:1")``; a device may repeat (``cpu,cpu``)."""
    if value is None:
        return ()
    devices = tuple(d.strip() for d in value.split(","))
    if not all(devices):
        raise OptionError(f"--kvc-devices {value!r}: an empty entry; expected a comma list of devices, e.g. cuda:0,cuda:1 or cpu,cpu")
    return devices


def validate(options: RunOptions) -> None:
    """Check every option but the device before the first test, without touching the machine
    (the device: :func:`check_device`; the output paths: outputs.py)."""
    malformed = [name for name in options.backends if not BACKEND_SPEC.fullmatch(name)]
    if malformed:
        raise OptionError(
            f"--kvc-backend: malformed backend spec(s) {', '.join(repr(n) for n in malformed)}; expected a registered name, "
            "'mutant:NAME', 'fault:NAME', 'vllm:NAME[+shuffle]' or 'pkg.module:attr' (Python identifiers)"
        )
    low, high = SEED_RANGE
    if not low <= options.seed <= high:
        raise OptionError(f"--kvc-seed {options.seed}: expected an integer from {low} to {high}")
    if options.timeout is not None and not (options.timeout > 0 and math.isfinite(options.timeout)):
        raise OptionError(f"--kvc-timeout {options.timeout}: expected a positive number of seconds")


ANY_DEVICE = "a device torch allocates on here: cpu, cuda[:N], xpu[:N], or a PrivateUse1 backend's name[:N] (docs/VENDOR_CI.md §1)"


def check_device(device: str, option: str = "--kvc-device") -> None:
    """Any device torch knows, if it exists here: a cache is allocated on it once, up front."""
    import torch  # not at the top: this module loads in every pytest of the environment (hooks.py says why)

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise OptionError(f"{option} {device!r}: not a device name ({exc}); expected {ANY_DEVICE}") from exc
    if parsed.type == "meta":
        raise OptionError(f"{option} {device}: a meta tensor holds no bytes; expected {ANY_DEVICE}")
    try:
        torch.empty(1, device=parsed)
    except Exception as exc:  # noqa: BLE001 - torch raises AssertionError, RuntimeError … depending on the build
        here = "cpu" + (f", cuda:0 … cuda:{torch.cuda.device_count() - 1}" if torch.cuda.is_available() else "")
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise OptionError(f"{option} {device}: not available on this machine ({reason}); devices here: {here}") from exc


# ----------------------------------------------------------------------------- pytest internals
# Supported pytest: 8.x and 9.x (tests/test_plugin_surface.py pins what this relies on).
SUPPORTED_MAJOR = (8, 9)


def runs_no_tests(config) -> bool:
    """``--collect-only``, ``--fixtures``, ``--fixtures-per-test``: a session that shows, not runs."""
    option = config.option
    return bool(option.collectonly or getattr(option, "showfixtures", False) or getattr(option, "show_fixtures_per_test", False))


def option_names_taken(parser) -> set[str] | None:
    """Every option spelling already registered (by pytest, plugins, conftests), or None when
    this pytest keeps them where the helper cannot see (then no short alias is added: the
    ``--kvc-`` spellings always work)."""
    groups = getattr(parser, "_groups", None)
    if groups is None:
        warnings.warn("kvconform: cannot list this pytest's options; only --kvc-* spellings are registered", stacklevel=2)
        return None
    anonymous = getattr(parser, "_anonymous", None)
    options = [option for group in [*groups, *([anonymous] if anonymous is not None else [])] for option in group.options]
    return {name for option in options for name in option.names()}
