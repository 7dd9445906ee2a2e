"""MHA, GQA and MQA: one class, n_kv_head decides (n_head: MHA, 1: MQA, between: GQA).

    x (B,T,C) --c_attn--> [ q: n_head*D | k: n_kv_head*D | v: n_kv_head*D ]
    each KV head serves n_head // n_kv_head query heads (inside `attend`, K/V not copied)
    cache per token per layer: 2 * n_kv_head * D
"""
from attention.base import QKVAttention, attend, resolve_impl


class MultiHeadAttention(QKVAttention):
    def forward(self, x, pos, cache=None):
        q, k, v = self.project(x, pos)                       # (B, H, T, D), (B, Hkv, T, D) x2
        k_pos = pos
        if cache is not None:
            k, v, k_pos = cache.update(k, v)
        y = attend(q, k, v, pos, k_pos, alibi_slopes=self.alibi_slopes, dropout_p=self.attn_dropout,
                   impl=resolve_impl(self.attn_impl, x.device))
        return self.output(y)
