"""The quantised-cache checks compute their expected bytes for the backend's platform: a correct
writer on an MI300 (gfx942: e4m3fnuz codes, vLLM's bound 224) passes every one of them. Before
harness/quant.platform_of the reference encoded for the CPU (e4m3fn, 448), and this backend failed
14 of 78 quant checks while a gfx942 backend writing CUDA's bytes passed the write checks."""

from .suite_runs import run_suite


def test_a_correct_gfx942_per_token_head_writer_passes_every_quant_check(tmp_path):
    run = run_suite(tmp_path, "--backend", "tests.platform_backends:ReferenceQuantOnGfx942", "-k", "test_quant_ and fp8_per_token_head")
    outcomes = [r["outcome"] for r in run.records]
    assert run.returncode == 0 and outcomes.count("passed") >= 10 and set(outcomes) <= {"passed", "not-applicable"}, run.output
