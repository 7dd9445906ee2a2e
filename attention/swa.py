"""Sliding-window attention (Mistral 7B, Gemma's local layers; Longformer's causal window).

Each query sees the last `sliding_window` tokens, itself included:

    query i sees key j  iff  i - W < j <= i          (W = sliding_window)

    W = 3      key ->  0 1 2 3 4 5
        query 0        x
              1        x x
              2        x x x
              3          x x x
              4            x x x
              5              x x x

Heads as in MHA/GQA/MQA (n_kv_head sets the KV heads; default all). A layer's output at
position i depends on its input at i-W+1..i only, so decoding keeps the K/V of the last W
tokens of each layer (attention/cache.py RingCache): cache bytes per sequence stop growing at
W tokens, and a sequence of any length decodes exactly as a full forward over all of it (the
receptive field still grows by W-1 tokens per layer, through the earlier layers' outputs).

Paths (attention/dispatch.py decides; all compute the same function):
- triton (auto on CUDA): attn_kernels/flash_attn.py with window=W visits only the key tiles that
  reach into the window and masks the window's edge token by token.
- sdpa: chunks of W queries against their own and the previous chunk (2W keys), batched, so
  work and memory are O(T * W); a sequence of at most 2W tokens takes the dense masked form.
- naive: the dense masked reference, through `attend`.
- decoding (the "decode" path: new tokens against a ring that holds earlier keys): `attend`
  over the ring's keys with the window mask (positions, not slot order), in PyTorch: the
  kernel wants keys in position order. A prefill into an empty ring takes the "forward" path.
"""
import torch

from attention.base import QKVAttention, attend
from attention.cache import RingCache
from attn_kernels.gla_chunked import first_tokens


class SlidingWindowAttention(QKVAttention):
    owned_keys = ("sliding_window",)
    decodes_any_length = True  # the cache keeps everything a step needs, whatever the length

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.window = config.sliding_window

    @classmethod
    def check_config(cls, config):
        super().check_config(config)
        if config.sliding_window < 1:
            raise ValueError(f"sliding_window={config.sliding_window} must be at least 1 (the query itself)")
        if config.pos_encoding == "learned":
            raise ValueError("attention=swa decodes any length, which learned positions (a block_size table) "
                             "cannot; use pos_encoding rope, alibi, sinusoidal or none")

    def forward(self, x, pos, cache=None):
        T = x.size(1)
        q, k, v = self.project(x, pos)                       # (B, H, T, D), (B, Hkv, T, D) x2
        if cache is not None:
            k, v, k_pos = cache.update(k, v)                 # ring order; k_pos says where each key sits
            if k.size(2) > T:                                # earlier keys too: the "decode" path
                y = attend(q, k, v, pos, k_pos, alibi_slopes=self.alibi_slopes, window=self.window,
                           impl=self.impl(x.device, "decode"))
                return self.output(y, x)
        impl = self.impl(x.device)                           # the keys are this sequence, in order
        if impl == "sdpa" and T > 2 * self.window:
            y = self.attend_chunked(q, k, v, pos)
        else:
            window = self.window if T > self.window else None  # a window as long as the sequence binds nothing
            y = attend(q, k, v, pos, pos, alibi_slopes=self.alibi_slopes, window=window,
                       dropout_p=self.attn_dropout, impl=impl)
        return self.output(y, x)

    def attend_chunked(self, q, k, v, pos):
        """q (B, H, T, D), k, v (B, Hkv, T, D) at consecutive positions -> (B, H, T, D) in O(T * W).

            chunks of W:   q   [ c0 | c1 | c2 | ... ]          chunk i's queries need keys back to
                           k   [ c0 | c1 | c2 | ... ]          i*W - W + 1: chunks i-1 and i hold them
            chunk 0 alone (plain causal), then chunks 1.. batched: queries (B*(n-1), H, W, D) against
            keys [c_{i-1} | c_i] (B*(n-1), Hkv, 2W, D) at relative positions W..2W-1 and 0..2W-1:
            causality, the window and ALiBi depend only on differences, so one mask serves all chunks.
        """
        B, H, T, D = q.shape
        W, Hkv = self.window, k.size(1)
        n = -(-T // W)
        pad = n * W - T  # padded keys are later than every real query: causality hides them
        q, k, v = (torch.nn.functional.pad(t, (0, 0, 0, pad)) if pad else t for t in (q, k, v))
        first = attend(q[:, :, :W], k[:, :, :W], v[:, :, :W], pos[:W], pos[:W],
                       alibi_slopes=self.alibi_slopes, dropout_p=self.attn_dropout)

        def chunks(t, heads):  # (B, heads, n*W, D) -> (B, heads, n, W, D)
            return t.view(B, heads, n, W, t.size(-1))

        def fold(t):           # (B, heads, m, L, D) -> (B*m, heads, L, D)
            return t.transpose(1, 2).reshape(-1, t.size(1), t.size(3), t.size(4))

        kc, vc = chunks(k, Hkv), chunks(v, Hkv)
        pairs_k = torch.cat([kc[:, :, :-1], kc[:, :, 1:]], dim=3)          # (B, Hkv, n-1, 2W, D)
        pairs_v = torch.cat([vc[:, :, :-1], vc[:, :, 1:]], dim=3)
        rel = torch.arange(2 * W, device=q.device)
        rest = attend(fold(chunks(q, H)[:, :, 1:]), fold(pairs_k), fold(pairs_v), rel[W:], rel,
                      alibi_slopes=self.alibi_slopes, window=W, dropout_p=self.attn_dropout)
        rest = rest.view(B, n - 1, H, W, -1).transpose(1, 2).reshape(B, H, (n - 1) * W, -1)
        return first_tokens(torch.cat([first, rest], dim=2), T)

    def init_cache(self, batch_size, max_len, device, dtype):
        return RingCache(batch_size, self.n_kv_head, self.window, max_len, self.head_dim, self.head_dim,
                         device, dtype)

    def cache_max_tokens(self) -> int:
        return self.window

    def keys_seen(self, seq_len: int) -> torch.Tensor:
        """The band i - W < j <= i."""
        pos = torch.arange(seq_len)
        return (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - self.window)

    def keys_per_query(self, seq_len: int) -> int:
        return min(seq_len, self.window)

    def mean_keys_per_query(self, seq_len: int) -> float:
        """Query t reads min(t + 1, W) keys: the first W queries fill the window, the rest read all of it."""
        W = min(seq_len, self.window)
        return (W * (W + 1) / 2 + (seq_len - W) * W) / seq_len

    def kernel_cases(self) -> dict:
        module, case = super().kernel_cases()["forward"]
        return {"forward": (module, {**case, "window": self.window}),
                "decode": (None, {"why": "swa decoding reads its ring cache out of position order"})}
