"""Stage 4, measure: is a kernel right, and how fast is it. The fp32 reference, the validator,
the timing regime and its environment, torch SDPA as baseline, the crash-isolated GPU worker
and the one trial every measurement goes through. Imports `model`, `build` and `launch`."""
