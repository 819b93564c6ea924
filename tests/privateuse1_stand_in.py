"""A torch device that is neither CUDA nor ROCm, for the worked example of docs/VENDOR_CI.md:
PrivateUse1 renamed ``acmenpu``, its memory host memory. A real PrivateUse1 backend is C++ (an
allocator and a device guard have no Python API), so this builds the smallest one with
``torch.utils.cpp_extension.load_inline``: the allocator, the guard, the factory, view and copy
kernels, and every other op through ATen's ``cpu_fallback`` (the op runs on CPU copies; mutated
arguments are copied back) — what an out-of-tree backend that lacks an op does.

Loaded as a pytest plugin (``-p tests.privateuse1_stand_in``) the device exists before the
suite checks ``--kvc-device acmenpu:0``, as a vendor's extension would with ``-p acme_npu``."""

import os
import subprocess
import sys
import types

import torch
from torch.utils.cpp_extension import is_ninja_available, load_inline

NAME = "acmenpu"
SOURCE = r"""
#include <torch/extension.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/NativeFunctions.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace {
constexpr c10::DispatchKeySet KEYS(c10::DispatchKey::PrivateUse1);

void release(void* data) { c10::free_cpu(data); }

struct HostMemory final : at::Allocator {
  at::DataPtr allocate(size_t nbytes) override {
    void* data = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    return {data, data, &release, at::Device(at::DeviceType::PrivateUse1, 0)};
  }
  at::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const final { default_copy_data(dest, src, count); }
};
HostMemory memory;

// The same bytes seen as a CPU tensor (device memory is host memory here).
at::Tensor on_host(const at::Tensor& t) {
  if (t.device().is_cpu()) return t;
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(at::kCPU));
}

at::Tensor empty(at::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout>, std::optional<at::Device>,
                 std::optional<bool>, std::optional<at::MemoryFormat> format) {
  return at::detail::empty_generic(size, &memory, KEYS, c10::dtype_or_default(dtype), format);
}
at::Tensor empty_strided(at::IntArrayRef size, at::IntArrayRef stride, std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                         std::optional<at::Device>, std::optional<bool>) {
  return at::detail::empty_strided_generic(size, stride, &memory, KEYS, c10::dtype_or_default(dtype));
}
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool) {
  on_host(dst).copy_(on_host(self));
  return dst;
}
at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}
void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) { at::native::cpu_fallback(op, stack); }
}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, c10::impl::NoOpDeviceGuardImpl<c10::DeviceType::PrivateUse1>);

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty);
  m.impl("empty_strided", empty_strided);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("resize_", at::native::resize_);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("set_.source_Storage", at::native::set_);
  m.impl("set_.source_Storage_storage_offset", at::native::set_storage_cpu_);
  m.impl("set_.source_Tensor", at::native::set_tensor_);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>()); }
"""


def ensure_ninja() -> None:
    """torch builds extensions with ninja; a machine without Debian's ninja-build gets the PyPI wheel
    (pinned) in this Python's environment, its scripts directory put on PATH."""
    if is_ninja_available():
        return
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "ninja==1.13.2"], check=True)
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")


def register() -> None:
    """Build the extension (cached by torch under ~/.cache/torch_extensions) and name the device."""
    ensure_ninja()
    load_inline(name="kvconform_privateuse1_stand_in", cpp_sources=SOURCE, with_cuda=False, is_python_module=False)
    torch.utils.rename_privateuse1_backend(NAME)
    module = types.ModuleType(NAME)
    module.is_available = lambda: True
    module.device_count = lambda: 1
    module.current_device = lambda: 0
    module._is_in_bad_fork = lambda: False
    torch._register_device_module(NAME, module)
    torch.utils.generate_methods_for_privateuse1_backend()


register()
