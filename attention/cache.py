"""Per-layer decoding caches. Each knows its absolute position and its allocated size.

SlidingCache: preallocated buffers with time on dim -2, sliding once full: the oldest
entries drop out and positions stay absolute, which RoPE and ALiBi need (their scores
depend only on position differences).

    buffer: (B, ..., max_len, D)   [ oldest ... newest | free ]
                                     <---- length ---->

KVCache (MHA/GQA/MQA, BigBird, MLA expanded): k (B, Hkv, max_len, Dk), v (B, Hkv, max_len, Dv)
LatentCache (MLA absorbed): rows [c_kv | k_rope] (B, max_len, kv_lora_rank + rope_head_dim)
StateCache (linear attention): a constant-size state, whatever the length.
"""
import torch


class Cache:
    """Common bookkeeping: `pos` is the absolute position of the next token."""
    pos: int = 0

    def tensors(self):
        raise NotImplementedError

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def numel(self) -> int:
        return sum(t.numel() for t in self.tensors())


class SlidingCache(Cache):
    def __init__(self, shapes, max_len, device, dtype):
        """shapes: one (B, ..., D) shape per buffer; time (max_len) is inserted at dim -2."""
        self.buffers = [torch.zeros(*s[:-1], max_len, s[-1], device=device, dtype=dtype) for s in shapes]
        self.max_len = max_len
        self.length = 0   # valid entries
        self.pos = 0      # absolute position of the next token

    def tensors(self):
        return self.buffers

    def update(self, *new):
        """Append one (B, ..., T, D) tensor per buffer; return the valid part of every
        buffer followed by the positions (length,) of its entries."""
        T = new[0].size(-2)
        if T > self.max_len:
            raise ValueError(f"cannot append {T} tokens to a cache of {self.max_len}")
        overflow = self.length + T - self.max_len
        if overflow > 0:  # slide: drop the oldest `overflow` entries
            keep = self.length - overflow
            for buf in self.buffers:
                buf[..., :keep, :] = buf[..., overflow:self.length, :].clone()
            self.length = keep
        for buf, x in zip(self.buffers, new):
            buf[..., self.length:self.length + T, :] = x
        self.length += T
        self.pos += T
        positions = torch.arange(self.pos - self.length, self.pos, device=self.buffers[0].device)
        return (*(buf[..., :self.length, :] for buf in self.buffers), positions)


class KVCache(SlidingCache):
    def __init__(self, batch_size, n_kv_head, max_len, k_dim, v_dim, device, dtype):
        super().__init__([(batch_size, n_kv_head, k_dim), (batch_size, n_kv_head, v_dim)], max_len, device, dtype)


class LatentCache(SlidingCache):
    """One packed buffer of rows [c_kv | k_rope], so that attention reads the key as a view."""

    def __init__(self, batch_size, max_len, row_dim, device, dtype):
        super().__init__([(batch_size, row_dim)], max_len, device, dtype)


class StateCache(Cache):
    """A recurrent state (e.g. (B, H, Dk, Dv)) kept in fp32; `pos` counts tokens seen."""
    dtype = torch.float32  # whatever the model's dtype: the recurrence accumulates in fp32

    def __init__(self, shape, device):
        self.state = torch.zeros(*shape, device=device, dtype=self.dtype)
        self.pos = 0

    def tensors(self):
        return (self.state,)

    def update(self, state, n_tokens: int):
        """Keep the state after n_tokens more tokens, advancing `pos` as SlidingCache.update does."""
        self.state = state
        self.pos += n_tokens
