"""MoBA, mixture of block attention (Lu et al. 2025): each query picks the key blocks it reads by content.

The keys are cut into blocks of `sparse_block` tokens. Query t (in block b_t) scores every
earlier block j < b_t, which is complete, by its gate s_tj = q_t . mean(k of block j), per
head; it reads the keys of the top `moba_topk` of them and of its own block b_t (causally,
token by token). A query with no more than moba_topk earlier blocks reads them all: dense
causal attention. The choice is hard: no gradient flows through it (as in MoBA), only
through the attention over the chosen keys.

    blocks of 4, moba_topk 1; query 13 (block 3) picks block 1 by its gate:
        key ->   0 1 2 3 | 4 5 6 7 | 8 9 10 11 | 12 13 14 15
        query 13         | x x x x |           | x  x

Heads as in MHA/GQA/MQA (n_kv_head sets the KV heads; each query head chooses its own
blocks). Positions: blocks are counted from the oldest key visible (0 in training; the
cache's first position once decoding slides past block_size, as BigBird does), so a cached
step chooses exactly as a full forward over the visible tokens would.

Paths (kernel_cases names them, attention/dispatch.py decides and records what runs on each;
all compute the same function):
- "gathered", training and prefills at long context: gather the chosen blocks per query,
  O(T * (k+1) * block) scores; memory O(T * k * block * D) for the gathered keys and values.
- "forward", the same at shorter context: SDPA over all keys with the chosen blocks as a token
  mask, O(T^2) but faster there: below GATHER_FROM x the keys read per query, measured on CPU
  (forward + backward at 128 keys of 32 dims: dense 0.04 s at T=1k, 0.81 s at 4k; gathered
  0.22 s and 0.96 s).
- "decode", new tokens against a cache holding earlier keys: `attend` over the cached keys with
  the same mask, per sequence and head.
- naive, on any path: the dense reference, plain math with the same token mask, O(T^2).
No Triton path: the choice differs per query, which a block layout cannot express, so
attn_impl=triton (and auto on CUDA) runs PyTorch here, said once on stderr and recorded.
"""
import math

import torch
import torch.nn.functional as F

from attention.base import QKVAttention, attend, mean_keys_in_blocks
from attention.positional import alibi_bias
from attn_kernels.gla_chunked import first_tokens


def block_gates(q, k, k_pos, q_pos, blk):
    """Gate of each query for each key block, -inf where a block is not earlier than the query's own
    block (nothing to choose there). q (B, H, Tq, D), k (B, Hkv, Tk, D) -> (B, H, Tq, nb); blocks are
    counted from k_pos[0] (see the module docstring); keys in position order."""
    B, H, Tq, D = q.shape
    Hkv, Tk = k.size(1), k.size(2)
    nb = -(-Tk // blk)
    kb = F.pad(k, (0, 0, 0, nb * blk - Tk)).view(B, Hkv, nb, blk, D)
    counts = (Tk - blk * torch.arange(nb, device=k.device)).clamp(max=blk)             # keys per block
    means = kb.sum(dim=3) / counts[:, None].to(k.dtype)                              # (B, Hkv, nb, D)
    means = means.repeat_interleave(H // Hkv, dim=1)                                  # (B, H, nb, D)
    gates = (q @ means.transpose(-1, -2)).float()                                     # (B, H, Tq, nb)
    own = torch.div(q_pos - k_pos[0], blk, rounding_mode="floor")                     # (Tq,)
    earlier = torch.arange(nb, device=q.device)[None, :] < own[:, None]               # (Tq, nb)
    return gates.masked_fill(~earlier, float("-inf")), own


def choose_blocks(gates, topk):
    """(B, H, Tq, nb) gates -> the chosen block indices (B, H, Tq, k) and which of them count
    (a query with fewer than k earlier blocks pads with blocks it may not read). Equal gates (the
    same tokens, no RoPE) go to the earlier block: a stable sort, so that a decoding step and a full
    forward break ties alike (topk's order among ties depends on the tensor's shape)."""
    k = min(topk, gates.size(-1))
    values, index = torch.sort(gates, dim=-1, descending=True, stable=True)
    return index[..., :k], values[..., :k] > float("-inf")


GATHER_FROM = 32  # gather when the context is this many times the keys read per query (module docstring)


class MixtureOfBlockAttention(QKVAttention):
    owned_keys = ("sparse_block", "moba_topk")  # blocks of sparse_block, as BigBird's

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.sparse_block, self.topk = config.sparse_block, config.moba_topk

    @classmethod
    def check_config(cls, config):
        super().check_config(config)
        b = config.sparse_block
        if b < 1 or b > config.block_size:
            raise ValueError(f"sparse_block={b} must be between 1 and block_size={config.block_size}")
        if config.moba_topk < 1:
            raise ValueError(f"moba_topk={config.moba_topk} must be at least 1 (earlier blocks each query reads)")

    def forward(self, x, pos, cache=None):
        T = x.size(1)
        q, k, v = self.project(x, pos)                       # (B, H, T, D), (B, Hkv, T, D) x2
        k_pos = pos
        if cache is not None:
            k, v, k_pos = cache.update(k, v)
        if k.size(2) > T:  # new tokens against a cache
            path = "decode"
        else:              # the keys are this sequence: gather its blocks where that pays
            path = "gathered" if T >= GATHER_FROM * self.keys_per_query(T) else "forward"
        impl = self.impl(x.device, path)
        if path == "gathered" and impl != "naive":
            y = self.attend_gathered(q, k, v, pos)
        else:  # the reference, a cache, or a context too short for gathering to pay
            y = self.attend_dense(q, k, v, pos, k_pos, impl=impl)
        return self.output(y, x)

    def kernel_cases(self) -> dict:
        """The dense paths carry the chosen blocks as a token mask (masked: PyTorch); the gathered one
        has no kernel."""
        module, case = super().kernel_cases()["forward"]
        masked = (module, {**case, "masked": True})
        return {"forward": masked, "decode": masked,
                "gathered": (None, {"why": "moba chooses key blocks per query, which no kernel's block layout "
                                           "expresses"})}

    def keys_seen(self, seq_len: int) -> None:
        return None  # each query's blocks are chosen by q . mean(k): content, not a fixed pattern

    def token_keep(self, q, k, q_pos, k_pos):
        """bool (B, H, Tq, Tk): key j is in query i's own block or in one of its chosen blocks."""
        gates, own = block_gates(q, k, k_pos, q_pos, self.sparse_block)
        index, valid = choose_blocks(gates, self.topk)
        chosen = torch.zeros_like(gates, dtype=torch.bool).scatter_(-1, index, valid)   # (B, H, Tq, nb)
        chosen |= torch.arange(gates.size(-1), device=q.device) == own[:, None]           # own block
        k_blk = torch.div(k_pos - k_pos[0], self.sparse_block, rounding_mode="floor")     # (Tk,)
        return chosen[..., k_blk]

    def attend_dense(self, q, k, v, q_pos, k_pos, impl="sdpa"):
        """Attention over every key restricted by the chosen blocks' token mask (causality is `attend`'s)."""
        return attend(q, k, v, q_pos, k_pos, alibi_slopes=self.alibi_slopes,
                      keep=self.token_keep(q, k, q_pos, k_pos), dropout_p=self.attn_dropout, impl=impl)

    def attend_gathered(self, q, k, v, pos):
        """q (B, H, T, D), k, v (B, Hkv, T, D) of one sequence -> (B, H, T, D), reading per query
        only its k chosen blocks and its own block:

            chosen   k, v (B, Hkv, nb, blk, D) -index (B, H, T, k)-> (B, H, T, k*blk, D)
            own      each query block against itself, causally: (B, H, nb, blk, blk) scores
            one softmax over [chosen k*blk | own blk] scores per query
        """
        B, H, T, D = q.shape
        Hkv, blk = k.size(1), self.sparse_block
        G, nb = H // Hkv, -(-T // blk)
        gates, own = block_gates(q, k, pos, pos, blk)
        index, valid = choose_blocks(gates, self.topk)                               # (B, H, T, kk)
        kk = index.size(-1)
        pad = nb * blk - T
        qp, kp, vp = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        kb = kp.view(B, Hkv, nb, blk, D).repeat_interleave(G, dim=1)                 # (B, H, nb, blk, D)
        vb = vp.view(B, Hkv, nb, blk, D).repeat_interleave(G, dim=1)
        scale = 1.0 / math.sqrt(D)

        # chosen blocks: gather per query
        flat = (torch.arange(B * H, device=q.device).view(B, H, 1, 1) * nb + index).flatten()
        k_sel = kb.reshape(B * H * nb, blk, D)[flat].view(B, H, T, kk * blk, D)
        v_sel = vb.reshape(B * H * nb, blk, D)[flat].view(B, H, T, kk * blk, D)
        s_sel = torch.einsum("bhtd,bhtnd->bhtn", q * scale, k_sel).float()            # (B, H, T, kk*blk)
        s_sel = s_sel.masked_fill(~valid.repeat_interleave(blk, dim=-1), float("-inf"))
        # own block: causal within the block
        qb = qp.view(B, H, nb, blk, D)
        s_own = ((qb * scale) @ kb.transpose(-1, -2)).float()                        # (B, H, nb, blk, blk)
        s_own = s_own.masked_fill(~torch.ones(blk, blk, dtype=torch.bool, device=q.device).tril(),
                                  float("-inf")).view(B, H, nb * blk, blk)
        s_own = first_tokens(s_own, T)
        if self.alibi_slopes is not None:  # -m_h * (t - p) = -m_h * t + m_h * p for query t, key p
            rel = torch.arange(T, device=q.device)
            m = self.alibi_slopes.view(1, H, 1, 1)
            q_term = alibi_bias(self.alibi_slopes, rel, rel.new_zeros(1)).view(1, H, T, 1)      # -m_h * t
            sel_pos = (index[..., None] * blk + torch.arange(blk, device=q.device)).flatten(-2)  # (B, H, T, kk*blk)
            own_pos = torch.div(rel, blk, rounding_mode="floor")[:, None] * blk + torch.arange(blk, device=q.device)
            s_sel = s_sel + q_term + m * sel_pos
            s_own = s_own + q_term + m * own_pos
        probs = torch.cat([s_sel, s_own], dim=-1).softmax(dim=-1)
        if self.attn_dropout > 0:
            probs = F.dropout(probs, p=self.attn_dropout)
        probs = probs.to(v.dtype)
        p_sel, p_own = probs.split([kk * blk, blk], dim=-1)   # split: one cat backward, no zeroed copies
        y = torch.einsum("bhtn,bhtnd->bhtd", p_sel, v_sel)
        p_own = F.pad(p_own, (0, 0, 0, pad)).view(B, H, nb, blk, blk)
        y_own = first_tokens((p_own @ vb).view(B, H, nb * blk, D), T)
        return y + y_own

    def keys_per_query(self, seq_len: int) -> int:
        """Keys each query reads: its k chosen blocks and its own (at most seq_len)."""
        return min(seq_len, (self.topk + 1) * self.sparse_block)

    def mean_keys_per_query(self, seq_len: int) -> float:
        """Keys read, causal pairs only, averaged over positions: a query of block b reads its own block
        causally and min(moba_topk, b) whole earlier blocks (every earlier block has a finite gate, so
        the choice always fills), whichever blocks it picks."""
        return mean_keys_in_blocks(seq_len, self.sparse_block, lambda b: min(self.topk, b))

    def gate_flops_per_token(self, seq_len: int) -> float:
        """The gates, training FLOPs: one q . mean(k) per key block (seq_len / block of them, all scored
        then masked) and head, beside the chosen keys; counted alike by both conventions."""
        return 3 * 2 * self.n_head * self.head_dim * -(-seq_len // self.sparse_block)

    def attn_flops_per_token(self, seq_len: int) -> float:
        return super().attn_flops_per_token(seq_len) + self.gate_flops_per_token(seq_len)

    def attn_flops_per_token_palm(self, seq_len: int) -> float:
        return super().attn_flops_per_token_palm(seq_len) + self.gate_flops_per_token(seq_len)
