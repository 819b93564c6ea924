"""In-repo runs from a checkout: ``pytest conformance --backend NAME``.

The suite's plugin is ``kvconform.conformance.plugin.hooks``; an installed kvconform loads it through
its ``pytest11`` entry point. This shim loads it when that did not happen — the tree run
without installing kvconform (``PYTHONPATH=. pytest conformance …``), or with plugin autoload off.
"""

import sys

pytest_plugins = [] if "kvconform.conformance.plugin.hooks" in sys.modules else ["kvconform.conformance.plugin.hooks"]
