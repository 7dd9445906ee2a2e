"""MHA, GQA and MQA: one class, n_kv_head decides (n_head: MHA, 1: MQA, between: GQA).

    x (B,T,C) --c_attn--> [ q: n_head*D | k: n_kv_head*D | v: n_kv_head*D ]
    each KV head serves n_head // n_kv_head query heads (inside `attend`, K/V not copied)
    cache per token per layer: 2 * n_kv_head * D
"""
import torch

from attention.base import QKVAttention, attend, relative_error


class MultiHeadAttention(QKVAttention):
    @classmethod
    def default_n_kv_head(cls, config) -> int:
        return 1 if config.attention == "mqa" else config.n_head

    @classmethod
    def check_config(cls, config):
        """attention= names how many KV heads: mha all, mqa one, gqa a divisor in between."""
        super().check_config(config)
        H, Hkv = config.n_head, config.n_kv_head
        if config.attention == "mha" and Hkv != H:
            raise ValueError(f"attention=mha means n_kv_head = n_head = {H}, got {Hkv}; use attention=gqa")
        if config.attention == "mqa" and Hkv != 1:
            raise ValueError(f"attention=mqa means n_kv_head = 1, got {Hkv}; use attention=gqa")
        if config.attention == "gqa" and not (1 < Hkv < H and H % Hkv == 0):
            raise ValueError(f"attention=gqa needs 1 < n_kv_head < n_head with n_head % n_kv_head == 0, "
                             f"got n_head={H} n_kv_head={Hkv}")

    def forward(self, x, pos, cache=None):
        q, k, v = self.project(x, pos)                       # (B, H, T, D), (B, Hkv, T, D) x2
        k_pos = pos
        if cache is not None:
            k, v, k_pos = cache.update(k, v)
        path = "decode" if cache is not None else "forward"
        # one new token sees every key of its cache (a decoding step): no mask to build
        y = attend(q, k, v, pos, k_pos, alibi_slopes=self.alibi_slopes, dropout_p=self.attn_dropout,
                   impl=self.impl(x.device, path), sees_all_keys=cache is not None and x.size(1) == 1)
        return self.output(y, x)

    @classmethod
    def convert_from_mha(cls, state, prefix, config) -> float:
        """GQA / MQA from MHA weights (Ainslie et al. 2023, section 2.1): each group's K and V heads
        mean-pooled into one; the fused c_attn keeps its name, with fewer K/V rows."""
        w, b = state.pop(prefix + "c_attn.weight"), state.pop(prefix + "c_attn.bias")
        state[prefix + "c_attn.weight"], state[prefix + "c_attn.bias"], err = mean_pool_kv(
            w, b, config.n_head, config.n_kv_head)
        return err


def mean_pool_kv(c_attn_w, c_attn_b, n_head, n_kv_head):
    """MHA c_attn (3C, C), (3C,) -> GQA c_attn ((H + 2 Hkv) D, C) with each group's K and V averaged,
    and the relative error of the stacked [W_k W_v | b] map that every query head now sees."""
    C = c_attn_w.size(1)
    D, G = C // n_head, n_head // n_kv_head
    affine = torch.cat([c_attn_w, c_attn_b[:, None]], dim=1)              # (3C, C+1): [W | b]
    q, k, v = affine.split(C)
    pooled = [t.view(n_kv_head, G, D, C + 1).mean(dim=1) for t in (k, v)]  # (Hkv, D, C+1) each
    seen = torch.cat([p.repeat_interleave(G, dim=0).reshape(C, C + 1) for p in pooled])  # per query head
    err = relative_error(torch.cat([k, v]), seen)
    out = torch.cat([q, *(p.reshape(n_kv_head * D, C + 1) for p in pooled)])
    return out[:, :C].contiguous(), out[:, C].contiguous(), err
