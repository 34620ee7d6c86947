"""A tiny random Llama with SmolLM2's tokenizer: fast, for trainer mechanics (not quality). Seeded, so a test's
hand-checked values do not move."""

from __future__ import annotations

from pathlib import Path


def tiny_llama(initializer_range: float | None = None):
    """(LlamaConfig, tokenizer). A larger `initializer_range` (0.2) makes the temperature visibly change the
    log-probs; None keeps transformers' default."""
    from transformers import LlamaConfig

    from spogw_dagster.models import load_tokenizer

    tok = load_tokenizer("smollm2")
    extra = {} if initializer_range is None else {"initializer_range": initializer_range}
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, **extra)
    return cfg, tok


def save_tiny_llama(out: Path, cfg, tok) -> Path:
    """Initialise the model with torch seed 0 and save it with its tokenizer to `out`."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out
