"""Where backends come from: built-ins, the ``kvconform.backends`` entry-point group, or
``pkg.module:attr``. Loading is lazy and per name, so one broken backend never hides the others.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
import re
import sys
import traceback
from pathlib import Path

from .contract import Backend, BackendOutOfScope, BackendUnavailable

BUILTIN = {
    "reference": "kvconform.backends_under_test.reference_backend:ReferenceBackend",
    "reference_kv_first": "kvconform.backends_under_test.reference_backend:kv_first_model",
    "reference_e3": "kvconform.backends_under_test.reference_backend:e3_model",
    "reference_gfx942": "kvconform.backends_under_test.reference_backend:Gfx942Reference",
    "reference_mla": "kvconform.backends_under_test.reference_mla:ReferenceMLA",
    "reference_quant": "kvconform.backends_under_test.reference_quant:ReferenceQuant",
    "triton_flash": "kvconform.backends_under_test.triton_backends:TritonFlash",
    "triton_unified": "kvconform.backends_under_test.triton_backends:TritonUnified",
    "triton_aiter": "kvconform.backends_under_test.triton_backends:TritonAiter",
    "triton_rocm_attn": "kvconform.backends_under_test.triton_backends:TritonRocmAttn",
    "triton_mla": "kvconform.backends_under_test.triton_latent:TritonMLA",
}
MUTANT_PREFIX = "mutant:"
FAULT_PREFIX = "fault:"
VLLM_PREFIX = "vllm:"  # vllm:NAME[+shuffle], NAME an AttentionBackendEnum member (vllm_backend.py)
AITER = {  # AMD AITER's Triton KV writer, one name per cache layout it takes (aiter_backend.py)
    "aiter:flash": "kvconform.backends_under_test.aiter_backend:AiterFlash",
    "aiter:asm": "kvconform.backends_under_test.aiter_backend:AiterAsm",
}
FLASHINFER = {  # FlashInfer's own paged-KV append and decode, one name per kv_layout (flashinfer_backend.py)
    "flashinfer:nhd": "kvconform.backends_under_test.flashinfer_backend:FlashInferNHD",
    "flashinfer:hnd": "kvconform.backends_under_test.flashinfer_backend:FlashInferHND",
}
# vLLM's compiled latent-cache kernels called directly (vllm_latent_ops.py): needs a CUDA GPU and the ops library.
VLLM_OPS = {"vllm_ops:mla": "kvconform.backends_under_test.vllm_latent_ops:VllmOpsMLA"}
# LMCache's connector transfer, one name per vLLM cache layout: ``lmcache:`` its CUDA kernel,
# ``lmcache_torch:`` its torch baseline of the same op (lmcache_connector.py).
LMCACHE = {f"{prefix}:{name}": f"kvconform.backends_under_test.lmcache_connector:LMCache{kernel}{cls}"
           for name, cls in (("NHD", "NHD"), ("HND", "HND"), ("kv_first_NHD", "KvFirstNHD"), ("kv_first_HND", "KvFirstHND"))
           for prefix, kernel in (("lmcache", ""), ("lmcache_torch", "Torch"))}


@dataclasses.dataclass
class Loaded:
    """A backend by name: the instance, or the error that stopped it loading."""

    name: str  # what test ids, results and expectations call it (registered_name)
    backend: Backend | None = None
    error: str | None = None
    unavailable: str | None = None  # its library is absent here: every check is not applicable
    out_of_scope: bool = False  # `unavailable` says why the backend keeps no cache kvconform specifies
    spec: str = ""  # what --kvc-backend said (a repro line names it this way); default: ``name``

    def __post_init__(self):
        self.spec = self.spec or self.name


def entry_points() -> dict[str, str]:
    return {ep.name: ep.value for ep in importlib.metadata.entry_points(group="kvconform.backends")}


def registered() -> dict[str, str]:
    """Every name ``--backend`` accepts (besides ``pkg.module:attr`` and ``mutant:NAME``)."""
    from .faults import FAULTS

    names = {**entry_points(), **BUILTIN, **AITER, **FLASHINFER, **VLLM_OPS, **LMCACHE}
    names.update({MUTANT_PREFIX + m: target for m, target in mutant_targets().items()})
    names.update({FAULT_PREFIX + f: f"kvconform.backends_under_test.faults:{cls.__name__}" for f, cls in FAULTS.items()})
    return names


# A mutant's declaration as the mutants package writes it: the decorator on the line above its class.
_MUTANT_DECLARATION = re.compile(r'^@mutant\("(\w+)"\)\nclass (\w+)\b', re.MULTILINE)


@functools.cache
def mutant_targets() -> dict[str, str]:
    """``NAME -> module:Class`` of every ``@mutant("NAME")`` declaration in the mutants package,
    read from its source: naming the backends imports no mutant, so a run that asks for none
    loads none (and a run of one loads its family's module only). A regular expression, not an
    AST: 2 ms for the package's 2,100 lines, ast.parse 65 ms; tests/test_mutants_package.py holds
    what it finds equal to what the decorators register."""
    return {name: f"{__package__}.mutants.{path.stem}:{cls}"
            for path in sorted(Path(__file__).with_name("mutants").glob("*.py"))
            for name, cls in _MUTANT_DECLARATION.findall(path.read_text())}


def default_names() -> list[str]:
    """Backends run when ``--backend`` is not given: the built-ins that are not mutants (nor
    libraries kvconform does not bring, such as AITER, FlashInfer and LMCache)."""
    return list(BUILTIN)


def is_known(name: str) -> bool:
    return name in registered() or name.startswith(VLLM_PREFIX) or ":" in name and not name.startswith((MUTANT_PREFIX, FAULT_PREFIX))


def _target(name: str) -> str:
    return registered().get(name, name)


def missing_module(name: str) -> str | None:
    """For a ``pkg.module:attr`` backend whose module this Python cannot find, a usage error's
    text naming the module and the fix (#38: four load errors and exit 1); None when it is found
    or is no such target (a module found whose import fails is the backend's load error)."""
    if name in registered() or name.startswith(VLLM_PREFIX) or ":" not in name:
        return None
    module = name.partition(":")[0]
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError as exc:  # a parent package is missing
        module, found = exc.name or module, False
    except Exception:  # noqa: BLE001 - importing a parent package failed: its load error says why
        return None
    if found:
        return None
    return (f"--kvc-backend {name}: no module named {module!r} on this Python's path ({sys.executable}). Install the package "
            f"that holds it into this environment (pip install PATH-OR-NAME), or add the directory that holds {module.split('.')[0]!r} "
            "to PYTHONPATH — `kvconform test` and `kvconform run` start pytest in a scratch directory, so the directory you type "
            "them in is not on the path")


_SHORT_NAME = re.compile(r"[A-Za-z_][\w\-]*")  # a name an adapter class may declare for itself


def registered_name(spec: str, backend: Backend) -> str:
    """The name a ``pkg.module:attr`` backend goes by, so that test ids and an expectations file
    written for ``acme`` also match a run of ``acme_kv.kvconform_adapter:AcmeBackend``: the name
    registered for that target (entry points, built-ins), else the short ``name`` the adapter
    declares unless another target is registered under it, else the spec itself."""
    names = registered()
    if spec in names or ":" not in spec:
        return spec
    aliases = sorted(n for n, target in names.items() if target == spec)
    declared = getattr(backend, "__dict__", {}).get("name") or vars(type(backend)).get("name")  # its own, not a base class's
    if aliases:
        return declared if declared in aliases else aliases[0]
    if isinstance(declared, str) and _SHORT_NAME.fullmatch(declared) and declared not in names:
        return declared
    return spec


def load(name: str) -> Loaded:
    """Import and instantiate; any failure becomes ``Loaded.error`` with the traceback tail.
    ``Loaded.name`` is the backend's :func:`registered_name`, ``Loaded.spec`` what was asked for."""
    try:
        if name.startswith(VLLM_PREFIX):
            from .vllm_backend import adapter_for_name

            backend = adapter_for_name(name[len(VLLM_PREFIX):])
            backend.name = name
            return Loaded(name, backend=backend)
        module_name, _, attr = _target(name).partition(":")
        if not attr:
            raise ValueError(f"backend {name!r}: expected a registered name or 'pkg.module:attr'")
        obj = getattr(importlib.import_module(module_name), attr)
        backend = obj() if callable(obj) and not isinstance(obj, Backend) else obj
        if not isinstance(backend, Backend):
            raise TypeError(f"backend {name!r}: {obj!r} is not a kvconform Backend")
        backend.name = registered_name(name, backend)
        return Loaded(backend.name, backend=backend, spec=name)
    except BackendUnavailable as exc:
        return Loaded(name, unavailable=str(exc), out_of_scope=isinstance(exc, BackendOutOfScope))
    except Exception as exc:  # noqa: BLE001 - reported per backend, the session goes on
        tail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return Loaded(name, error=tail)
