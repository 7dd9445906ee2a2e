"""Registry of attention variants: config.attention -> the class that implements it.

Where each variant lives (a file is named after the attention= value it serves):

    attention=     layer (wiring)                                    Triton kernel    PyTorch math
    mha, gqa, mqa  attention/mha.py        MultiHeadAttention        flash_attn.py    attention/base.py attend
    mla            attention/mla.py        MultiHeadLatentAttention  flash_attn.py    attention/base.py attend
    bigbird        attention/bigbird.py    BlockSparseAttention      flash_attn.py    attention/bigbird.py
    gla            attention/gla.py        GatedLinearAttention      gla.py           attn_kernels/gla_chunked.py
    linear         attention/linear.py     LinearAttention           gla.py           attn_kernels/gla_chunked.py
    retnet         attention/retnet.py     MultiScaleRetention       gla.py           attn_kernels/gla_chunked.py
    efficient      attention/efficient.py  EfficientAttention        gla.py           attn_kernels/gla_chunked.py
    swa            attention/swa.py        SlidingWindowAttention    flash_attn.py    attention/swa.py, base.py attend
    moba           attention/moba.py       MixtureOfBlockAttention   (none: PyTorch)  attention/moba.py
    deltanet,      attention/deltanet.py   DeltaNet                  (none: PyTorch)  attn_kernels/delta_chunked.py
      gated_deltanet
    fox            attention/fox.py        ForgettingAttention       flash_attn.py    attention/base.py attend
    nsa            attention/nsa.py        NativeSparseAttention     flash_attn.py    attention/nsa.py, base.py attend
                   (the window branch on the kernel; the compressed and selected branches in PyTorch)
    conv           attention/conv.py       ShortConvMixer            (none: PyTorch)  attention/conv.py
                   (Zoology's BaseConv, a layer of a plan: attention="conv,mha")

    (Triton kernels: attn_kernels/flash_attn.py and attn_kernels/gla.py.)

Shared: attention/base.py (the interface, the QKV projection, `attend`), attention/dispatch.py
(which implementation runs: `choose_impl`, `check_impl_runs_on`), attention/cache.py,
attention/positional.py, attention/record.py (analyze.py's hook); attn_kernels/reference.py holds the
references the kernels are tested against. The linear family (gla, linear, retnet, efficient) shares
attention/linear_family.py: one layer over the recurrence, each member a recipe of four parts (decay,
feature map, normaliser, output gate) in its own short file; gla takes its parts from its keys
(gla_gate, ...), so it also spells every member and ablation (a saved gla config that spells a
member loads under the member's name: GPTConfig.from_dict).

Each variant declares the config keys it reads (beyond the shared ones) in its own class, as
`owned_keys`; `key_owners` collects them, and GPTConfig.validate refuses a key set away from its
default when no variant of the plan owns it (it would be silently ignored).

Entries are "module:Class" strings imported on first use (validation reads every variant's
owned_keys, so a validated config has imported them all; a variant's Triton kernel is still
imported only when it runs). To add a variant: write a subclass of attention.base.Attention (its
hooks are listed there, owned_keys among them) and add one line here and one row above.
"""
import functools
import importlib

from attention.dispatch import ATTN_IMPLS, check_impl_runs_on  # noqa: F401  (the public place for both)

VARIANTS = {
    "mha": "attention.mha:MultiHeadAttention",
    "gqa": "attention.mha:MultiHeadAttention",
    "mqa": "attention.mha:MultiHeadAttention",
    "mla": "attention.mla:MultiHeadLatentAttention",
    "bigbird": "attention.bigbird:BlockSparseAttention",
    "gla": "attention.gla:GatedLinearAttention",
    "linear": "attention.linear:LinearAttention",
    "retnet": "attention.retnet:MultiScaleRetention",
    "efficient": "attention.efficient:EfficientAttention",
    "swa": "attention.swa:SlidingWindowAttention",
    "moba": "attention.moba:MixtureOfBlockAttention",
    "deltanet": "attention.deltanet:DeltaNet",
    "gated_deltanet": "attention.deltanet:DeltaNet",
    "fox": "attention.fox:ForgettingAttention",
    "nsa": "attention.nsa:NativeSparseAttention",
    "conv": "attention.conv:ShortConvMixer",
}


def variant_class(name: str):
    module, cls = VARIANTS[name].split(":")
    return getattr(importlib.import_module(module), cls)


@functools.cache
def key_owners() -> dict:
    """{key: (the attention= names whose class declares it in owned_keys)}, over every variant
    (so this imports them all). GPTConfig.validate refuses such a key, set away from its default,
    under a plan none of whose variants owns it."""
    owners = {}
    for name in VARIANTS:
        for key in variant_class(name).owned_keys:
            owners[key] = owners.get(key, ()) + (name,)
    return owners


def member_named_by_gla_knobs(config) -> str | None:
    """The named linear-family member whose recipe attention=gla's knobs spell (config.gla_gate, ...),
    or None: how a config saved before the members had names (config/linear.py once set attention=gla
    with knobs) finds the name that builds the same layer with the same weights."""
    recipe = variant_class("gla").recipe_of(config)
    return next((name for name in VARIANTS if name != "gla" and getattr(variant_class(name), "recipe", None) == recipe),
                None)


def build_attention(config, layer_idx: int):
    return variant_class(config.attention)(config, layer_idx)
