"""Registry of attention variants: config.attention -> the class that implements it.

Where each variant lives (a file is named after the attention= value it serves):

    attention=      layer (wiring)                           kernel (Triton)        PyTorch math
    mha, gqa, mqa   attention/mha.py   MultiHeadAttention        kernels/flash_attn.py  attention/base.py attend
    mla             attention/mla.py   MultiHeadLatentAttention  kernels/flash_attn.py  attention/base.py attend
    bigbird         attention/bigbird.py BlockSparseAttention    kernels/flash_attn.py  attention/bigbird.py
    gla             attention/gla.py   GatedLinearAttention      kernels/gla.py         kernels/gla_chunked.py
    swa             attention/swa.py   SlidingWindowAttention    kernels/flash_attn.py  attention/swa.py, base.py attend
    moba            attention/moba.py  MixtureOfBlockAttention   (none: PyTorch)        attention/moba.py
    deltanet,       attention/deltanet.py DeltaNet               (none: PyTorch)        kernels/delta_chunked.py
      gated_deltanet

Shared: attention/base.py (the interface, the QKV projection, `attend`), attention/dispatch.py
(which implementation runs: `choose_impl`, `check_impl_runs_on`), attention/cache.py,
attention/positional.py, attention/record.py (analyze.py's hook); kernels/reference.py holds the
references the kernels are tested against.

Entries are "module:Class" strings imported on first use, so a variant's module is loaded only
when a config asks for it. To add a variant: write a subclass of attention.base.Attention (its
hooks are listed there) and add one line here and one row above.
"""
import importlib

from attention.dispatch import ATTN_IMPLS, check_impl_runs_on  # noqa: F401  (the public place for both)

VARIANTS = {
    "mha": "attention.mha:MultiHeadAttention",
    "gqa": "attention.mha:MultiHeadAttention",
    "mqa": "attention.mha:MultiHeadAttention",
    "mla": "attention.mla:MultiHeadLatentAttention",
    "bigbird": "attention.bigbird:BlockSparseAttention",
    "gla": "attention.gla:GatedLinearAttention",
    "swa": "attention.swa:SlidingWindowAttention",
    "moba": "attention.moba:MixtureOfBlockAttention",
    "deltanet": "attention.deltanet:DeltaNet",
    "gated_deltanet": "attention.deltanet:DeltaNet",
}

# Keys one variant alone reads that change its shapes: GPTConfig.validate refuses them, set away
# from their defaults, under any other attention (they would be silently ignored there).
EXCLUSIVE_KEYS = {"qk_nope_head_dim": "mla", "v_head_dim": "mla", "gla_output_gate": "gla", "gla_norm": "gla",
                  "sliding_window": "swa", "moba_topk": "moba"}


def variant_class(name: str):
    module, cls = VARIANTS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def build_attention(config, layer_idx: int):
    return variant_class(config.attention)(config, layer_idx)
