import os

# torch's OpenMP threads busy-wait by default; on 2 shared cores that makes it ~8x slower whenever anything
# else runs (the sandbox, llama.cpp). Must be set before torch is first imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
