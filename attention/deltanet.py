"""DeltaNet and Gated DeltaNet: a fixed state written by the delta rule (attention=deltanet,
attention=gated_deltanet).

GLA's state can only add and decay; it cannot overwrite what a key stored before. The delta
rule writes by correcting (Schlag et al. 2021; parallel over the sequence: Yang et al. 2024),
and Gated DeltaNet adds a per-head decay (Yang et al., ICLR 2025):

    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T       S: (Dk, Dv) per head
    o_t = q_t S_t / sqrt(Dk)                                              alpha_t = 1 for deltanet

The layer, as flash-linear-attention's DeltaNet / GatedDeltaNet define it (one head size for
keys and values, the model's n_embd // n_head, where fla's gated layer doubles the values):

    x --c_attn--> [ q | k | v ]  (H*D each) --short causal conv (delta_conv taps, per channel)--> SiLU
    q, k <- L2-normalised per head (then RoPE, if pos_encoding=rope)
    beta = sigmoid(x W_beta)                                         (B, H, T): the write strength
                                                   (delta_beta=sigmoid2: 2 sigmoid, in (0, 2))
    g = -exp(A_log) * softplus(x W_a + dt_bias)   (gated only; Mamba-2's decay, alpha = exp(g))
    o = delta_rule(q, k, v, beta, g)                                  (B, H, T, D)
    y = c_proj( RMSNorm_per_head(o) * silu(x W_r) )                   the output norm and gate

Decoding keeps per layer the state (H, D, D) and the convolution's last delta_conv - 1 inputs
(delta_conv - 1, 3 H D), both fp32 and constant in size (attention/cache.py ConvStateCache); a
one-token call goes through `step`, forward's parts written for a batch-1 step.
The math lives in attn_kernels/delta_chunked.py (chunked WY form; one-token step) beside its naive
reference in attn_kernels/reference.py; no Triton kernel, so attention/dispatch.py records that
PyTorch runs (naive: the reference loop; otherwise the chunked form).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from attention import record
from attention.base import Attention, chunk_lengths, mean_keys_in_blocks
from attention.cache import ConvStateCache
from attention.short_conv import causal_conv, conv_weight
from attn_kernels.delta_chunked import chunk_delta_rule, recurrent_delta_step
from attn_kernels.gla_chunked import fp32, in_dtype
from attn_kernels.norms import l2_normalize, rms_norm_gated
from attn_kernels.reference import naive_recurrent_delta_rule

DT_MIN, DT_MAX = 1e-3, 1e-1  # Mamba-2's range for the initial step size dt = softplus(dt_bias)
A_MAX = 16.0                 # A = exp(A_log) drawn from U(0, A_MAX) at init (fla's GatedDeltaNet)


class DeltaNet(Attention):
    decodes_any_length = True  # a constant state
    owned_keys = ("delta_conv", "delta_chunk", "delta_beta")
    BETAS = ("sigmoid", "sigmoid2")

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.n_head = self.n_kv_head = config.n_head
        self.head_dim = D = config.n_embd // config.n_head
        H, C = self.n_head, config.n_embd
        self.c_attn = nn.Linear(C, 3 * H * D, bias=config.bias)
        self.conv_size, self.chunk = config.delta_conv, config.delta_chunk
        self.conv_weight = conv_weight(3 * H * D, self.conv_size)
        self.b_proj = nn.Linear(C, H, bias=config.bias)                   # beta
        self.beta_scale = 2.0 if config.delta_beta == "sigmoid2" else 1.0
        self.gated = config.attention == "gated_deltanet"
        if self.gated:  # Mamba-2's decay: A per head, dt from x with a bias that sets its initial range
            self.a_proj = nn.Linear(C, H, bias=False)
            self.A_log = nn.Parameter(torch.empty(H).uniform_(0, A_MAX).log())
            dt = torch.exp(torch.rand(H) * (math.log(DT_MAX) - math.log(DT_MIN)) + math.log(DT_MIN)).clamp(min=1e-4)
            self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)
        self.r_proj = nn.Linear(C, H * D, bias=config.bias)                # the output gate
        self.o_norm = nn.RMSNorm(D, eps=1e-5)
        self.setup_output_and_positions(config)

    @classmethod
    def check_config(cls, config):
        super().check_config(config)
        name = config.attention
        if config.pos_encoding not in ("rope", "sinusoidal", "none"):
            raise ValueError(f"attention={name} works with pos_encoding none (the papers'), rope or sinusoidal (no "
                             f"score matrix for alibi, no fixed context for learned), got {config.pos_encoding}")
        if config.n_kv_head not in (0, config.n_head):
            raise ValueError(f"attention={name} keeps one state per head: n_kv_head={config.n_kv_head} must be "
                             f"n_head={config.n_head} (or 0)")
        if config.delta_conv < 1:
            raise ValueError(f"delta_conv={config.delta_conv} must be at least 1 (taps of the short convolution; "
                             "4 in the papers, 1 = no mixing over time)")
        if config.delta_beta not in cls.BETAS:
            raise ValueError(f"unknown delta_beta={config.delta_beta!r}; choose one of {', '.join(cls.BETAS)}")
        if config.delta_chunk < 1:
            raise ValueError(f"delta_chunk={config.delta_chunk} must be at least 1 (16 is the default)")
        if config.attn_output_gate != "none":
            raise ValueError(f"attn_output_gate is for softmax attention; attention={name} has its own output gate")

    def forward(self, x, pos, cache=None):
        B, T, _ = x.shape
        if cache is not None and T == 1 and cache.pos > 0:
            return self.step(x, pos, cache)
        H, D = self.n_head, self.head_dim
        past = cache.conv if cache is not None else x.new_zeros(B, self.conv_size - 1, 3 * H * D)
        qkv, past = causal_conv(self.c_attn(x), self.conv_weight, past)
        # split, not slices (whose backward zeroes a copy of the whole input each: linear_family.project)
        qk, v = qkv.view(B, T, 3 * H, D).split([2 * H, H], dim=2)                       # [q: H | k: H], [v: H]
        qk, = self.rope(pos, l2_normalize(qk).transpose(1, 2))                          # q and k at once
        q, k, v = *qk.split([H, H], dim=1), v.transpose(1, 2)                           # (B, H, T, D)
        beta, g = self.gates(x)
        self.record(q, k, g, pos)
        state = cache.state if cache is not None and cache.pos > 0 else None
        rule = naive_recurrent_delta_rule if self.impl(x.device, "forward") == "naive" else self.chunked
        o, state = rule(q, k, v, beta, g, initial_state=state, output_final_state=cache is not None)
        if cache is not None:
            cache.update(state, fp32(past), T)
        return self.finish(o.transpose(1, 2), x)

    def step(self, x, pos, cache):
        """forward for one token against the cache's state (decoding): the same parts, written for a
        step at batch 1, where every op and function call costs more than its math. For T = 1 the
        convolved (B, 1, 3 H D) is already (B, heads, 1, D), the layout the recurrence reads: no
        transposes, one split."""
        B, H, D = x.size(0), self.n_head, self.head_dim
        qkv, past = causal_conv(F.linear(x, self.c_attn.weight, self.c_attn.bias), self.conv_weight, cache.conv)
        qk, v = qkv.view(B, 3 * H, 1, D).split_with_sizes([2 * H, H], dim=1)          # (B, heads, 1, D)
        q, k = self.rope(pos, l2_normalize(qk))[0].split_with_sizes([H, H], dim=1)
        beta, g = self.gates(x)
        self.record(q, k, g, pos)
        o, state = recurrent_delta_step(q, k, v, beta, g, cache.state)                 # (B, H, 1, D)
        cache.update(state, fp32(past), 1)
        return self.finish(o.view(B, 1, H, D), x)

    def gates(self, x):
        """x (B, T, C) -> the write strength beta (B, H, T) and the log-decay g (B, H, T), None for deltanet."""
        # F.linear, not the modules: at batch 1 a module's call costs about what its product does
        beta = torch.sigmoid(fp32(F.linear(x, self.b_proj.weight, self.b_proj.bias))).transpose(1, 2)
        if self.beta_scale != 1.0:
            beta = self.beta_scale * beta
        if not self.gated:
            return beta, None
        dt = F.softplus(fp32(F.linear(x, self.a_proj.weight)) + self.dt_bias)              # (B, T, H)
        return beta, (-fp32(self.A_log).exp() * dt).transpose(1, 2)                        # <= 0

    def record(self, q, k, g, pos):
        """analyze.py's weights: o_t = sum_j (alpha_{j+1} .. alpha_t) (q_t . k_j) u_j / sqrt(D), GLA's form over
        the corrected values u_j (attn_kernels/delta_chunked.py), so the same hook serves (only while recording)."""
        if record.state is not None:
            B, H, T, D = q.shape
            record.record_linear(q, k, None if g is None else g[..., None].expand(B, H, T, D), pos, scale=D ** -0.5)

    def finish(self, o, x):
        """The rule's output o (B, T, H, D) -> (B, T, C): o_norm and the output gate at once, c_proj."""
        B, T, _ = x.shape
        r = F.linear(x, self.r_proj.weight, self.r_proj.bias).view(B, T, self.n_head, -1)
        o = rms_norm_gated(in_dtype(o, x.dtype), self.o_norm.weight, r, self.o_norm.eps)   # (B, T, H, D)
        return self.resid_dropout(self.c_proj(o.reshape(B, T, -1)))

    def kernel_cases(self) -> dict:
        """"forward": the full-sequence form (no Triton kernel: PyTorch's chunked form, or the naive loop);
        "decode": one token against the state."""
        return {"forward": (None, {"why": "no Triton kernel for the delta rule: the chunked PyTorch form runs"}),
                "decode": (None, {"why": "a one-token step of the recurrence runs in PyTorch (no kernel needed)"})}

    def chunked(self, *args, **kwargs):
        return chunk_delta_rule(*args, chunk_size=self.chunk, **kwargs)

    def init_cache(self, batch_size, max_len, device, dtype):
        """The fp32 state and conv window; max_len is not needed (neither grows)."""
        H, D = self.n_head, self.head_dim
        return ConvStateCache((batch_size, H, D, D), (batch_size, self.conv_size - 1, 3 * H * D), device)

    def cache_elems_per_token(self) -> int:
        return 0  # constant state: see cache_state_elems

    def cache_state_elems(self) -> int:
        """Batch 1, whatever the length: the state H*D*D and the conv window (delta_conv - 1) * 3*H*D."""
        H, D = self.n_head, self.head_dim
        return H * D * D + (self.conv_size - 1) * 3 * H * D

    def keys_per_query(self, seq_len: int) -> None:
        return None  # reads a state, not keys

    def chunked_flops(self, product_keys: float, solve: float) -> float:
        """Training FLOPs per token of the chunked form (forward x 3), per head: the five chunk products
        K K^T, Q K^T, W = T K, U = T V and the scores times U' (2*D per key, product_keys keys in all),
        the triangular solve (`solve`), u = U - W S, q S and k^T u (2*D*D each), the conv (2 per tap
        and channel, 3*D channels)."""
        D = self.head_dim
        return 3 * self.n_head * (2 * D * product_keys + solve + 6 * D * D + 6 * self.conv_size * D)

    def attn_flops_per_token(self, seq_len: int) -> float:
        """As computed: every chunk product is triangular, so a query reads the earlier keys of its chunk,
        (chunk + 1) / 2 on average (one fewer in the strictly lower K K^T); the unit-triangular solve of
        (I + A) T = diag(beta) fills each row of T only up to the diagonal: (n^3 - n) / 3 per chunk of n."""
        keys = mean_keys_in_blocks(seq_len, self.chunk)
        solve = sum(n ** 3 - n for n in chunk_lengths(seq_len, self.chunk)) / 3 / seq_len
        return self.chunked_flops(5 * keys - 1, solve)

    def attn_flops_per_token_palm(self, seq_len: int) -> float:
        """PaLM's convention (MFU only): the chunk's whole square in each product and a dense solve."""
        C = min(self.chunk, seq_len)
        return self.chunked_flops(5 * C, C * C)
