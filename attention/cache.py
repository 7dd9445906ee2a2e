"""Per-layer decoding caches. Each knows its absolute position and its allocated size.

KVCache: preallocated keys and values of the KV heads only (so GQA/MQA cache less),
sliding once full: the oldest entries drop out and the positions stay absolute, which
RoPE and ALiBi need (their scores depend only on position differences).

    k: (B, Hkv, max_len, Dk)     v: (B, Hkv, max_len, Dv)
       [ oldest ... newest | free ]
         <---- length ---->
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


class KVCache(Cache):
    def __init__(self, batch_size, n_kv_head, max_len, k_dim, v_dim, device, dtype):
        self.k = torch.zeros(batch_size, n_kv_head, max_len, k_dim, device=device, dtype=dtype)
        self.v = torch.zeros(batch_size, n_kv_head, max_len, v_dim, device=device, dtype=dtype)
        self.max_len = max_len
        self.length = 0   # valid entries
        self.pos = 0      # absolute position of the next token

    def tensors(self):
        return (self.k, self.v)

    def update(self, k_new, v_new):
        """Append (B, Hkv, T, D) keys/values; return all valid keys, values and their positions."""
        T = k_new.size(2)
        if T > self.max_len:
            raise ValueError(f"cannot append {T} tokens to a cache of {self.max_len}")
        overflow = self.length + T - self.max_len
        if overflow > 0:  # slide: drop the oldest `overflow` entries
            keep = self.length - overflow
            self.k[:, :, :keep] = self.k[:, :, overflow:self.length].clone()
            self.v[:, :, :keep] = self.v[:, :, overflow:self.length].clone()
            self.length = keep
        self.k[:, :, self.length:self.length + T] = k_new
        self.v[:, :, self.length:self.length + T] = v_new
        self.length += T
        self.pos += T
        k_pos = torch.arange(self.pos - self.length, self.pos, device=self.k.device)
        return self.k[:, :, :self.length], self.v[:, :, :self.length], k_pos
