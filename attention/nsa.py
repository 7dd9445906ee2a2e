"""Native Sparse Attention (NSA; Yuan et al., DeepSeek 2025): a sparse pattern chosen by content and
trained end to end, three softmax branches per query mixed by learned gates.

    blocks of l = sparse_block keys, stride d = nsa_stride (d divides l; d = l: disjoint blocks)
    compressed  kc_i = phi(k[i*d : i*d + l])      one key per block (phi: mean, or an MLP over the
                vc_i = phi(v[i*d : i*d + l])      block's l keys), visible to query t once complete
                o_cmp = softmax(q kc^T) vc        (i*d + l - 1 <= t); no block yet: o_cmp = 0
    selected    the importance of selection block j (keys j*l .. j*l + l - 1): the compressed
                probabilities of the blocks overlapping it, averaged over the query heads that share
                a KV head (GQA-shared selection, as the paper does); the first block, the query's own
                and the one before it always count (score 1); the top nsa_topk blocks are read, token
                by token causally: o_slc = softmax over their keys
    window      o_swa = softmax over the last sliding_window keys
    y = sigmoid(g_cmp) o_cmp + sigmoid(g_slc) o_slc + sigmoid(g_swa) o_swa, g = x W_g (3 per head)

    query 13, l = d = 4, nsa_topk 3, window 3: its own block 3, block 2 before it, block 0 first
        key ->   0 1 2 3 | 4 5 6 7 | 8 9 10 11 | 12 13 14 15
        cmp      [ kc_0  ] [ kc_1  ] [  kc_2   ]               (kc_3 not complete at 13)
        slc      x x x x |         | x x x  x  | x  x
        swa                               x    | x  x

As in fla's NSA layer, the three branches share one q, k, v (the paper gives each branch its own
keys and values); the choice of blocks is hard (no gradient through it), the compressed keys learn
through o_cmp. Blocks are counted from the oldest key visible, as MoBA's: 0 in training, the cache's
first position once decoding slides past its length (a slide recomputes the compressed keys).

Decoding keeps the K/V of every token and the compressed K/V, one entry per completed block (NSACache):
2 * n_kv_head * D per token plus as much per block, cache_elems_for. A step reads the compressed keys,
nsa_topk blocks and the window (keys_per_query); its FLOPs, attn_flops_per_token.

Paths: "window" on the flash kernel (attn_impl=triton, auto on CUDA); "compressed" (explicit
probabilities, which the selection reads) and "selected" (a token mask) in PyTorch; naive the plain
math for all three. ALiBi is refused: a compressed key has no one position to measure a distance from.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from attention import record
from attention.base import QKVAttention, attend, mean_keys_in_blocks
from attention.cache import Cache, SlidingCache
from attention.moba import choose_blocks

COMPRESSORS = ("mean", "mlp")


def n_blocks(n_tokens: int, length: int, stride: int) -> int:
    """Complete compression blocks of `length` keys every `stride` among n_tokens."""
    return 0 if n_tokens < length else (n_tokens - length) // stride + 1


def block_importance(p_cmp, n_sel: int, length: int, stride: int):
    """(..., nc) compressed probabilities -> (..., n_sel) per selection block of `length` keys: the sum
    over the compressed blocks that overlap it ([i*stride, i*stride + length) against [j*length, ...))."""
    nc = p_cmp.size(-1)
    if stride == length:
        return F.pad(p_cmp, (0, n_sel - nc))
    start = torch.arange(nc, device=p_cmp.device)[:, None] * stride                    # (nc, 1)
    first = torch.arange(n_sel, device=p_cmp.device)[None, :] * length                  # (1, n_sel)
    overlap = (start < first + length) & (start + length > first)                       # (nc, n_sel)
    return p_cmp @ overlap.to(p_cmp.dtype)


class NSACache(Cache):
    """K/V of every token (a SlidingCache, as KVCache) and the compressed K/V of every complete block,
    counted from the oldest key kept (`origin`): a slide starts them over."""

    def __init__(self, batch_size, n_kv_head, max_len, head_dim, length, stride, device, dtype):
        self.kv = SlidingCache([(batch_size, n_kv_head, head_dim)] * 2, max_len, device, dtype)
        n = n_blocks(max_len, length, stride)
        self.kc, self.vc = (torch.zeros(batch_size, n_kv_head, n, head_dim, device=device, dtype=dtype)
                            for _ in range(2))
        self.count, self.origin = 0, 0   # compressed entries filled; the position they count blocks from

    @property
    def pos(self):
        return self.kv.pos

    @pos.setter
    def pos(self, value):  # an empty cache may start anywhere (tools/analyze.py); update() recounts blocks
        self.kv.pos = value

    def tensors(self):
        return (*self.kv.buffers, self.kc, self.vc)

    def update(self, k, v, compress):
        """Append (B, Hkv, T, D) keys and values; compress(k, v, start, stop) makes the entries of blocks
        start..stop-1. -> every key and value kept, their positions, the compressed keys and values."""
        k, v, k_pos = self.kv.update(k, v)
        if int(k_pos[0]) != self.origin:
            self.count, self.origin = 0, int(k_pos[0])
        stop = n_blocks(k.size(2), *compress.block)
        if stop > self.count:
            kc, vc = compress(k, v, self.count, stop)
            self.kc[:, :, self.count:stop], self.vc[:, :, self.count:stop] = kc, vc
            self.count = stop
        return k, v, k_pos, self.kc[:, :, :self.count], self.vc[:, :, :self.count]


class BlockCompressor(nn.Module):
    """phi of the compressed branch: (B, Hkv, T, D) keys and values -> one entry per block of `length`
    every `stride` (blocks start..stop-1). mean: their average (fla's); mlp: the paper's learned map of
    the block's keys in order (l*D -> D -> D, GELU), one for keys and one for values, shared by the heads."""

    def __init__(self, kind: str, length: int, stride: int, head_dim: int):
        super().__init__()
        self.kind, self.block = kind, (length, stride)
        if kind == "mlp":
            self.k_mlp, self.v_mlp = (nn.Sequential(nn.Linear(length * head_dim, head_dim), nn.GELU(),
                                                    nn.Linear(head_dim, head_dim)) for _ in range(2))

    def forward(self, k, v, start: int, stop: int):
        length, stride = self.block
        span = slice(start * stride, (stop - 1) * stride + length)
        blocks = [x[:, :, span].unfold(2, length, stride) for x in (k, v)]      # (B, Hkv, n, D, l)
        if self.kind == "mean":
            return tuple(b.mean(-1) for b in blocks)
        return tuple(mlp(b.transpose(-1, -2).flatten(-2)) for mlp, b in zip((self.k_mlp, self.v_mlp), blocks))


class NativeSparseAttention(QKVAttention):
    owned_keys = ("sparse_block", "nsa_stride", "nsa_topk", "nsa_compress", "sliding_window")

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.length, self.stride = config.sparse_block, config.nsa_stride
        self.topk, self.window = config.nsa_topk, config.sliding_window
        self.compress = BlockCompressor(config.nsa_compress, self.length, self.stride, self.head_dim)
        self.branch_gate = nn.Linear(config.n_embd, 3 * self.n_head, bias=True)   # (cmp, slc, swa) per head

    @classmethod
    def check_config(cls, config):
        super().check_config(config)
        H, Hkv, b = config.n_head, config.n_kv_head, config.sparse_block
        if not (1 <= Hkv <= H and H % Hkv == 0):
            raise ValueError(f"attention=nsa needs n_kv_head dividing n_head={H}, got n_kv_head={Hkv}")
        if b < 1 or b > config.block_size:
            raise ValueError(f"sparse_block={b} must be between 1 and block_size={config.block_size}")
        config.nsa_stride = config.nsa_stride or b
        if config.nsa_stride < 1 or b % config.nsa_stride:
            raise ValueError(f"nsa_stride={config.nsa_stride} must divide sparse_block={b} (0 = sparse_block)")
        if config.nsa_topk < 3:
            raise ValueError(f"nsa_topk={config.nsa_topk} must be at least 3: the first block and the two local "
                             "blocks are always read")
        if config.sliding_window < 1:
            raise ValueError(f"sliding_window={config.sliding_window} must be at least 1")
        if config.nsa_compress not in COMPRESSORS:
            raise ValueError(f"unknown nsa_compress={config.nsa_compress!r}; choose one of {', '.join(COMPRESSORS)}")
        if config.pos_encoding == "alibi":
            raise ValueError("attention=nsa cannot take pos_encoding=alibi: a compressed key has no one position "
                             "to measure a distance from; use rope, none, learned or sinusoidal")

    def forward(self, x, pos, cache=None):
        B, T, _ = x.size()
        q, k, v = self.project(x, pos)                       # (B, H, T, D), (B, Hkv, T, D) x2
        if cache is None:
            k_pos = pos
            kc, vc = self.compress(k, v, 0, n_blocks(T, self.length, self.stride))
        else:
            k, v, k_pos, kc, vc = cache.update(k, v, self.compress)
        o_cmp, p_cmp = self.attend_compressed(q, kc, vc, pos - k_pos[0], x.device)
        keep = self.selected_tokens(p_cmp, pos - k_pos[0], k.size(2))                   # (B, H, T, Tk)
        step = "forward" if cache is None else "decode"
        o_slc = attend(q, k, v, pos, k_pos, keep=keep, dropout_p=self.attn_dropout,
                       impl=self.impl(x.device, "selected"))
        o_swa = attend(q, k, v, pos, k_pos, window=self.window, dropout_p=self.attn_dropout,
                       impl=self.impl(x.device, "window_" + step))
        g = torch.sigmoid(self.branch_gate(x)).view(B, T, self.n_head, 3).transpose(1, 2)   # (B, H, T, 3)
        y = g[..., 0:1] * o_cmp + g[..., 1:2] * o_slc + g[..., 2:3] * o_swa
        if record.state is not None:  # analyze.py: the two attend records become one map per layer
            self.record_mixture(g, p_cmp, pos - k_pos[0], k_pos)
        return self.output(y, x)

    def record_mixture(self, g, p_cmp, q_rel, k_pos):
        """Replace the selected and window branches' records with the layer's weight per key: the gates'
        mixture of the three branches, normalized per query; a compressed key's probability spread evenly
        over the keys of its block (the mean compressor exactly; the MLP's, as if it were a mean). Visible:
        the keys of either branch or of a block complete at the query."""
        slc, swa = record.state["records"][-2:]
        del record.state["records"][-2:]
        B, H, Tq, _ = g.shape
        rel = (k_pos - k_pos[0])[None, :]                                              # (1, Tk)
        start = torch.arange(p_cmp.size(-1), device=g.device)[:, None] * self.stride   # (nc, 1)
        spread = ((rel >= start) & (rel < start + self.length)).float() / self.length  # (nc, Tk)
        p_tok = p_cmp.reshape(B, H, Tq, -1).float() @ spread                           # (B, H, Tq, Tk)
        g = g.float()
        w = g[..., 0:1] * p_tok + g[..., 1:2] * slc["probs"] + g[..., 2:3] * swa["probs"]
        w = w / w.sum(-1, keepdim=True).clamp_min(1e-30)
        complete = start.T + self.length - 1 <= q_rel[:, None]                          # (Tq, nc)
        in_complete = (complete.float() @ (spread > 0).float()) > 0                     # (Tq, Tk)
        record.record_weights(w, slc["allowed"] | swa["allowed"] | in_complete)

    def attend_compressed(self, q, kc, vc, q_rel, device):
        """q (B, H, Tq, D) against the compressed keys (B, Hkv, nc, D) of the blocks complete at each query
        (q_rel: positions from the first key) -> o_cmp (B, H, Tq, D) and the probabilities (B, Hkv, G, Tq, nc)."""
        B, H, Tq, D = q.shape
        Hkv, nc = kc.size(1), kc.size(2)
        qg = q.view(B, Hkv, H // Hkv, Tq, D)
        scores = (qg @ kc[:, :, None].transpose(-1, -2)).float() / math.sqrt(D)      # (B, Hkv, G, Tq, nc)
        last_key = torch.arange(nc, device=device) * self.stride + self.length - 1
        scores = scores.masked_fill(last_key[None, :] > q_rel[:, None], float("-inf"))
        probs = scores.softmax(dim=-1).nan_to_num(0.0)       # a query before the first complete block: 0
        dropped = F.dropout(probs, p=self.attn_dropout) if self.attn_dropout > 0 else probs
        o_cmp = (dropped.to(vc.dtype) @ vc[:, :, None]).view(B, H, Tq, D)
        return o_cmp, probs

    def selected_tokens(self, p_cmp, q_rel, n_keys: int):
        """bool (B, H, Tq, Tk): key j lies in one of the nsa_topk blocks query i reads (causality is
        `attend`'s). Scores: the compressed probabilities per selection block, averaged over each KV
        head's query heads; 1 for the first block, the own and the previous one; none past the own."""
        B, Hkv, G, Tq, _ = p_cmp.shape
        n_sel = -(-n_keys // self.length)
        importance = block_importance(p_cmp.mean(dim=2), n_sel, self.length, self.stride)   # (B, Hkv, Tq, n_sel)
        j = torch.arange(n_sel, device=q_rel.device)[None, :]
        own = torch.div(q_rel, self.length, rounding_mode="floor")[:, None]
        forced = (j == 0) | (j == own) | (j == own - 1)                                      # (Tq, n_sel)
        scores = torch.where(forced, 1.0, importance).masked_fill(j > own, float("-inf"))
        index, valid = choose_blocks(scores, self.topk)
        chosen = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, index, valid)      # (B, Hkv, Tq, n_sel)
        key_block = torch.arange(n_keys, device=q_rel.device) // self.length
        return chosen[..., key_block].repeat_interleave(G, dim=1)

    def kernel_cases(self) -> dict:
        """The window branch on the flash kernel (training, prefill and steps: keys in position order);
        the selected blocks as a token mask and the compressed branch's probabilities in PyTorch."""
        module, case = super().kernel_cases()["forward"]
        window = (module, {**case, "window": self.window})
        return {"window_forward": window, "window_decode": window,
                "selected": (module, {**case, "masked": True}),
                "compressed": (None, {"why": "nsa's selection reads the compressed branch's probabilities"})}

    def init_cache(self, batch_size, max_len, device, dtype):
        return NSACache(batch_size, self.n_kv_head, max_len, self.head_dim, self.length, self.stride, device, dtype)

    def cache_elems_for(self, n_tokens: int) -> int:
        """K/V per token plus one compressed K/V per complete block."""
        per_entry = 2 * self.n_kv_head * self.head_dim
        return per_entry * (n_tokens + n_blocks(n_tokens, self.length, self.stride))

    def keys_seen(self, seq_len: int) -> None:
        return None  # the selected blocks are chosen by content

    def keys_per_query(self, seq_len: int) -> int:
        """Keys (compressed ones included) the last query reads: every compressed key, nsa_topk blocks
        and the window, at most seq_len each."""
        return (n_blocks(seq_len, self.length, self.stride) + min(seq_len, self.topk * self.length)
                + min(seq_len, self.window))

    def mean_keys_per_query(self, seq_len: int) -> float:
        """Over positions 0..seq_len-1, causal pairs only: the compressed blocks complete at t, the own
        block causally and min(nsa_topk - 1, b) whole earlier blocks (the own block is always read:
        nsa_topk >= 3), and min(t + 1, window) keys of the window."""
        compressed = sum(n_blocks(t + 1, self.length, self.stride) for t in range(seq_len))
        window = sum(min(t + 1, self.window) for t in range(seq_len))
        selected = mean_keys_in_blocks(seq_len, self.length, lambda b: min(self.topk - 1, b))
        return (compressed + window) / seq_len + selected
