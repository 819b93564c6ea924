// Registers vLLM 0.33.0's paged KV-cache ops, and only those, under vLLM's own op namespace
// (torch.ops._C_cache_ops), so vllm._custom_ops and the attention backends call them unchanged.
// The schemas are copied verbatim from vLLM 0.33.0 csrc/torch_bindings.cpp:990-1017 and the
// CUDA implementations registered as at csrc/torch_bindings.cpp:1190-1192; the functions are
// vLLM's csrc/cache_kernels.cu, compiled from its sdist (build_cache_ops.py).
#include "ops.h"

#include <torch/csrc/stable/library.h>

STABLE_TORCH_LIBRARY_FRAGMENT(_C_cache_ops, ops) {
  ops.def(
      "swap_blocks(Tensor src, Tensor! dst,"
      "            int block_size_in_bytes, Tensor block_mapping) -> ()");

  ops.def(
      "reshape_and_cache(Tensor key, Tensor value,"
      "                  Tensor! key_cache, Tensor! value_cache,"
      "                  Tensor slot_mapping,"
      "                  str kv_cache_dtype,"
      "                  Tensor k_scale, Tensor v_scale,"
      "                  bool interleaved_v=False) -> ()");

  ops.def(
      "reshape_and_cache_flash(Tensor key, Tensor value,"
      "                        Tensor! key_cache,"
      "                        Tensor! value_cache,"
      "                        Tensor slot_mapping,"
      "                        str kv_cache_dtype,"
      "                        Tensor k_scale, Tensor v_scale) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(_C_cache_ops, CUDA, ops) {
  ops.impl("swap_blocks", TORCH_BOX(&swap_blocks));
  ops.impl("reshape_and_cache", TORCH_BOX(&reshape_and_cache));
  ops.impl("reshape_and_cache_flash", TORCH_BOX(&reshape_and_cache_flash));
}
