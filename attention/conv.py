"""conv: Zoology's BaseConv, a gated short causal convolution as a layer of its own (no attention).

Zoology's MQAR benchmark (Arora et al. 2023, zoology/mixers/base_conv.py) gives every mixer the same
two-layer model: layer 0 this convolution, layer 1 the mixer under test, no MLP. Here that model is
the plan attention="conv,mha" with mlp=False (config/recall/zoology.py); any variant takes mha's
place. The convolution hands each position its last conv_taps tokens, the token shift that lets one
attention layer find the token after a matching key.

    x (B, T, C) --depthwise causal conv, conv_taps taps per channel, + bias--> c (B, T, C)
    x (B, T, C) --proj (Linear C -> C, with bias)-----------------------------> p (B, T, C)
    y = c * p + x                  (Zoology adds x inside the layer as well as around it)

Decoding keeps the last conv_taps - 1 inputs (fp32), whatever the length: a constant state.
"""
import math

import torch
import torch.nn as nn

from attention import record
from attention.base import Attention
from attention.cache import StateCache
from attention.short_conv import conv_weight, taps_sum
from attn_kernels.gla_chunked import in_dtype


class ShortConvMixer(Attention):
    owned_keys = ("conv_taps",)
    decodes_any_length = True

    def __init__(self, config, layer_idx):
        super().__init__()
        C, K = config.n_embd, config.conv_taps
        self.n_embd, self.taps = C, K
        self.proj = nn.Linear(C, C, bias=True)             # Zoology's projection keeps its bias
        self.conv_weight = conv_weight(C, K)                # (C, K): nn.Conv1d(C, C, K, groups=C)'s init
        self.conv_bias = nn.Parameter(torch.empty(C).uniform_(-1 / math.sqrt(K), 1 / math.sqrt(K)))
        self.attn_impl = config.attn_impl

    @classmethod
    def check_config(cls, config):
        if config.conv_taps < 1:
            raise ValueError(f"conv_taps={config.conv_taps} must be at least 1 (Zoology's BaseConv: 3)")
        if config.attn_output_gate != "none":
            raise ValueError("attn_output_gate is for softmax attention; attention=conv has no attention output")

    def forward(self, x, pos, cache=None):
        B, T, C = x.shape
        K = self.taps
        past = cache.state if cache is not None else x.new_zeros(B, K - 1, C)
        full = torch.cat([in_dtype(past, x.dtype), x], dim=1)                 # (B, K-1+T, C)
        c = taps_sum(full, in_dtype(self.conv_weight.t().contiguous(), x.dtype)) + self.conv_bias.to(x.dtype)
        if cache is not None:
            cache.update(full[:, full.size(1) - (K - 1):].float(), T)          # the next step's K-1 inputs
        if record.state is not None:
            self.record_taps(B, pos)
        return c * self.proj(x) + x

    def record_taps(self, B, pos):
        """For analyze.py: query i's weight on token i - d is tap K-1-d's mean |weight| over the channels,
        normalised over the taps it reads (the first tokens read fewer), as (B, 1, T, T)."""
        T, K = len(pos), self.taps
        d = pos[:, None] - pos[None, :]                                        # (T, T) distance
        allowed = (d >= 0) & (d < K) & (pos[None, :] >= 0)
        tap = self.conv_weight.detach().abs().mean(dim=0).float()              # (K,), tap K-1 reads i itself
        w = torch.where(allowed, tap[(K - 1 - d).clamp(0, K - 1)], torch.zeros(()))
        w = w / w.sum(dim=-1, keepdim=True).clamp_min(1e-12)
        record.record_weights(w.expand(B, 1, T, T), allowed)

    def init_cache(self, batch_size, max_len, device, dtype):
        return StateCache((batch_size, self.taps - 1, self.n_embd), device)

    def cache_elems_per_token(self) -> int:
        return 0

    def cache_state_elems(self) -> int:
        return (self.taps - 1) * self.n_embd

    def keys_seen(self, seq_len: int) -> torch.Tensor:
        """Position i reads tokens i - conv_taps + 1 .. i: a band."""
        i = torch.arange(seq_len)
        return (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < self.taps)

    def keys_per_query(self, seq_len: int) -> int:
        return min(self.taps, seq_len)

    def attn_flops_per_token(self, seq_len: int) -> float:
        """Beyond proj's matmul (counted with the weights): the taps' multiply-adds and the gate's
        product, forward and backward (3x)."""
        return 3 * (2 * self.taps + 1) * self.n_embd

    def attn_flops_per_token_palm(self, seq_len: int) -> float:
        return self.attn_flops_per_token(seq_len)

    def kernel_cases(self) -> dict:
        why = "a short convolution over a few taps runs in PyTorch (no kernel needed)"
        return {"forward": (None, {"why": why}), "decode": (None, {"why": why})}
