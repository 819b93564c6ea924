"""Run options a user did not give, taken from what the backends declare.

- ``--kvc-standard``: the layout standard every named backend that declares one declares
  (E1 when they share both); E1 when none declares one; a usage error when named backends
  disagree — one run checks one standard, and checking an E3-only backend against E1 would
  only make its standard checks not applicable. The default backend set (no ``--backend``) is
  the E1 models plus one E3 model and keeps E1.
- ``--kvc-timeout``: the longest ``Backend.default_timeout`` among the backends (vLLM's
  adapters set one: a kernel that writes out of bounds can hang a worker instead of failing).
"""

from __future__ import annotations

from kvconform.reference.errors import InputError

from .options import STANDARDS

FALLBACK_STANDARD = "e1"


class UsageError(InputError):
    """A default that cannot be chosen: the message says which option to give."""


def standard(given: str | None, backends: dict, explicit: bool) -> str:
    if given:
        return given
    declared = {name: loaded.backend.capabilities.standards for name, loaded in backends.items()
                if loaded.backend is not None and loaded.backend.capabilities.standards}
    if not declared or not explicit:
        return FALLBACK_STANDARD
    common = set(STANDARDS).intersection(*declared.values())
    if not common:
        listing = ", ".join(f"{name}: {'/'.join(sorted(s))}" for name, s in declared.items())
        raise UsageError(f"--kvc-standard not given and the backends declare different standards ({listing}); "
                         f"give --kvc-standard {' or '.join(STANDARDS)}, or run them separately")
    return min(common, key=STANDARDS.index)


def timeout(given: float | None, backends: dict) -> float | None:
    if given is not None:
        return given
    limits = [loaded.backend.default_timeout for loaded in backends.values() if loaded.backend is not None and loaded.backend.default_timeout]
    return max(limits) if limits else None
