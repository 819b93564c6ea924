"""The fixtures the checks take. The sweep fixtures are parametrized at collection
(hooks.pytest_generate_tests, harness/sweeps.py): ``pytest --fixtures`` lists each with what it holds."""

from __future__ import annotations

import pytest

from .collection import PLANNED
from .session import RUN


@pytest.fixture
def case_param(request):
    """The (backend, layout) case of this test (harness/applicability.py ``CaseParam``)."""
    return request.param


@pytest.fixture
def case(request, case_param):
    """The check's backend, layout, device and seed, with the test's facts (harness/case.py)."""
    import torch

    from ..harness.case import Case

    run, planned = request.config.stash[RUN], request.node.stash[PLANNED]
    if case_param.loaded.backend is None:
        pytest.fail(f"backend {case_param.loaded.name} failed to load: {case_param.loaded.error}", pytrace=False)
    torch.manual_seed(run.options.seed)
    return Case(backend=case_param.loaded.backend, layout=case_param.layout, device=run.options.device, seed=run.options.seed,
                standard=run.options.standard, test_id=planned.test_id, repro=planned.repro, huge=run.options.huge)


@pytest.fixture
def cache_dtype(request):
    """One cache dtype the backend declares: ``auto`` with each model dtype, each fp8
    ``kv_cache_dtype`` with the first model dtype (harness/sweeps.py ``CacheDtype``)."""
    return request.param


@pytest.fixture
def fp8_cache_dtype(request):
    """One fp8 ``kv_cache_dtype`` the backend declares, with the storage dtype it means on the
    backend's platform (harness/sweeps.py ``CacheDtype``)."""
    return request.param


@pytest.fixture
def size_class(request):
    """One size class the backend's declared sizes reach on the layout: H = 1, H = 2, a head
    count, head size or block size that is not a power of two, three layers (harness/sweeps.py ``SizeClass``)."""
    return request.param


@pytest.fixture
def exported_digests(request):
    """The digest file given with --kvc-compare-digests (loaded and checked at start-up); in a
    certified run without one, the reference's digests of the backends' layouts."""
    return request.config.stash[RUN].compare


@pytest.fixture
def peers(request):
    """Every backend of this run as a consumer endpoint of the interop table (harness/interop.py)."""
    from ..harness import interop

    return interop.peer_endpoints(request.config.stash[RUN].backends)
