"""kvconform: conformance suite and executable spec for paged KV-cache layouts.

Everything lives under this one namespace: ``kvconform.reference`` (the spec),
``kvconform.backends_under_test`` (the backend contract and adapters),
``kvconform.conformance`` (the checks and their pytest plugin) and ``kvconform.reports``
(matrix, HTML and JUnit extras from results JSON).

The wheel nests those packages inside this directory. A source checkout keeps them at the
repository root (``reference/``, ``conformance/`` …), beside this directory; there the
package's search path also covers the root, so each file still has exactly one module name,
``kvconform.<package>.<module>``, whether kvconform is installed or run from the tree.
"""

import os as _os

_HERE = _os.path.dirname(_os.path.abspath(__file__))
_CHECKOUT = _os.path.dirname(_HERE)
if not _os.path.isdir(_os.path.join(_HERE, "reference")) and _os.path.isfile(_os.path.join(_CHECKOUT, "reference", "__init__.py")):
    __path__.append(_CHECKOUT)  # noqa: F821 - the package's own __path__
