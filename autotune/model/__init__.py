"""Stage 1, model: what is tuned and for what. Kernel configs and their validation against a
family's search space, the attention problem, compile targets, shape sets and the occupancy
arithmetic. Pure Python: no torch, no nvcc, no database."""
