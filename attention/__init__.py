"""Registry of attention variants: config.attention -> class.

To add a variant: write attention/<name>.py with a subclass of attention.base.Attention
and add it to VARIANTS (and its pos_encoding rules to GPTConfig.validate in model.py).
"""
from attention.mha import MultiHeadAttention

VARIANTS = {
    "mha": MultiHeadAttention,
    "gqa": MultiHeadAttention,
    "mqa": MultiHeadAttention,
}


def build_attention(config, layer_idx: int):
    return VARIANTS[config.attention](config, layer_idx)
