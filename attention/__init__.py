"""Registry of attention variants: config.attention -> the class that implements it.

Entries are "module:Class" strings imported on first use, so a variant's module is
loaded only when a config asks for it. To add a variant: write attention/<name>.py with
a subclass of attention.base.Attention (optionally a classmethod `check_config(config)`
that validates and fills in the variant's own keys), then add one line here.
"""
import importlib

VARIANTS = {
    "mha": "attention.mha:MultiHeadAttention",
    "gqa": "attention.mha:MultiHeadAttention",
    "mqa": "attention.mha:MultiHeadAttention",
    "mla": "attention.mla:MultiHeadLatentAttention",
    "bigbird": "attention.sparse:BlockSparseAttention",
    "gla": "attention.linear:GatedLinearAttention",
}


def variant_class(name: str):
    module, cls = VARIANTS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def build_attention(config, layer_idx: int):
    return variant_class(config.attention)(config, layer_idx)
