"""Compile the portable kernels ahead of time for sm90, gfx942 (fnuz) and gfx950 (OCP fp8).

``python -m backends_under_test.triton_aot`` (the K/V kernels; ``… triton_aot latent``: the
latent-cache kernels) needs no GPU: Triton's bundled toolchain emits PTX / AMDGCN, which shows
the kernels use no CUDA-only construct. It must run with
``TRITON_INTERPRET`` unset (interpreted kernels cannot be compiled).
"""

from __future__ import annotations

import itertools
import os
import sys

TARGET_SPECS = {  # arch: (backend, arch id, warp size, fp8 pointer type name, fp8 tl dtype name)
    "sm90": ("cuda", 90, 32, "fp8e4nv", "float8e4nv"),
    "gfx942": ("hip", "gfx942", 64, "fp8e4b8", "float8e4b8"),
    "gfx950": ("hip", "gfx950", 64, "fp8e4nv", "float8e4nv"),
}
WRITE_ARGS = ("key_ptr", "value_ptr", "k_cache_ptr", "v_cache_ptr", "slot_ptr", "k_scale_ptr", "v_scale_ptr", "num_tokens",
              "key_stride_t", "key_stride_h", "value_stride_t", "value_stride_h",
              "k_block_stride", "k_slot_stride", "k_head_stride", "v_block_stride", "v_slot_stride", "v_head_stride")
COPY_ARGS = ("src_ptr", "dst_ptr", "src_ids_ptr", "dst_ids_ptr", "src_block_stride", "dst_block_stride", "src_region_stride", "dst_region_stride")
DECODE_ARGS = ("q_ptr", "out_ptr", "k_cache_ptr", "v_cache_ptr", "table_ptr", "seq_lens_ptr", "k_scale_ptr", "v_scale_ptr",
               "q_stride_s", "q_stride_h", "out_stride_s", "out_stride_h", "table_stride_s",
               "k_block_stride", "k_slot_stride", "k_head_stride", "v_block_stride", "v_slot_stride", "v_head_stride", "scale", "num_query_heads")


def _compile(fn, names, types, constexprs, target):
    import triton

    signature = dict(zip(names, types)) | {name: "constexpr" for name in constexprs}
    return triton.compile(triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs), target=target)


def _compiled_each(arch: str, target, jobs) -> list[tuple[str, str, str]]:
    """(arch, variant, "ok" or the error) of each (variant, kernel, arg names, types, constexprs) job."""
    results = []
    for name, fn, names, types, constexprs in jobs:
        try:
            _compile(fn, names, types, constexprs, target)
            results.append((arch, name, "ok"))
        except Exception as exc:  # noqa: BLE001 - reported per variant
            results.append((arch, name, f"{type(exc).__name__}: {str(exc).splitlines()[-1][:200]}"))
    return results


def compile_all() -> list[tuple[str, str, str]]:
    """(arch, kernel variant, "ok" or the error) for every kernel form on every target."""
    import triton.language as tl
    from triton.backends.compiler import GPUTarget

    from . import triton_kernels as K

    results = []
    forms = {"strided-packed": (K.STRIDED, True), "strided": (K.STRIDED, False), "x-tiles": (K.X_TILES, False), "legacy": (K.LEGACY, False)}
    for arch, (backend, arch_id, warp, fp8_ptr, fp8_name) in TARGET_SPECS.items():
        target, fp8 = GPUTarget(backend, arch_id, warp), getattr(tl, fp8_name)
        for (form_name, (form, packed)), quant in itertools.product(forms.items(), (False, True)):
            cache, source = (f"*{fp8_ptr}", "*bf16") if quant else ("*i16", "*i16")
            jobs = [(f"write-{form_name}-{'fp8' if quant else 'bitcopy'}", K.reshape_and_cache_kernel, WRITE_ARGS,
                     [source, source, cache, cache, "*i64", "*fp32", "*fp32"] + ["i64"] * 11,
                     dict(BLOCK_SIZE=16, NUM_HEADS=8, HEAD_SIZE=128, BLOCK_H=8, BLOCK_D=128, TOKENS=4, FORM=form, X=16 if quant else 8, QUANT=quant,
                          PER_HEAD_SCALE=True, PACKED=packed, OUT=fp8, MAN_BITS=3, MIN_NORMAL=2.0**-6, SUB_ULP=2.0**-9, MAX=448.0,
                          NAN_CODE=0x7F, SIGNED_NAN=True))]
            if quant and not packed:
                for heads in (1, 4):  # a GPU's one query head per program; the interpreter's several
                    jobs.append((f"decode-{form_name}-fp8-{heads}q", K.paged_decode_kernel, DECODE_ARGS,
                                 ["*bf16", "*bf16", f"*{fp8_ptr}", f"*{fp8_ptr}", "*i64", "*i64", "*fp32", "*fp32"] + ["i64"] * 11 + ["fp32", "i64"],
                                 dict(QUERIES_PER_KV=2, BLOCK_SIZE=16, HEAD_SIZE=128, BLOCK_D=128, FORM=form, X=16, DEQUANT=True, PER_HEAD_SCALE=heads > 1,
                                      BLOCK_HQ=heads)))
            if form_name == "strided-packed" and not quant:
                jobs.append(("copy-blocks", K.copy_blocks_kernel, COPY_ARGS, ["*i64", "*i64", "*i64", "*i64"] + ["i64"] * 4,
                             dict(REGION_LEN=1536, CHUNK=2048)))
            results += _compiled_each(arch, target, jobs)
    return results


def _latent_jobs(fp8_dtype, divisor: float) -> list[tuple]:
    """(variant, kernel, pointer types, constexprs) of every latent kernel form (triton_latent_kernels)."""
    import triton.language as tl

    from . import triton_latent_kernels as L

    fp8 = L.fp8_args(fp8_dtype)
    policy = dict(DIVISOR=divisor, FLOOR=1e-4, POW2=True)
    plain = dict(BLOCK_SIZE=64, RANK=512, ROPE=64, BLOCK_R=512, BLOCK_P=64)
    reader_types = {L.PLAIN16: "*i16", L.PLAIN_FP8: "*u8", L.DS_MLA: "*u8"}
    jobs = [("mla-write-bitcopy", L.concat_and_cache_mla_kernel, ["*i16", "*i16", "*i16", "*i64", "*fp32"], plain | dict(TOKENS=1, QUANT=False) | fp8),
            ("mla-write-fp8", L.concat_and_cache_mla_kernel, ["*bf16", "*bf16", "*u8", "*i64", "*fp32"], plain | dict(TOKENS=1, QUANT=True) | fp8),
            ("ds-mla-write", L.concat_and_cache_ds_mla_kernel, ["*bf16", "*i16", "*u8", "*i64"],
             dict(BLOCK_SIZE=64, TOKENS=1, HAS_ROPE=True) | policy | fp8)]
    for mx in (False, True):
        jobs.append((f"indexer-write-{'mx' if mx else 'float32'}", L.indexer_k_quant_and_cache_kernel, ["*bf16", "*u8", "*i64"],
                     dict(BLOCK_SIZE=64, GROUPS=1, BLOCK_G=1, TOKENS=1, MX=mx) | policy | fp8))
    jobs.append(("indexer-gather", L.gather_indexer_kernel, ["*u8", "*u8", "*u8", "*i32", "*i32", "*i64"],
                 dict(BLOCK_SIZE=64, HEAD_DIM=128, SCALE_BYTES=4, BLOCK_D=128, BLOCK_S=4, TOKENS=1)))
    for form, name in ((L.PLAIN16, "bf16"), (L.PLAIN_FP8, "fp8"), (L.DS_MLA, "ds-mla")):
        reader = dict(FORM=form, MODEL=tl.bfloat16, MODEL_BF16=True, CODE=fp8["OUT"])
        jobs.append((f"gather-{name}", L.gather_latent_kernel, [reader_types[form], "*i16", "*i32", "*i32", "*i64", "*fp32"],
                     plain | dict(TOKENS=1) | reader))
        jobs.append((f"decode-{name}", L.mla_decode_kernel, ["*bf16", "*i16", reader_types[form], "*i32", "*i32", "*fp32"],
                     plain | dict(BLOCK_HQ=1) | reader))
    return jobs


def compile_latent(archs=tuple(TARGET_SPECS)) -> list[tuple[str, str, str]]:
    """(arch, latent kernel variant, "ok" or the error) on each target of ``archs``, in the target's e4m3."""
    import torch
    from triton.backends.compiler import GPUTarget

    results = []
    for arch in archs:
        backend, arch_id, warp, _, _ = TARGET_SPECS[arch]
        target = GPUTarget(backend, arch_id, warp)
        e4m3, divisor = (torch.float8_e4m3fnuz, 224.0) if arch == "gfx942" else (torch.float8_e4m3fn, 448.0)
        jobs = []
        for name, fn, pointers, constexprs in _latent_jobs(e4m3, divisor):
            names = [p.name for p in fn.params if not p.is_constexpr]  # pointers first, then integer scalars
            jobs.append((name, fn, names, pointers + ["fp32" if n == "softmax_scale" else "i64" for n in names[len(pointers):]], constexprs))
        results += _compiled_each(arch, target, jobs)
    return results


def main(argv: list[str] | None = None) -> int:
    """``triton_aot``: the K/V kernels; ``triton_aot latent [ARCH…]``: the latent (MLA) kernels (every target, or those named)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("triton_aot: unset TRITON_INTERPRET (interpreted kernels cannot be compiled)", file=sys.stderr)
        return 2
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["latent"]:
        unknown = set(argv[1:]) - set(TARGET_SPECS)
        if unknown:
            print(f"triton_aot: unknown targets {sorted(unknown)}; known: {', '.join(TARGET_SPECS)}", file=sys.stderr)
            return 2
        results = compile_latent(argv[1:] or tuple(TARGET_SPECS))
    else:
        results = compile_all()
    for arch, name, status in results:
        print(f"{arch:7s} {name:28s} {status}")
    return 0 if all(status == "ok" for *_, status in results) else 1


if __name__ == "__main__":
    sys.exit(main())
