"""Per-layer decoding caches. Each knows its absolute position and its allocated size.

SlidingCache: preallocated buffers with time on dim -2, sliding once full: the oldest
entries drop out and positions stay absolute, which RoPE and ALiBi need (their scores
depend only on position differences).

    buffer: (B, ..., max_len, D)   [ oldest ... newest | free ]
                                     <---- length ---->

RingCache (swa): the K/V of the last `window` tokens, slot p % window holding position p; a
step overwrites the oldest slot instead of shifting the buffer, so keys come back out of
position order, with their positions (`attend` goes by positions, not by order).

    slots:  [ p=8 | p=9 | p=6 | p=7 ]    window 4, next position 10: writes slot 10 % 4 = 2

KVCache (MHA/GQA/MQA, BigBird, MLA expanded): k (B, Hkv, max_len, Dk), v (B, Hkv, max_len, Dv)
LatentCache (MLA absorbed): rows [c_kv | k_rope] (B, max_len, kv_lora_rank + rope_head_dim)
StateCache (linear attention): a constant-size state, whatever the length.
ConvStateCache (deltanet, gated_deltanet): the same state plus the last conv_size - 1 inputs of
the short causal convolution (B, conv_size - 1, channels), both fp32 and constant in size.
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


class RingCache(Cache):
    def __init__(self, batch_size, n_kv_head, window, max_len, k_dim, v_dim, device, dtype):
        """At most `window` tokens (fewer slots when max_len, the longest sequence asked for, is shorter)."""
        self.slots = min(window, max_len)
        self.window = window
        self.k = torch.zeros(batch_size, n_kv_head, self.slots, k_dim, device=device, dtype=dtype)
        self.v = torch.zeros(batch_size, n_kv_head, self.slots, v_dim, device=device, dtype=dtype)
        self.pos = 0      # absolute position of the next token (a caller may start it anywhere)
        self.length = 0   # filled slots
        self.origin = 0   # the position of the first token written: slot (p - origin) % slots holds p

    def tensors(self):
        return (self.k, self.v)

    def slot_positions(self) -> torch.Tensor:
        """(length,) the position each filled slot holds: the latest p < pos in that slot."""
        slot = torch.arange(self.length, device=self.k.device)
        return self.pos - 1 - (self.pos - 1 - self.origin - slot) % self.slots

    def update(self, k, v):
        """Add (B, Hkv, T, D) new keys and values; return the keys and values the new queries may
        read (the cached ones, then the new) and their positions. One token is written first and
        the whole ring read (the slot it overwrites is one window back, out of its reach)."""
        T = k.size(-2)
        if self.slots < self.window and self.length + T > self.slots:
            raise ValueError(f"this cache was made for {self.slots} tokens, got {self.length + T}")
        if T == 1:
            self._write(k, v)
            return self.k[:, :, :self.length], self.v[:, :, :self.length], self.slot_positions()
        positions = torch.cat([self.slot_positions(), torch.arange(self.pos, self.pos + T, device=k.device)])
        keys = torch.cat([self.k[:, :, :self.length], k], dim=2)
        values = torch.cat([self.v[:, :, :self.length], v], dim=2)
        self._write(k, v)
        return keys, values, positions

    def _write(self, k, v):
        if self.length == 0:
            self.origin = self.pos
        T = k.size(-2)
        n = min(T, self.slots)  # of a prefill longer than the ring, only the last `slots` stay
        slots = (torch.arange(self.pos + T - n, self.pos + T, device=k.device) - self.origin) % self.slots
        self.k.index_copy_(2, slots, k[:, :, -n:])
        self.v.index_copy_(2, slots, v[:, :, -n:])
        self.pos += T
        self.length = min(self.length + T, self.slots)


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


class ConvStateCache(StateCache):
    """A recurrent state and a short convolution's window of past inputs, both fp32."""

    def __init__(self, shape, conv_shape, device):
        super().__init__(shape, device)
        self.conv = torch.zeros(*conv_shape, device=device, dtype=self.dtype)

    def tensors(self):
        return (self.state, self.conv)

    def update(self, state, conv, n_tokens: int):
        self.conv = conv
        super().update(state, n_tokens)
