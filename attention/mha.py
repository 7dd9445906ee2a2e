"""MHA, GQA and MQA: one class, n_kv_head decides (n_head: MHA, 1: MQA, between: GQA).

    x (B,T,C) --c_attn--> [ q: n_head*D | k: n_kv_head*D | v: n_kv_head*D ]
    each KV head serves n_head // n_kv_head query heads (inside `attend`, K/V not copied)
"""
import torch
import torch.nn as nn

from attention.base import Attention, attend, resolve_impl
from attention.cache import KVCache
from attention.positional import alibi_slopes, apply_rope, rope_cos_sin


class MultiHeadAttention(Attention):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_dim = config.n_embd // config.n_head
        self.c_attn = nn.Linear(config.n_embd, (self.n_head + 2 * self.n_kv_head) * self.head_dim, bias=config.bias)
        self.c_proj = nn.Linear(self.n_head * self.head_dim, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.dropout = config.dropout
        self.pos_encoding, self.rope_base = config.pos_encoding, config.rope_base
        self.attn_impl = config.attn_impl
        if config.pos_encoding == "alibi":
            self.register_buffer("alibi_slopes", alibi_slopes(self.n_head), persistent=False)
        else:
            self.alibi_slopes = None

    def forward(self, x, pos, cache=None):
        B, T, _ = x.shape
        D = self.head_dim
        q, k, v = self.c_attn(x).split([self.n_head * D, self.n_kv_head * D, self.n_kv_head * D], dim=-1)
        q = q.view(B, T, self.n_head, D).transpose(1, 2)              # (B, H, T, D)
        k = k.view(B, T, self.n_kv_head, D).transpose(1, 2)           # (B, Hkv, T, D)
        v = v.view(B, T, self.n_kv_head, D).transpose(1, 2)
        if self.pos_encoding == "rope":
            cos, sin = rope_cos_sin(pos, D, self.rope_base)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k_pos = pos
        if cache is not None:
            k, v, k_pos = cache.update(k, v)
        y = attend(q, k, v, pos, k_pos, alibi_slopes=self.alibi_slopes,
                   dropout_p=self.dropout if self.training else 0.0,
                   impl=resolve_impl(self.attn_impl, x.device))
        y = y.transpose(1, 2).reshape(B, T, self.n_head * D)
        return self.resid_dropout(self.c_proj(y))

    def init_cache(self, batch_size, max_len, device, dtype):
        return KVCache(batch_size, self.n_kv_head, max_len, self.head_dim, self.head_dim, device, dtype)

    def cache_elems_per_token(self) -> int:
        return 2 * self.n_kv_head * self.head_dim
