"""spogw-dagster: SPOGW workflow optimization (iterative offline GRPO with advantage-masked KL) on Dagster."""

import os as _os

# Set before anything imports torch: its OpenMP threads otherwise busy-wait, and on a few shared CPU cores
# (the sandbox and llama.cpp run beside training) that makes torch several times slower.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
