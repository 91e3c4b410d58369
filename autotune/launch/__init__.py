"""Stage 3, launch: a built cubin to a kernel call on torch tensors. The pybind11 launcher
extension, the loaded kernel with its launch plan, and the tensor views (layouts, strides)
kernels are called with. Imports `model` and `build`."""
