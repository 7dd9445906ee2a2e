"""BigBird-style causal block-sparse attention: sliding window + global + random blocks.

The sequence is cut into blocks of `sparse_block` tokens. Query block i attends to
    window  blocks i-sparse_window+1 .. i (the diagonal block is masked token by token)
    global  blocks 0 .. sparse_global-1 (only those <= i: causal BigBird has no global rows)
    random  sparse_random blocks drawn from the earlier blocks j < i not already chosen
so every query sees at most (window + global + random) * sparse_block keys and the cost
is linear in the length. This is the "unidirectional" BigBird layout of DeepSpeed's
sparse attention, except that random blocks are drawn without repeating window/global
blocks (so they always add keys) and never include the diagonal block.

    layout (n_blocks x n_blocks, bool; window 2, global 1, random 1; x = selected;
            the random picks are one possible draw)
        key block ->  0 1 2 3 4 5
        query 0       x
              1       x x
              2       x x x          <- 0 global, 1-2 window: no earlier block left
              3       x x x x        <- 0 global, 1 random, 2-3 window
              4       x   x x x      <- 0 global, 2 random, 3-4 window
              5       x x     x x

The layout is drawn once per layer from a generator seeded by (sparse_seed, layer_idx)
and kept as a persistent buffer, so it is saved in state_dict and a loaded model keeps
the layout it was trained with. `block_idx` (n_blocks, max_selected) / `block_count`
(n_blocks,) list the selected key blocks per query block (ascending, padded), the form a
block-sparse kernel consumes; they are derived from `layout` and refreshed on load.

Paths (attention/dispatch.py decides what runs on each; all compute the same function):
- "forward", the keys are this sequence (training, a prefill into an empty cache):
  sdpa gathers the selected K/V blocks per query block and runs a masked softmax over them,
  work and memory O(T * selected keys); triton (or auto on CUDA; sparse_block >= 16, no
  attention dropout) runs attn_kernels/flash_attn.py, which visits only the layout's key blocks;
  naive is the dense reference, full attention with the token mask, via `attend`.
- "decode", new tokens against a KVCache holding earlier keys: `attend` over the cached keys
  with the token mask derived from the layout and the positions (masked: PyTorch). The cache
  keeps every key of the context (random blocks may reach back anywhere), so a step costs a
  dense step over at most block_size keys.

Positions and length. The layout is anchored at the oldest visible key: token p falls in
block (p - start) // sparse_block, where start is the first position in the cache (0
until the cache slides; 0 in training). Within block_size this is exactly the training
pattern. Past block_size, GPT.generate slides the cache over the last max_context
tokens (RoPE, ALiBi, none): the anchor moves with the window, so the global blocks are
the oldest tokens still visible (attention sinks) and a cached step sees exactly the
keys a recompute of the visible window would see (exact for one layer; deeper layers
keep K/V computed under the earlier window, as with dense sliding). Learned positions
recompute the last block_size tokens from position 0, the same anchoring. A window
longer than block_size has no layout and is refused (max_context <= block_size).
"""
import itertools
import math

import torch
import torch.nn.functional as F

from attention.base import QKVAttention, attend, mean_keys_in_blocks
from attention.positional import alibi_bias
from attn_kernels.gla_chunked import first_tokens


def n_blocks_for(config) -> int:
    return math.ceil(config.block_size / config.sparse_block)


def build_layout(n_blocks: int, window: int, n_global: int, n_random: int, generator) -> torch.Tensor:
    """The causal BigBird block pattern: bool (n_blocks, n_blocks), row = query block."""
    layout = torch.zeros(n_blocks, n_blocks, dtype=torch.bool)
    for i in range(n_blocks):
        layout[i, max(0, i - window + 1):i + 1] = True    # sliding window, diagonal included
        layout[i, :min(n_global, i + 1)] = True           # global blocks, never a later one
        earlier = (~layout[i, :i]).nonzero().flatten()    # earlier blocks not chosen yet
        # randperm runs even when nothing is left so that every row draws from the
        # generator in the same way, whatever the earlier rows picked
        pick = torch.randperm(len(earlier), generator=generator)[:n_random]
        layout[i, earlier[pick]] = True
    return layout


def selected_block_counts(n_blocks: int, window: int, n_global: int, n_random: int) -> list:
    """Blocks each query block of build_layout selects, without drawing the random ones:
    random blocks come from the earlier blocks not yet chosen, and the window (ending at i)
    meets the global blocks (starting at 0) only once together they cover 0..i, so query block
    i selects window + global + random blocks, or all its i + 1 causal blocks if fewer."""
    return [min(i + 1, window + n_global + n_random) for i in range(n_blocks)]


def layout_index(layout: torch.Tensor):
    """layout (n, n) -> block_idx (n, S) int64, key blocks ascending then padded with the
    diagonal block (always valid to gather; masked by count), and block_count (n,)."""
    n = layout.size(0)
    counts = layout.sum(dim=1)
    S = int(counts.max())
    # a stable sort of "not selected" puts the selected columns first, in ascending order
    order = torch.sort((~layout).to(torch.uint8), dim=1, stable=True).indices[:, :S]
    padding = torch.arange(S, device=layout.device)[None, :] >= counts[:, None]
    diagonal = torch.arange(n, device=layout.device)[:, None].expand(n, S)
    return torch.where(padding, diagonal, order), counts


class BlockSparseAttention(QKVAttention):
    owned_keys = ("sparse_block", "sparse_window", "sparse_global", "sparse_random", "sparse_seed")
    context_within_block_size = True  # the layout has no blocks past block_size

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.block_size = config.block_size       # longest sequence / cache the layout covers
        self.sparse_block = config.sparse_block
        # the layout's rules, kept for the FLOPs count (mean_keys_per_query)
        self.sparse_window, self.sparse_global, self.sparse_random = (config.sparse_window, config.sparse_global,
                                                                      config.sparse_random)
        n = n_blocks_for(config)
        self.register_buffer("block_idx", torch.empty(0, dtype=torch.long), persistent=False)
        self.register_buffer("block_count", torch.empty(0, dtype=torch.long), persistent=False)
        if torch.get_default_device().type == "meta":
            # Built for its shapes and costs only (plan.py): drawing the layout takes O(n^2)
            # per layer, seconds at long block_size, and no data exists to draw it on.
            self.register_buffer("layout", torch.empty(n, n, dtype=torch.bool))
            counts = selected_block_counts(n, config.sparse_window, config.sparse_global, config.sparse_random)
            self._max_selected = list(itertools.accumulate(counts, max))
        else:
            # seeded by (sparse_seed, layer_idx): reproducible, and each layer gets its own draw
            gen = torch.Generator().manual_seed(config.sparse_seed * 1_000_003 + layer_idx)
            layout = build_layout(n, config.sparse_window, config.sparse_global, config.sparse_random, gen)
            self.register_buffer("layout", layout)                                   # persistent
            self._refresh_index()
        self.register_load_state_dict_post_hook(lambda module, incompatible: module._refresh_index())

    @classmethod
    def check_config(cls, config):
        """One-line ValueError for settings that have no layout."""
        super().check_config(config)
        b = config.sparse_block
        if b < 1 or b & (b - 1) or b > config.block_size:
            raise ValueError(f"sparse_block={b} must be a power of two no larger than block_size={config.block_size}")
        n = n_blocks_for(config)
        if config.sparse_window < 1:
            raise ValueError(f"sparse_window={config.sparse_window} must be at least 1 "
                             "(it includes the diagonal block)")
        if not 0 <= config.sparse_global <= n:
            raise ValueError(f"sparse_global={config.sparse_global} must be between 0 and the {n} blocks of block_size")
        if not 0 <= config.sparse_random <= n - 1:
            raise ValueError(f"sparse_random={config.sparse_random} must be between 0 and {n - 1} "
                             f"(the earlier blocks of the last of {n} blocks)")

    def _refresh_index(self):
        """Derive the per-query-block key lists from `layout` (at init and after loading)."""
        layout = self.layout
        if not (layout.diagonal().all() and not layout.triu(1).any()):
            raise ValueError("a BigBird layout must select the diagonal block and no later block")
        self.block_idx, self.block_count = layout_index(layout)
        # max selected blocks among the first m query blocks, for sequences shorter than
        # block_size: a python list, so the forward never syncs to read it
        self._max_selected = torch.cummax(self.block_count.cpu(), dim=0).values.tolist()

    def forward(self, x, pos, cache=None):
        T = x.size(1)
        q, k, v = self.project(x, pos)                       # (B, H, T, D), (B, Hkv, T, D) x2
        dropout_p = self.attn_dropout
        k_pos = pos
        if cache is not None:
            k, v, k_pos = cache.update(k, v)
        if T > self.block_size:
            raise ValueError(f"bigbird's block layout covers block_size={self.block_size} tokens, got {T}")
        impl = self.impl(x.device, "forward" if k.size(2) == T else "decode")
        if impl == "naive" or k.size(2) > T:  # the reference, or new tokens against a cache: the token mask
            y = self.attend_dense(q, k, v, pos, k_pos, dropout_p=dropout_p, impl=impl)
        elif impl == "triton":
            # the flash kernel visits only the layout's key blocks (its tiles are our blocks)
            from attn_kernels.flash_attn import flash_attention
            nb = -(-T // self.sparse_block)
            y = flash_attention(q, k, v, causal=True, alibi_slopes=self.alibi_slopes,
                                block_layout=self.layout[:nb, :nb], block_size=self.sparse_block)
        else:                 # the keys are this sequence (training, or a prefill): gather
            y = self.attend_sparse(q, k, v, dropout_p=dropout_p)
        return self.output(y, x)

    def kernel_cases(self) -> dict:
        """"forward": the flash kernel's tiles are the layout's blocks; "decode": the token mask over
        the cached keys (masked, so PyTorch)."""
        module, case = super().kernel_cases()["forward"]
        return {"forward": (module, {**case, "layout_block": self.sparse_block}),
                "decode": (module, {**case, "masked": True})}

    def keys_per_query(self, seq_len: int) -> int:
        """Keys each query scores on the gathered path over seq_len tokens: every key of the
        most blocks any query block selects (masked ones included), at most seq_len."""
        n = self._max_selected[min(len(self._max_selected), -(-seq_len // self.sparse_block)) - 1]
        return min(seq_len, n * self.sparse_block)

    def mean_keys_per_query(self, seq_len: int) -> float:
        """Keys of the selected blocks, causal pairs only, averaged over positions: query block b reads
        its diagonal block causally and its other selected blocks, all earlier and whole (random blocks
        come from the earlier ones), whatever the draw: selected_block_counts gives how many."""
        counts = selected_block_counts(-(-seq_len // self.sparse_block), self.sparse_window, self.sparse_global,
                                       self.sparse_random)
        return mean_keys_in_blocks(seq_len, self.sparse_block, lambda b: counts[b] - 1)

    # ---- the token-level mask and the dense path (reference and decoding) ----
    def token_keep(self, q_pos, k_pos):
        """bool (Tq, Tk): key j is in one of the blocks selected for query i's block,
        blocks counted from the oldest visible key k_pos[0] (causality is `attend`'s)."""
        start = k_pos[0]
        q_blk = torch.div(q_pos - start, self.sparse_block, rounding_mode="floor")
        k_blk = torch.div(k_pos - start, self.sparse_block, rounding_mode="floor")
        return self.layout[q_blk][:, k_blk]

    def keys_seen(self, seq_len: int) -> torch.Tensor:
        """The chosen blocks' tokens, causal."""
        pos = torch.arange(seq_len, device=self.layout.device)
        return (self.token_keep(pos, pos) & (pos[None, :] <= pos[:, None])).cpu()

    def attend_dense(self, q, k, v, q_pos, k_pos, dropout_p=0.0, impl="sdpa"):
        """Full attention restricted by the token mask: O(Tq * Tk), for tests and decoding."""
        return attend(q, k, v, q_pos, k_pos, alibi_slopes=self.alibi_slopes,
                      keep=self.token_keep(q_pos, k_pos), dropout_p=dropout_p, impl=impl)

    # ---- the gathered block-sparse path (training) ----
    def attend_sparse(self, q, k, v, dropout_p=0.0):
        """q (B, H, T, D), k, v (B, Hkv, T, D) of one sequence starting at position 0 of the
        layout -> (B, H, T, D). Work and memory are O(T * S * blk) for S selected blocks.

            k, v   (B, Hkv, T, D) -pad-> (B, Hkv, nb, blk, D) -gather block_idx->
                   (B, Hkv, nb, S*blk, D)      keys of the S selected blocks, per query block
            q      (B, H, T, D) -> (B, Hkv, nb, G*blk, D)   the G = H/Hkv query heads sharing
                   a KV head are stacked as extra rows, so K/V are gathered once per KV head
            scores (B, Hkv, nb, G*blk, S*blk)
        """
        B, H, T, D = q.shape
        Hkv, blk = k.size(1), self.sparse_block
        G = H // Hkv
        nb = math.ceil(T / blk)
        S = self._max_selected[nb - 1]
        pad = nb * blk - T
        if pad:  # pad the last block; padded keys are masked, padded query rows dropped
            q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        idx = self.block_idx[:nb, :S]                                  # (nb, S)
        k = k.reshape(B, Hkv, nb, blk, D).index_select(2, idx.flatten()).reshape(B, Hkv, nb, S * blk, D)
        v = v.reshape(B, Hkv, nb, blk, D).index_select(2, idx.flatten()).reshape(B, Hkv, nb, S * blk, D)
        q = q.reshape(B, Hkv, G, nb, blk, D).transpose(2, 3).reshape(B, Hkv, nb, G * blk, D)

        # positions of the rows and of the gathered keys, and which pairs count
        offs = torch.arange(blk, device=q.device)
        q_pos = torch.arange(nb * blk, device=q.device).view(nb, blk, 1)            # (nb, blk, 1)
        k_pos = (idx[:, :, None] * blk + offs).view(nb, 1, S * blk)                 # (nb, 1, S*blk)
        slot_used = (torch.arange(S, device=q.device) < self.block_count[:nb, None])  # (nb, S)
        keep = slot_used.repeat_interleave(blk, dim=1)[:, None, :] & (k_pos <= q_pos) & (k_pos < T)
        keep = keep.repeat(1, G, 1)                                                 # (nb, G*blk, S*blk)

        # the one softmax of this path: scaled scores (+ ALiBi) over the gathered keys, masked.
        # The scores, (B, H, T, S*blk), are the largest tensors here: the scale goes on q,
        # and the rest is in place where autograd allows (bmm keeps its inputs, not its output).
        scores = ((q * (1.0 / math.sqrt(D))) @ k.transpose(-1, -2)).float()
        if self.alibi_slopes is not None:
            # alibi_bias(slopes, d, 0) = -m_h * d for the query-key distances d
            dist = (q_pos - k_pos).flatten()
            bias = alibi_bias(self.alibi_slopes, dist, dist.new_zeros(1))          # (H, N, 1)
            scores.add_(bias.view(Hkv, G, nb, blk, S * blk).transpose(1, 2).reshape(Hkv, nb, G * blk, S * blk))
        probs = scores.masked_fill_(~keep, float("-inf")).softmax(dim=-1)
        if dropout_p > 0:
            probs = F.dropout(probs, p=dropout_p)
        y = probs.to(v.dtype) @ v                                                   # (B, Hkv, nb, G*blk, D)
        y = y.view(B, Hkv, nb, G, blk, D).transpose(2, 3).reshape(B, H, nb * blk, D)
        return first_tokens(y, T)

    # ---- decoding ----
    def init_cache(self, batch_size, max_len, device, dtype):
        if max_len > self.block_size:
            raise ValueError(f"bigbird decodes with at most block_size={self.block_size} tokens of context "
                             f"(its block layout's length), got {max_len}; lower max_context")
        return super().init_cache(batch_size, max_len, device, dtype)
