"""Which computation path wins on which device, from measurements we recorded (pure; no torch import).

Which number type the generator computes in (`dtype: auto`) is chosen here too, from a recorded measurement
(`BF16_MEASURED`, `dtype_for`); unlike the paths, the two types do not give the same numbers.

Two paths compute the same numbers in two ways, and which one is faster depends on the device:

- training (`TrainConfig.shared_prompt`): each distinct prompt of a micro-batch runs once and its KV cache is
  indexed out to its rows (shared), or every row runs its own prompt again (per-row, the reference path);
- sampling (`TransformersSampler(prefix_sharing=...)`): each distinct prompt is prefilled once and our own loop
  decodes its rows (prefix-shared), or one `model.generate` per batch prefills every row (plain).

The training paths give the same losses, gradients and log-probs up to float rounding
(tests/test_trainer_shared_prompt.py); the sampling paths the same distribution and log-prob convention, but
other samples for a seed (another random stream: tests/test_sampling_prefix.py). A setting of None takes the path this table says is faster on the device;
True or False forces one. A device type nobody measured gets the plain (reference) paths.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MEASURED", "PathChoice", "paths_for", "shared_prompt_for", "prefix_sharing_for", "cpu_features",
           "BF16_MEASURED", "DtypeChoice", "dtype_for"]


@dataclass(frozen=True)
class PathChoice:
    """Speed of the shared path over the plain one (> 1: shared is faster), with where it was measured."""

    train_ratio: float  # shared-prompt training / per-row training, same rows and steps
    sample_ratio: float  # prefix-shared sampling / model.generate, tokens per second
    source: str

    @property
    def shared_prompt(self) -> bool:
        return self.train_ratio > 1.0

    @property
    def prefix_sharing(self) -> bool:
        return self.sample_ratio > 1.0


MEASURED: dict[str, PathChoice] = {
    # 2 CPU cores, SmolLM2-135M: bench/train_throughput.py 2.96x (2026-12-04), bench/sampling_throughput.py
    # 1.72x (2026-12-04; 2.64x on 2026-12-01 with the same sampler code)
    "cpu": PathChoice(train_ratio=2.96, sample_ratio=1.72, source="2 CPU cores, SmolLM2-135M, 2026-12-04"),
    # one H200, torch 2.11 + CUDA 13, random-weight Qwen2.5-0.5B shape in bf16, warm, alternating: training
    # 8 prompts x 16 rows 0.76x (0.72x with cuDNN SDPA off); sampling 8 prompts x 16, 256 tokens 0.84x (7B
    # shape 0.87x). The shared paths lose there until they are made faster: the plain paths are the default.
    "cuda": PathChoice(train_ratio=0.76, sample_ratio=0.84, source="NVIDIA H200, Qwen2.5-0.5B shape, bf16"),
}


def paths_for(device_type: str) -> PathChoice | None:
    """The recorded measurement for a torch device type ("cpu", "cuda", ...), or None when none was made."""
    return MEASURED.get(str(device_type).split(":")[0])


def shared_prompt_for(device_type: str, setting: bool | None = None) -> bool:
    """Whether training runs each distinct prompt once: `setting` when given, else the faster path measured on
    this device type, else the per-row reference path (False)."""
    if setting is not None:
        return bool(setting)
    m = paths_for(device_type)
    return m.shared_prompt if m is not None else False


def prefix_sharing_for(device_type: str, setting: bool | None = None) -> bool:
    """Whether sampling prefills each distinct prompt once: `setting` when given, else the faster path measured
    on this device type, else `model.generate` (False)."""
    if setting is not None:
        return bool(setting)
    m = paths_for(device_type)
    return m.prefix_sharing if m is not None else False


def cpu_features(cpuinfo: str | None = None) -> dict[str, bool]:
    """Whether this CPU computes bfloat16 natively: AVX512-BF16 (`avx512_bf16`) or AMX (`amx_bf16`), from
    /proc/cpuinfo's flags (`cpuinfo`: its text, for tests). Elsewhere (no /proc, another OS) both are False."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            break
    return {"avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags}


@dataclass(frozen=True)
class DtypeChoice:
    """Speed of the generator in bfloat16 over float32 (> 1: bfloat16 is faster), with where it was measured."""

    sample_ratio: float  # sampling tokens per second
    train_ratio: float  # optimizer-step throughput
    source: str


BF16_MEASURED: dict[str, DtypeChoice] = {
    # bench/generator_dtype.py on 2 CPU cores with AVX512-BF16 (AMD EPYC, no AMX), Qwen2.5-Coder-0.5B, the
    # answers profile's prompts and training config, alternating, under load, 2026-12-07: sampling 2.12x,
    # optimizer step 1.46x (the π_ref pass 1.69x), peak RSS 0.71x (docs/measurements.md). AMX is untested here:
    # it is taken on the same evidence (oneDNN's bfloat16 kernels use it where AVX512-BF16 is absent).
    "cpu": DtypeChoice(sample_ratio=2.12, train_ratio=1.46,
                       source="2 CPU cores, AVX512-BF16, Qwen2.5-Coder-0.5B, 2026-12-07"),
}


def dtype_for(device_type: str, setting: str = "auto", features: dict[str, bool] | None = None,
              cuda_bf16: bool = True) -> str:
    """The generator's number type: `setting` unless it is "auto"; then bfloat16 on a GPU that computes it
    (`cuda_bf16`), and on a CPU that computes it natively (AVX512-BF16 or AMX, `cpu_features`) where bfloat16
    was measured faster for both sampling and training; float32 everywhere else (a CPU without native
    bfloat16 emulates it, slowly)."""
    if setting != "auto":
        return setting
    kind = str(device_type).split(":")[0]
    if kind == "cuda":
        return "bfloat16" if cuda_bf16 else "float32"
    if kind == "cpu":
        f = cpu_features() if features is None else features
        m = BF16_MEASURED.get("cpu")
        if (f.get("avx512_bf16") or f.get("amx_bf16")) and m is not None and min(m.sample_ratio, m.train_ratio) > 1:
            return "bfloat16"
    return "float32"
