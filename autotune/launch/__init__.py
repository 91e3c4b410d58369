"""Stage 3, launch: a built cubin to a kernel call on torch tensors. The pybind11 launcher
extension, the loaded kernel with its launch plan, and the tensor views (layouts, strides)
kernels are called with. Imports `model` and `build`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:  # resolved lazily at run time (__getattr__), typed for checkers here
    from .backward import CompiledBackward
    from .kernel import CompiledKernel
    from .launcher import launcher_path
    from .tensors import torch_dtype

# The names scripts and other callers may import from this stage; each is loaded on first
# use from its module, so importing one module of the stage does not load the others.
__all__ = [
    "CompiledBackward",
    "CompiledKernel",
    "launcher_path",
    "torch_dtype",
]

_LAZY: dict[str, tuple[str, str]] = {
    "CompiledBackward": ("backward", "CompiledBackward"),
    "CompiledKernel": ("kernel", "CompiledKernel"),
    "launcher_path": ("launcher", "launcher_path"),
    "torch_dtype": ("tensors", "torch_dtype"),
}


__getattr__ = lazy_getattr(__name__, _LAZY)
