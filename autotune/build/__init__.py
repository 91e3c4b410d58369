"""Stage 2, build: a validated config to a cubin. Code generation, the CUDA toolchain, nvcc,
ptxas resource reports and the content-addressed cubin cache. Imports only `model`."""
