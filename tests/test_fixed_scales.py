"""The fixed fp8 checks' scales tell every scale fault apart (#38 item 4): with k_scale 0.5 and
v_scale 2.0, "V quantised with k_scale" and "quantised as x·scale" wrote the same codes, and the
diagnosis named the first class it tried. ``fixed_scales()`` (0.5, 4.0) keeps the codes exact
(powers of two) and gives each scale fault its own codes on the fixed checks' data."""

import pytest
import torch

from kvconform import reference as R
from kvconform.conformance.harness.case import fixed_scales, token_rows

from .test_diagnosis import Twin, lines

FORMATS = [torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2]
N = 16
SLOTS = [2 * N, 3 * N - 1, 4 * N + 1, -1, 5 * N - 2]  # test_each_declared_cache_dtype_is_written_at_reference_offsets's


def codes(x, scale, dtype):
    return R.fp8.quantize(x, scale, dtype, head_dim=-1).view(torch.uint8)


def signatures(x, own, other, dtype) -> dict[str, torch.Tensor]:
    """The codes one side gets when written right and under each scale fault."""
    return {"right": codes(x, own, dtype), "scale-inverted": codes(x, 1 / own, dtype), "scale-swapped": codes(x, other, dtype)}


def all_differ(signed: dict[str, torch.Tensor]) -> bool:
    named = list(signed.items())
    return all(not torch.equal(a, b) for i, (_, a) in enumerate(named) for _, b in named[i + 1:])


@pytest.mark.parametrize("dtype", FORMATS, ids=str)
@pytest.mark.parametrize("seed", range(4))
def test_each_scale_fault_writes_codes_of_its_own_on_the_fixed_data(dtype, seed):
    twin = Twin(dtype=dtype, block_size=N, head_size=8)
    key, value = token_rows(twin.spec, len(SLOTS), seed)
    k_scale, v_scale = (float(s) for s in fixed_scales())
    assert all_differ(signatures(key, k_scale, v_scale, dtype)) and all_differ(signatures(value, v_scale, k_scale, dtype))


def test_the_reciprocal_scales_the_checks_used_made_two_faults_one():
    twin = Twin(dtype=torch.float8_e4m3fn, block_size=N, head_size=8)
    _, value = token_rows(twin.spec, len(SLOTS), 0)
    signed = signatures(value, 2.0, 0.5, torch.float8_e4m3fn)
    assert torch.equal(signed["scale-inverted"], signed["scale-swapped"])
    assert all(float(a) * float(b) != 1 for a in fixed_scales() for b in fixed_scales())  # no reciprocal pair, no scale 1


@pytest.mark.parametrize("dtype", FORMATS, ids=str)
@pytest.mark.parametrize("fault", ["scale-swapped", "scale-inverted"])
def test_the_diagnosis_names_the_scale_fault_of_the_fixed_write_alone(dtype, fault):
    twin = Twin(dtype=dtype, block_size=N, head_size=8)
    key, value = token_rows(twin.spec, len(SLOTS), 0)
    k_scale, v_scale = (float(s) for s in fixed_scales())
    wrong = {"scale-swapped": (k_scale, k_scale), "scale-inverted": (1 / k_scale, 1 / v_scale)}[fault]
    twin.write(SLOTS, key=key, value=value, k_scale=wrong[0], v_scale=wrong[1], into=("actual",))
    twin.write(SLOTS, key=key, value=value, k_scale=k_scale, v_scale=v_scale, into=("expected",))  # the write's inputs, as the check gives them
    found = twin.diagnose()
    assert found and {f.fault for f in found} == {fault}, lines(found)
