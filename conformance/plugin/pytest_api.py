"""The pytest internals the plugin leans on, each behind one guarded helper with a fallback.

Supported pytest versions: 8.x and 9.x (tests/test_pytest_api.py pins what each helper relies on).
"""

from __future__ import annotations

import warnings

SUPPORTED_MAJOR = (8, 9)


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
