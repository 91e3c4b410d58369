"""Stage 6, runtime: `attention()` for users. Dispatch from the store's best configs (or torch
SDPA where it is faster), the torch custom op, and the record of untuned problems. Imports
`model`, `build`, `launch`, `store` and SDPA from `measure`: never the tuner, the worker,
the timing code or Optuna."""
