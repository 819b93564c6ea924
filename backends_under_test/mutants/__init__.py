"""Seeded-fault backends: a reference backend with one realistic kernel bug each, one module per
family of faults (``write``, ``split``, ``connector``, ``latent``, ``quant``, ...).

Every mutant names the check families (pytest markers) that must catch it (``catches``); the
suite's own tests run each one and fail the build if it survives. Faults are written the way a
real kernel gets them wrong — through the native tensor, with the wrong dim, stride or sign.

A mutant is registered by its own declaration, ``@mutant("NAME")`` on its class, NAME saying what
it breaks; ``--backend mutant:NAME`` runs it. The registry reads these declarations from the
source (``registry.mutant_targets``), so a run that asks for no mutant imports no module of this
package, and a run of one mutant imports only its family's module. ``MUTANTS`` (name -> class)
imports every family, for the tests that go through them all.
"""

from __future__ import annotations

import importlib
import pkgutil

_DECLARED: dict[str, type] = {}  # filled as the family modules are imported


def mutant(name: str):
    """Class decorator: register the class as ``mutant:NAME``."""

    def register(cls: type) -> type:
        if _DECLARED.setdefault(name, cls) is not cls:
            raise ValueError(f"mutant {name!r} declared twice: {_DECLARED[name].__qualname__} and {cls.__qualname__}")
        return cls

    return register


def __getattr__(attr: str):
    if attr != "MUTANTS":
        raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
    for family in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{family.name}")
    return dict(_DECLARED)
