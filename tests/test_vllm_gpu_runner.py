"""tests/vllm_gpu/run.py's plan, checked on the CPU (the runs themselves need the H200): one run
per in-scope member and standard, the out-of-scope members together, pytest arguments after
``--`` passed through untouched."""

from __future__ import annotations

import json

from .vllm_gpu import run

MEMBERS = {
    "TRITON_ATTN": {"imports": True, "standards": ["e3"]},
    "OLD_STYLE": {"imports": True, "standards": ["e1", "e3"]},
    "FLASHMLA": {"imports": True, "standards": [], "out_of_scope": True},
    "TRITON_MLA": {"imports": True, "standards": [], "out_of_scope": True},
    "TORCH_SDPA": {"imports": False, "error": "must be registered"},
}


def test_each_member_that_imports_gets_a_run_per_standard_and_out_of_scope_ones_share_one():
    assert run.runs_for(MEMBERS, None) == [("TRITON_ATTN", "e3"), ("OLD_STYLE", "e3"), ("OLD_STYLE", "e1"), ("FLASHMLA,TRITON_MLA", "e3")]
    assert run.runs_for(MEMBERS, {"TRITON_ATTN"}) == [("TRITON_ATTN", "e3")]


def test_runner_options_stop_at_the_double_dash():
    args, extra = run.parse(["b.tar.xz", "out", "--jobs", "3", "--only", "A,B", "--", "--kvc-expectations", "f.txt", "-k", "write"])
    assert (args.jobs, args.only, str(args.out)) == (3, "A,B", "out")
    assert extra == ["--kvc-expectations", "f.txt", "-k", "write"]


def test_a_run_that_ended_early_makes_the_runner_fail_and_says_why(tmp_path):
    done, broken = tmp_path / "A-e3.json", tmp_path / "B-e3.json"
    done.write_text(json.dumps({"completion": {"complete": True, "exit_status": 0, "reasons": []}}))
    broken.write_text(json.dumps({"completion": {"complete": False, "exit_status": 3, "reasons": [{"kind": "internal-error", "what": "pytest INTERNALERROR"}]}}))
    status, complete = run.run_status(run.load([done, broken, tmp_path / "C-e3.json"]))
    assert not complete
    assert status.splitlines() == [f"{'A-e3':<34} exit 0 complete", f"{'B-e3':<34} exit 3 INCOMPLETE — internal-error: pytest INTERNALERROR",
                                   f"{'C-e3':<34} no results (see C-e3.log)"]
