"""Inference: sampling workflows from the generator (transformers, with a prefix-sharing decode loop, or vLLM)."""
