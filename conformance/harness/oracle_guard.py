"""Oracle isolation: the code under test can change neither the oracle nor the inputs it is computed from.

Two guards, both installed by the plugin (``plugin/session.py``) and invisible to a check:

- **The oracle.** :func:`take` records, before any backend is imported, every function and class
  of the oracle packages (``kvconform.reference`` and the harness): the object each module and
  class attribute holds, each function's code, defaults and closure, the module-level dicts and
  lists. :func:`verify` compares with that record — after each backend's import, before each test
  and after each backend call — and on a change restores the pristine objects and raises
  :class:`OracleChanged` naming what changed and who ran just before (never an expected failure:
  ``plugin/verdict.py``). :func:`code_digest` hashes the oracle's code for certification, which
  also recomputes a canary set in a process that never imported a backend (``canary.py``).
- **The inputs.** :func:`guard_ops` wraps every public method of ``contract.Backend`` on a loaded
  backend: the backend receives copies of its inputs (same strides, same storage sharing, e.g. K
  and V rows of one ``qkv``), so the caller's tensors stay pristine for the reference whatever the
  backend does; after the call the copies must still equal them, else a
  :class:`~.assertions.ConformanceFailure` of clause OP-INPUTS-UNCHANGED names the argument and its
  first changed element. An argument named ``buffer`` or ending in ``cache`` is the backend's
  memory (written, or read by the op) and is handed over as it is; the arena comparisons check it.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import importlib
import inspect
import operator
import pkgutil
import types

import torch

ORACLE_PACKAGES = ("kvconform.reference", "kvconform.conformance.harness")
CLAUSE = "OP-INPUTS-UNCHANGED"
_MISSING = object()


class OracleChanged(Exception):
    """The reference or the harness changed while the suite ran: every verdict computed with it
    is void. Not an AssertionError: an error that no expectations entry can turn into a known failure."""


# ----------------------------------------------------------------------------- the oracle's record
@dataclasses.dataclass
class Pristine:
    """What the oracle was before any backend was imported."""

    attributes: list  # (owner: module or class, its __dict__, name, the object it held)
    functions: list  # (function, code, defaults, kwdefaults) of the oracle's own functions
    cells: list  # (function, cell, its contents) of those functions' closures
    data: list  # (module, name, container, a copy): module-level dicts, lists, sets
    modules: tuple[str, ...]

    def __post_init__(self):
        # ``intact`` runs around every backend call: identity checks mapped in C (~0.1 ms), the
        # per-item reasons only once something differs.
        self._lookups = ([space.get for _, space, _, _ in self.attributes], [n for _, _, n, _ in self.attributes], [v for *_, v in self.attributes])
        self._functions = [f for f, *_ in self.functions]
        self._parts = [(operator.attrgetter(a), [part[i] for part in self.functions]) for i, a in
                       ((1, "__code__"), (2, "__defaults__"), (3, "__kwdefaults__"))]
        self._cells = ([c for _, c, _ in self.cells], [v for _, _, v in self.cells])

    def intact(self) -> bool:
        same = functools.partial(map, operator.is_)
        getters, names, values = self._lookups
        return (all(same(map(operator.call, getters, names), values))
                and all(all(same(map(get, self._functions), parts)) for get, parts in self._parts)
                and all(same(map(_CONTENTS, self._cells[0]), self._cells[1]))
                and all(value == saved for _, _, value, saved in self.data))

    def changes(self) -> list[str]:
        """What differs from the record, one line each (empty: the oracle is intact)."""
        found = [f"{_label(owner, name)} was deleted" if namespace.get(name, _MISSING) is _MISSING else
                 f"{_label(owner, name)} was replaced ({_origin(namespace[name])})"
                 for owner, namespace, name, value in self.attributes if namespace.get(name, _MISSING) is not value]
        found += [f"{f.__module__}.{f.__qualname__}: {why}" for f, code, defaults, kwdefaults in self.functions
                  if (why := "its code was replaced (" + _origin(f.__code__) + ")" if f.__code__ is not code else
                      "its default arguments were replaced" if f.__defaults__ is not defaults or f.__kwdefaults__ is not kwdefaults else None)]
        found += [f"{f.__module__}.{f.__qualname__}: a variable of its closure was replaced" for f, cell, value in self.cells if _contents(cell) is not value]
        found += [f"{module.__name__}.{name} was modified in place" for module, name, value, saved in self.data if value != saved]
        return found

    def restore(self) -> None:
        """Put every recorded object back, so the rest of the run computes with the pristine oracle."""
        for owner, namespace, name, value in self.attributes:
            if namespace.get(name, _MISSING) is not value:
                setattr(owner, name, value)
        for f, code, defaults, kwdefaults in self.functions:
            f.__code__, f.__defaults__, f.__kwdefaults__ = code, defaults, kwdefaults
        for _, cell, value in self.cells:
            cell.cell_contents = value
        for _, _, value, saved in self.data:
            if value != saved:
                value.clear()
                value.update(saved) if isinstance(value, (dict, set)) else value.extend(saved)


_CONTENTS = operator.attrgetter("cell_contents")


def _contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # emptied
        return _MISSING


def _origin(obj) -> str:
    """Where a replacing object was defined, when it says."""
    code = getattr(obj, "__code__", obj if isinstance(obj, types.CodeType) else None)
    if isinstance(code, types.CodeType):
        return f"by code defined at {code.co_filename}:{code.co_firstlineno}"
    module = getattr(obj, "__module__", None)
    return f"by an object from module {module}" if module else f"by a {type(obj).__name__}"


def _label(owner, name: str) -> str:
    return f"{owner.__name__}.{name}" if isinstance(owner, types.ModuleType) else f"{owner.__module__}.{owner.__qualname__}.{name}"


def oracle_modules() -> list[types.ModuleType]:
    """Every module of the oracle packages, imported now (so none is first imported after a backend)."""
    found = []
    for package_name in ORACLE_PACKAGES:
        package = importlib.import_module(package_name)
        found.append(package)
        for info in pkgutil.iter_modules(package.__path__):
            found.append(importlib.import_module(f"{package_name}.{info.name}"))
    return found


def _functions_of(value) -> list[types.FunctionType]:
    """The Python functions a module or class attribute runs: itself, a method's, a property's
    accessors, an lru_cache's wrapped function."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        return [f for f in (value.fget, value.fset, value.fdel) if isinstance(f, types.FunctionType)]
    if isinstance(value, functools._lru_cache_wrapper):
        value = value.__wrapped__
    return [value] if isinstance(value, types.FunctionType) else []


SKIPPED_CLASS_ATTRIBUTES = frozenset({"__dict__", "__weakref__", "__doc__", "__annotations__", "__module__", "__qualname__"})


def _members(module: types.ModuleType):
    """(owner, name, value) of a module's attributes and of the classes it defines."""
    for name, value in list(vars(module).items()):
        if name.startswith("__") and name != "__getattr__" or (module.__name__, name) == (__name__, "_PRISTINE"):
            continue
        yield module, name, value
        if isinstance(value, type) and value.__module__ == module.__name__:
            yield from ((value, attr, member) for attr, member in list(vars(value).items()) if attr not in SKIPPED_CLASS_ATTRIBUTES)


def take() -> Pristine:
    """The oracle as it is now: call before any backend is imported."""
    modules = oracle_modules()
    attributes, functions, cells, data, seen = [], [], [], [], set()
    for module in modules:
        for owner, name, value in _members(module):
            attributes.append((owner, vars(owner), name, value))
            for f in _functions_of(value):
                if id(f) not in seen and f.__module__.startswith(ORACLE_PACKAGES):
                    seen.add(id(f))
                    functions.append((f, f.__code__, f.__defaults__, f.__kwdefaults__))
                    cells += [(f, cell, _contents(cell)) for cell in f.__closure__ or () if _contents(cell) is not _MISSING]
            if owner is module and isinstance(value, (dict, list, set)):
                data.append((module, name, value, copy.deepcopy(value)))
    return Pristine(attributes, functions, cells, data, tuple(m.__name__ for m in modules))


_PRISTINE: Pristine | None = None


def install() -> Pristine:
    """Record the oracle for :func:`verify` (once per process, before any backend is imported)."""
    global _PRISTINE
    if _PRISTINE is None:
        _PRISTINE = take()
    return _PRISTINE


def verify(who: str) -> None:
    """Raise :class:`OracleChanged` if the oracle differs from its record, after putting it back;
    ``who`` names what ran since the last verification. A no-op before :func:`install`."""
    if _PRISTINE is None:
        return
    if _PRISTINE.intact():
        return
    found = _PRISTINE.changes()
    _PRISTINE.restore()
    listed = "; ".join(found[:6]) + (f"; … {len(found) - 6} more" if len(found) > 6 else "")
    raise OracleChanged(f"the oracle changed during {who}: {listed} (restored; this result is void)")


def code_digest(modules: tuple[str, ...] | None = None) -> str:
    """sha256 over the code of every function of the oracle's modules, by qualified name: equal in
    every process that runs the same kvconform (certification compares it with a fresh process's)."""
    h = hashlib.sha256()
    names = modules or tuple(m.__name__ for m in oracle_modules())
    for name in sorted(names):
        module = importlib.import_module(name)
        for attr, value in sorted(vars(module).items()):
            members = [(attr, value)]
            if isinstance(value, type) and value.__module__ == name:
                members += [(f"{attr}.{k}", v) for k, v in sorted(vars(value).items()) if k not in SKIPPED_CLASS_ATTRIBUTES]
            for label, member in members:
                for f in _functions_of(member):
                    if f.__module__ == name:
                        h.update(f"{name}.{label}\0".encode())
                        _hash_code(h, f.__code__)
    return h.hexdigest()


def _hash_code(h, code: types.CodeType) -> None:
    h.update(code.co_code)
    h.update(repr((code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars)).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _hash_code(h, const)
        else:
            h.update(_canonical(const).encode())


def _canonical(const) -> str:
    """A constant's repr, the same in every process: a frozenset's repr follows the hash seed (Python
    3.12's frozen dataclasses compile their field names into one), so its members are sorted."""
    if isinstance(const, frozenset):
        return "frozenset({" + ", ".join(sorted(map(_canonical, const))) + "})"
    if isinstance(const, tuple):
        return "(" + ", ".join(map(_canonical, const)) + ",)"
    return repr(const)


# ----------------------------------------------------------------------------- the inputs
def op_names() -> tuple[str, ...]:
    """The methods guarded: every public function of the backend contract (ops added to it later included)."""
    from kvconform.backends_under_test.contract import Backend

    return tuple(name for name, value in vars(Backend).items() if not name.startswith("_") and isinstance(value, types.FunctionType))


def is_backend_memory(parameter: str) -> bool:
    """The cache (or the buffer a cache is built over): the op's output or what it reads in place, not an input."""
    return parameter == "buffer" or parameter.endswith("cache")


def guard_ops(backend) -> None:
    """Wrap ``backend``'s contract methods (on the instance) with the input and oracle guards."""
    from kvconform.backends_under_test.contract import DECLARATIONS, Backend

    for name in op_names():
        method = getattr(backend, name, None)
        if callable(method) and not isinstance(method, _GuardedOp):
            guarded = _GuardedDeclaration if name in DECLARATIONS else _GuardedOp
            setattr(backend, name, guarded(backend, name, method, inspect.signature(getattr(Backend, name))))


class _GuardedOp:
    """One contract method of one backend: copies in, comparison and oracle check after."""

    def __init__(self, backend, name: str, method, signature: inspect.Signature):
        self.backend, self.name, self.method = backend, name, method
        self.signature = signature
        functools.update_wrapper(self, method)

    def __call__(self, *args, **kwargs):
        try:
            bound = self.signature.bind(self.backend, *args, **kwargs)
        except TypeError:  # not the contract's call shape: the backend's own error says why
            return self.method(*args, **kwargs)
        arguments = dict(list(bound.arguments.items())[1:])  # without self
        memory = {k: v for k, v in arguments.items() if is_backend_memory(k)}
        handed = hand_over({k: v for k, v in arguments.items() if k not in memory}, memory)
        call = {**arguments, **handed.copies}
        positional = []
        for p in list(self.signature.parameters.values())[1:]:  # in order, up to the first one not given
            if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) or p.name not in call:
                break
            positional.append(call.pop(p.name))
        try:
            result = self.method(*positional, **call)
        finally:  # what ran since the last call is checked with it (a backend's property, a thread)
            verify(f"backend {getattr(self.backend, 'name', '?')}'s {self.name}() or just before it")
        handed.check_unchanged(self.backend, self.name)
        return result


class _GuardedDeclaration(_GuardedOp):
    """A declaration (``contract.DECLARATIONS``): asked through the guards once per arguments, its
    answer kept. The harness asks thousands of times a run (each parametrisation's cache dtype,
    each record's arch): answering from the backend each time ran the oracle check ~27 000 times
    in a run of the three reference backends, 40 % of its time."""

    def __init__(self, *args):
        super().__init__(*args)
        self.answers: dict = {}

    def __call__(self, *args, **kwargs):
        question = (args, tuple(sorted(kwargs.items())))
        try:
            known = question in self.answers
        except TypeError:  # an unhashable question is asked anew each time
            return super().__call__(*args, **kwargs)
        if known:
            return self.answers[question]
        answer = super().__call__(*args, **kwargs)
        try:
            hash(answer)  # a value (str, dtype, tuple of ints) is kept; a mutable one is asked for again
        except TypeError:
            return answer
        self.answers[question] = answer
        return answer


# ----------------------------------------------------------------------------- copies of the inputs
class _Handed:
    def __init__(self, originals: dict, copies: dict, storages: list):
        self.originals, self.copies, self.storages = originals, copies, storages

    def check_unchanged(self, backend, op: str) -> None:
        """The copies the backend received still equal the caller's inputs; else a ConformanceFailure."""
        for name, original in self.originals.items():
            what = _first_change(name, original, self.copies[name])
            if what:
                _fail(backend, op, name, what)
        for original, fresh, names in self.storages:
            if not torch.equal(original, fresh):
                byte = int((original != fresh).nonzero()[0])
                _fail(backend, op, names[0], f"the memory {' and '.join(names)} share changed outside them (byte {byte} of that storage)")


EXACT_OFFSETS = 16 << 20


def _copyable(t: torch.Tensor) -> bool:
    return t.device.type != "meta" and t.layout == torch.strided


def hand_over(arguments: dict, memory: dict | None = None) -> _Handed:
    """Copies of ``arguments`` for the backend: tensors keep their size, strides and storage offset,
    and tensors that share a storage share one copy of it; containers are copied through. A
    tensor in the storage of the backend's ``memory`` (a view of the cache) is handed as it is."""
    in_memory = {(t.untyped_storage().data_ptr(), t.device) for v in (memory or {}).values() for t in _tensors_in(v) if _copyable(t)}
    tensors = [t for value in arguments.values() for t in _tensors_in(value) if _copyable(t)]
    spans: dict = {}  # storage key -> [storage, lo byte, hi byte]
    for t in tensors:
        storage = t.untyped_storage()
        key = (storage.data_ptr(), t.device)
        if key in in_memory:
            continue
        start = t.storage_offset() * t.element_size()
        extent = sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1 if t.numel() else 0
        lo, hi = start, start + extent * t.element_size()
        entry = spans.setdefault(key, [storage, lo, hi])
        entry[1], entry[2] = min(entry[1], lo), max(entry[2], hi)
    copies = {}
    for key, (storage, lo, hi) in spans.items():
        # the copy keeps each view's storage offset; past EXACT_OFFSETS bytes only its alignment to
        # 64 bytes (what vectorised loads ask), not a copy of everything before it
        lo = 0 if storage.nbytes() <= EXACT_OFFSETS else lo - lo % 64
        raw = torch.empty(0, dtype=torch.uint8, device=key[1]).set_(storage, 0, (storage.nbytes(),), (1,))
        copies[key] = (raw[lo:hi], raw[lo:hi].clone(), lo)

    def copy_of(value):
        if isinstance(value, torch.Tensor):
            key = (value.untyped_storage().data_ptr(), value.device) if _copyable(value) else None
            if key not in copies:
                return value
            _, fresh, lo = copies[key]
            offset = value.storage_offset() * value.element_size() - lo
            return torch.empty(0, dtype=value.dtype, device=value.device).set_(
                fresh.untyped_storage(), offset // value.element_size(), value.size(), value.stride())
        if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
            return type(value)(copy_of(v) for v in value)
        if isinstance(value, dict) and type(value) is dict:
            return {k: copy_of(v) for k, v in value.items()}
        if dataclasses.is_dataclass(value) and not isinstance(value, type) and _tensors_in(value):
            return dataclasses.replace(value, **{f.name: copy_of(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init})
        return value

    handed = {name: copy_of(value) for name, value in arguments.items()}
    shared = []
    for key, (original_span, fresh, _) in copies.items():
        names = [n for n, v in arguments.items() if any(t.untyped_storage().data_ptr() == key[0] for t in _tensors_in(v))]
        shared.append((original_span, fresh, names))
    return _Handed(arguments, handed, shared)


def _tensors_in(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors_in(v)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [t for f in dataclasses.fields(value) for t in _tensors_in(getattr(value, f.name))]
    return []


def _first_change(name: str, original, given) -> str | None:
    """How ``given`` (what the backend got as ``name``) differs from ``original``; None when equal."""
    if isinstance(original, torch.Tensor):
        if given is original or not _copyable(original):
            return None
        if not isinstance(given, torch.Tensor):
            return f"{name} was replaced by a {type(given).__name__}"
        if given.shape != original.shape or given.stride() != original.stride() or given.dtype != original.dtype:
            return f"{name} was re-shaped in place: {tuple(original.shape)} {original.dtype} became {tuple(given.shape)} {given.dtype}"
        a, b = _bits(original), _bits(given)
        if torch.equal(a, b):
            return None
        index = tuple(int(i) for i in (a != b).nonzero()[0])
        return (f"{name}[{', '.join(map(str, index))}] changed: was {_value(original, index)} (bits {_hex(a[index])}), "
                f"now {_value(given, index)} (bits {_hex(b[index])})")
    if isinstance(original, (list, tuple, dict)) or dataclasses.is_dataclass(original):
        items = (original.items() if isinstance(original, dict) else
                 enumerate(original) if isinstance(original, (list, tuple)) else
                 ((f.name, getattr(original, f.name)) for f in dataclasses.fields(original)))
        for key, value in items:
            try:
                other = given[key] if isinstance(original, (list, tuple, dict)) else getattr(given, key)
            except (IndexError, KeyError):
                return f"{name}[{key!r}] was removed"
            what = _first_change(f"{name}[{key!r}]" if not dataclasses.is_dataclass(original) else f"{name}.{key}", value, other)
            if what:
                return what
        if isinstance(original, (list, tuple, dict)) and len(given) != len(original):
            return f"{name} changed length: {len(original)} became {len(given)}"
        return None
    return None


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu()
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.view(_BITS[t.element_size()]) if t.dim() else t.reshape(1).view(_BITS[t.element_size()])[0]


def _hex(bits: torch.Tensor) -> str:
    return f"{int(bits) & ((1 << (8 * bits.element_size())) - 1):0{2 * bits.element_size()}x}"


def _value(t: torch.Tensor, index: tuple) -> str:
    v = t.detach().cpu()[index]
    return repr(v.item()) if v.dtype.is_floating_point or v.dtype in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool) else "?"


def _fail(backend, op: str, argument: str, what: str):
    from .assertions import ConformanceFailure

    message = (f"{CLAUSE}: backend {getattr(backend, 'name', '?')}'s {op}() modified its input {argument}: {what} "
               "(an op must leave every input it is given unchanged; the reference computed from the caller's copy)")
    raise ConformanceFailure(message, {"property": "inputs", "clause": CLAUSE,
                                       "mismatches": [{"where": f"{op}({argument})", "expected": "unchanged", "actual": what}]})
