"""The Forgetting Transformer (FoX; Lin et al., ICLR 2025): softmax attention with a forget gate.

    f_t = sigmoid(x_t w_f + b_f)                 one gate per query head and token, in (0, 1)
    c_t = sum_{l <= t} log f_l                   (B, H, T), accumulated in fp32
    score(i, j) = q_i . k_j / sqrt(D) + c_i - c_j      for j <= i:  c_i - c_j = sum_{l=j+1..i} log f_l

ALiBi with a slope learned per token: with f fixed at exp(-m_h), c_i - c_j = -m_h (i - j), ALiBi's
bias of slope m_h (tests/test_fox.py). The paper trains it without positions (pos_encoding=none,
config/fox.py); rope, alibi and the others are taken too. Heads as in MHA/GQA/MQA (n_kv_head).

Decoding keeps K/V and each token's log f_l (H numbers per token, in the cache's dtype, as the
forward rounds them): a step recomputes c over the cached tokens (a cumulative sum from the
oldest one kept: only differences of c enter a score), so the cache per token per layer is
2 * n_kv_head * D + n_head.

fox_pro adds the paper's "Pro" block parts that touch attention: a per-head RMSNorm on q and k
(QK-norm) and the sigmoid output gate (attn_output_gate's). Off by default: the comparison with
MHA then differs in the forget gate alone (H * (C + 1) parameters per layer). The Pro variant's
KV-shift and output norm are not built.

Paths: `attend` with the bias c_i - c_j: triton (auto on CUDA) the flash kernel, which reads c per tile
(attn_kernels/flash_attn.py `forget=`: no T x T tensor, dc in its backward); sdpa one additive float
mask (B, H, Tq, Tk); naive the plain math. QKVAttention's kernel_cases: one case for training, prefill
and decoding steps.
"""
import torch.nn as nn
import torch.nn.functional as F

from attention.base import QKVAttention, attend
from attention.cache import SlidingCache

QK_NORM_EPS = 1e-6   # fox_pro's RMSNorm on each q and k head


class ForgettingAttention(QKVAttention):
    owned_keys = ("fox_pro",)

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.fgate = nn.Linear(config.n_embd, self.n_head, bias=True)   # f_t's logits, one per head
        self.q_norm = self.k_norm = None
        if config.fox_pro:
            self.q_norm = nn.RMSNorm(self.head_dim, eps=QK_NORM_EPS)
            self.k_norm = nn.RMSNorm(self.head_dim, eps=QK_NORM_EPS)
            if self.gate_proj is None:
                self.gate_proj = nn.Linear(config.n_embd, self.n_head * self.head_dim, bias=config.bias)

    @classmethod
    def check_config(cls, config):
        super().check_config(config)
        H, Hkv = config.n_head, config.n_kv_head
        if not (1 <= Hkv <= H and H % Hkv == 0):
            raise ValueError(f"attention=fox needs n_kv_head dividing n_head={H}, got n_kv_head={Hkv}")

    def project(self, x, pos):
        """QKVAttention.project, with fox_pro's QK-norm before RoPE."""
        if self.q_norm is None:
            return super().project(x, pos)
        B, T, _ = x.shape
        H, Hkv = self.n_head, self.n_kv_head
        heads = self.c_attn(x).view(B, T, H + 2 * Hkv, self.head_dim).transpose(1, 2)
        q, k = self.rope(pos, self.q_norm(heads[:, :H]), self.k_norm(heads[:, H:H + Hkv]))
        return q, k, heads[:, H + Hkv:]

    def forward(self, x, pos, cache=None):
        T = x.size(1)
        q, k, v = self.project(x, pos)                       # (B, H, T, D), (B, Hkv, T, D) x2
        # log f_t (B, H, T), rounded to K's dtype as the cache keeps it, so decoding sees the same numbers
        log_f = F.logsigmoid(self.fgate(x)).transpose(1, 2).to(k.dtype)
        k_pos = pos
        if cache is not None:
            k, v, log_f, k_pos = cache.update(k, v, log_f[..., None])
            log_f = log_f[..., 0]                            # (B, H, Tk): every token the cache holds
        c = log_f.float().cumsum(-1)                         # c_j up to a constant: differences only
        y = attend(q, k, v, pos, k_pos, alibi_slopes=self.alibi_slopes, forget=(c[..., -T:], c),
                   dropout_p=self.attn_dropout, impl=self.impl(x.device, "forward" if cache is None else "decode"),
                   sees_all_keys=cache is not None and T == 1)
        return self.output(y, x)

    def pair_flops(self) -> int:
        """MHA's q.k and p.v (4 D per pair and head) plus the bias c_i - c_j added to the score (2), x3 for training."""
        return 3 * (4 * self.head_dim + 2) * self.n_head

    def init_cache(self, batch_size, max_len, device, dtype):
        B, Hkv, D = batch_size, self.n_kv_head, self.head_dim
        return SlidingCache([(B, Hkv, D), (B, Hkv, D), (B, self.n_head, 1)], max_len, device, dtype)

    def cache_elems_per_token(self) -> int:
        return 2 * self.n_kv_head * self.head_dim + self.n_head

