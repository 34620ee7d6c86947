"""File names of a LoRA adapter folder as the trainer writes it (a standard PEFT folder, loadable by peft and
by vLLM's --enable-lora) and as every reader checks it."""

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS)
STATS_FILE = "training_stats.json"  # the trainer's record of the run (config, hashes, steps)
