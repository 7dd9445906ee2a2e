"""The linear-attention family's shared layer: each member (attention=gla, linear, retnet, efficient)
is a recipe of four parts over one recurrence (flash-linear-attention's layout: layers wire, ops
compute; the ops are attn_kernels/gla_chunked.py, attn_kernels/gla.py and attn_kernels/reference.py).

Softmax attention is replaced by a recurrence over a fixed-size state per KV head:

    S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t        S: (Dk, Dv), g_t <= 0 the log-decay
    o_t = scale * q_t S_t

so decoding keeps one (Dk, Dv) matrix per head instead of a cache that grows with the context.
The parts (Recipe), each built once in __init__ and applied in forward without knowing the others:

    decay        data: g = logsigmoid(W2 W1 x) / 16, a rank-16 projection (GLA);
                 fixed: g = log gamma_h, gamma_h = 1 - 2^(-5-h) per KV head (RetNet);
                 none: g = 0, nothing is forgotten (o = Q (K^T V) masked causally)
    feature map  identity | elu (elu + 1, Katharopoulos et al. 2020) | relu | softmax: Efficient
                 Attention's pair (Shen et al. 2021), softmax over each query's features and each key
                 feature's exp over the keys seen so far, stable by a running max (attn_kernels/gla_chunked.py
                 softmax_pair_inputs)
    normaliser   rms: per-head RMSNorm of o; sum: o_t / (phi(q_t) . sum_j decayed phi(k_j)),
                 Katharopoulos et al.'s, carried as one more value channel of ones (positive maps only,
                 no RoPE); none
    output gate  swish: o * silu(x W_r) | none

The layer (flash-linear-attention's GatedLinearAttention, without its expansion factors):

    x --c_attn--> [ q: H*D | k: Hkv*D | v: Hkv*D | r: H*D ]      (r: the output gate; none: no r)
    x --gk_proj (C->16->Hkv*D)--> logsigmoid / 16 = g             (decay=data only)
    [q | k | v] <- SiLU(short causal conv)                        (gla_conv taps; 0, the default: none)
    q, k <- phi(q), phi(k), then RoPE (if pos_encoding=rope)
    o = GLA(q, k, v, g)           (B, H, T, D); query head h reads KV head h // (H/Hkv)
    y = c_proj( norm(o) * silu(r) )

Every member builds the same modules under the same names in the same order (c_attn, gk_proj,
o_norm, c_proj), so a recipe's weights are drawn alike and load alike whichever name built it.
attention/dispatch.py decides what runs for the full sequence (training, prefill), from attn_impl
and attn_kernels.gla.supports:
    naive    attn_kernels.reference.naive_recurrent_gla, a Python loop over time (the reference)
    sdpa     attn_kernels.gla_chunked.chunk_gla, the chunked parallel form in PyTorch (the default
             off CUDA; also where the kernel cannot take gla_chunk: powers of two >= 16 only)
    triton   attn_kernels.gla.chunk_gla, the same chunked form as a Triton kernel (auto on CUDA; on
             CPU under the interpreter). Imported on first use, so CPU users never need Triton.
Decoding one token runs attn_kernels.gla_chunked.recurrent_gla_step against the state, whatever
attn_impl says, through `step`: forward's parts written for a batch-1 step, whose cost is its op
count (docs/speed.md, "One-token steps"); the tests hold it to the full forward.

A new member (e.g. a delta rule) is a short file with a subclass: its recipe, or its own parts
where the recurrence differs (override `recur`), and one line in attention/__init__.py.
"""
import functools
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from attention.base import Attention, mean_keys_in_blocks
from attention.cache import ConvStateCache, StateCache
from attention.record import record_linear
from attention.short_conv import causal_conv, conv_weight
from attn_kernels.gla_chunked import chunk_gla, fp32, in_dtype, in_fp32, recurrent_gla_step, softmax_pair_inputs
from attn_kernels.norms import rms_norm_gated
from attn_kernels.reference import naive_recurrent_gla

GATE_LOW_RANK = 16     # rank of the decay projection W2 W1 (the paper's 16)
GATE_NORMALIZER = 16   # g = logsigmoid(.) / 16: decays start near 1 (exp(-log2/16) ~ 0.958)
SUM_EPS = 1e-6         # Katharopoulos et al.'s: a relu query may see no positive key feature yet
# phi on q and k; softmax is the pair, applied to the recurrence's inputs (recur), not here
FEATURE_MAPS = {"identity": None, "elu": lambda t: F.elu(t) + 1, "relu": F.relu, "softmax": None}
DECAYS = ("data", "fixed", "none")
NORMS = ("rms", "sum", "none")
OUTPUT_GATES = ("swish", "none")


@dataclass(frozen=True)
class Recipe:
    """One member of the family: its four parts (see the module docstring)."""
    decay: str
    feature_map: str
    norm: str
    output_gate: str


def fixed_log_decay(n_kv_head: int) -> torch.Tensor:
    """RetNet's multi-scale decays, log gamma_h with gamma_h = 1 - 2^(-5-h), one per KV head."""
    return (1 - 2.0 ** (-5 - torch.arange(n_kv_head, dtype=torch.float32))).log()


class LinearFamilyAttention(Attention):
    """The shared layer; a member sets `recipe` (or computes it from config: recipe_of)."""
    decodes_any_length = True  # a constant state
    owned_keys = ("gla_chunk", "gla_conv")
    recipe: Recipe = None

    @classmethod
    def recipe_of(cls, config) -> Recipe:
        return cls.recipe

    @classmethod
    def part(cls, config, name: str) -> str:
        """How a message names one of the recipe's parts: a fixed member by its attention= name."""
        return f"attention={config.attention}'s {name} {getattr(cls.recipe_of(config), name)}"

    def __init__(self, config, layer_idx: int):
        super().__init__()
        recipe = self.recipe_of(config)
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_dim = D = config.n_embd // config.n_head
        H, Hkv = self.n_head, self.n_kv_head
        self.gated = recipe.output_gate == "swish"
        self.c_attn = nn.Linear(config.n_embd, ((2 if self.gated else 1) * H + 2 * Hkv) * D, bias=config.bias)
        # Low-rank decay projection; its second bias sets each channel's base decay rate
        # (the paper and flash-linear-attention keep it whatever config.bias says).
        self.gk_proj = None
        if recipe.decay == "data":
            self.gk_proj = nn.Sequential(nn.Linear(config.n_embd, GATE_LOW_RANK, bias=False),
                                         nn.Linear(GATE_LOW_RANK, Hkv * D, bias=True))
        # Linear attention's output has no softmax bounding its scale; the per-head RMSNorm
        # (weights shared by the heads, as in flash-linear-attention) restores it, or the sum
        # normaliser divides by phi(q_t) . sum_j phi(k_j) (carried as one more value channel).
        self.o_norm = nn.RMSNorm(D, eps=1e-5) if recipe.norm == "rms" else nn.Identity()
        self.sum_normalised = recipe.norm == "sum"
        fixed = fixed_log_decay(Hkv) if recipe.decay == "fixed" else None
        self.register_buffer("fixed_log_decay", fixed, persistent=False)
        self.setup_output_and_positions(config)
        self.phi, self.pair = FEATURE_MAPS[recipe.feature_map], recipe.feature_map == "softmax"
        self.feature_map, self.chunk = recipe.feature_map, config.gla_chunk
        # fla's use_short_conv: one filter per channel of q, k and v (built last: the default's weights
        # are drawn as before)
        self.conv_size = config.gla_conv
        self.conv_weight = conv_weight((H + 2 * Hkv) * D, self.conv_size) if self.conv_size else None

    @classmethod
    def check_config(cls, config):
        """The rules every member shares, on its recipe (one line each)."""
        super().check_config(config)
        recipe = cls.recipe_of(config)
        # sinusoidal is added to the embeddings and defined at every position, like rope and none
        if config.pos_encoding not in ("rope", "sinusoidal", "none"):
            raise ValueError(f"attention={config.attention} works with pos_encoding rope, sinusoidal or none (no "
                             f"score matrix for alibi, no fixed context for learned), got {config.pos_encoding}")
        if config.attn_output_gate != "none":
            raise ValueError("attn_output_gate is for softmax attention; the linear family has its own output "
                             "gate (attention=gla: gla_output_gate=swish|none)")
        if recipe.norm == "sum" and recipe.feature_map == "identity":
            raise ValueError(f"{cls.part(config, 'norm')} divides by phi(q) . sum phi(k), which the identity map "
                             "can make zero or negative; use gla_feature_map=elu or relu (positive)")
        if recipe.feature_map == "softmax" and recipe.norm == "sum":
            raise ValueError(f"{cls.part(config, 'feature_map')} normalises itself (over the keys seen, per "
                             "feature); use gla_norm rms or none")
        if recipe.feature_map == "softmax" and config.pos_encoding == "rope":
            raise ValueError(f"{cls.part(config, 'feature_map')} normalises itself and exponentiates q and k, "
                             "which RoPE's rotation would mix; use pos_encoding sinusoidal or none")
        if recipe.norm == "sum" and config.pos_encoding == "rope":
            raise ValueError(f"{cls.part(config, 'norm')} divides by phi(q) . sum phi(k), which RoPE's rotation "
                             "can make zero or negative; use pos_encoding sinusoidal or none")
        if config.gla_chunk < 1:
            raise ValueError(f"gla_chunk={config.gla_chunk} must be at least 1 (64 is the default)")
        if config.gla_conv < 0:
            raise ValueError(f"gla_conv={config.gla_conv} must be at least 0 (taps of the short convolution; "
                             "0 = none, 4 in fla)")

    # ---- the parts, in the order forward applies them ----
    def project(self, x, pos, past=None):
        """x -> q (B, H, T, D), k, v (B, Hkv, T, D), r (B, T, H, D) or None (no output gate), with phi and
        RoPE applied to q and k at once (views of one tensor of H + Hkv heads: half the small ops), and
        the convolution's next window of past inputs (None without one; past: this call's, None = zeros)."""
        B, T, _ = x.shape
        H, Hkv, D = self.n_head, self.n_kv_head, self.head_dim
        heads = self.c_attn(x).view(B, T, -1, D)                       # [q: H | k: Hkv | v: Hkv | r: H]
        # split, never slices: a slice's backward writes its gradient into a zeroed copy of the whole
        # input (one per slice, then summed); split's is one cat (GLA's CPU step ~10% faster at the recall shape)
        qkv, r = heads.split([H + 2 * Hkv, H if self.gated else 0], dim=2)
        if self.conv_weight is not None:
            flat = qkv.flatten(2)                                          # (B, T, (H + 2 Hkv) D)
            past = flat.new_zeros(B, self.conv_size - 1, flat.size(-1)) if past is None else past
            qkv, past = causal_conv(flat, self.conv_weight, past)
            qkv = qkv.view(B, T, -1, D)
        qk, v = qkv.split([H + Hkv, Hkv], dim=2)
        qk = qk.transpose(1, 2)
        if self.phi is not None:
            qk = self.phi(qk)
        qk, = self.rope(pos, qk)  # after phi, so q.k keeps RoPE's relative-position form
        q, k = qk.split([H, Hkv], dim=1)
        return q, k, v.transpose(1, 2), (r if self.gated else None), past

    def decay(self, x):
        """The log-decay g (B, Hkv, T, D) (fixed: a broadcast view of one value per head), or None."""
        B, T, _ = x.shape
        Hkv, D = self.n_kv_head, self.head_dim
        if self.gk_proj is not None:  # F.linear, not the modules: at batch 1 a module call costs what its product does
            low, up = self.gk_proj
            z = F.linear(F.linear(x, low.weight), up.weight, up.bias)
            return F.logsigmoid(fp32(z)).div_(GATE_NORMALIZER).view(B, T, Hkv, D).transpose(1, 2)
        if self.fixed_log_decay is not None:
            return self.fixed_log_decay.view(1, Hkv, 1, 1).expand(B, Hkv, T, D)
        return None

    def recur(self, q, k, v, g, pos, cache, past=None):
        """The recurrence over this call's tokens, from the cache's state (if any), updating it (and the
        convolution's window of past inputs, if any)."""
        state, scale = (cache.state if cache is not None and cache.pos > 0 else None), self.head_dim ** -0.5
        if self.pair:  # the softmax pair becomes GLA's inputs (attn_kernels/gla_chunked.py)
            q, k, g, state, tail = softmax_pair_inputs(q, k, g, state)
            scale = 1.0
        record_linear(q, k, g, pos, scale=scale)  # no-op unless analyze.py records (attention/record.py)
        if cache is not None and q.size(2) == 1 and state is not None:
            o, state = recurrent_gla_step(q, k, v, g, state, scale=scale)
        else:
            o, state = self._full_sequence_gla(q.device)(q, k, v, g, scale=scale, initial_state=state,
                                                         output_final_state=cache is not None)
        if cache is not None:
            state = torch.cat([state, tail], dim=-1) if self.pair else state
            if past is None:
                cache.update(state, q.size(2))
            else:                                                      # ConvStateCache: the window too
                cache.update(state, fp32(past), q.size(2))
        return o

    def forward(self, x, pos, cache=None):
        B, T, _ = x.shape
        if cache is not None and T == 1 and cache.pos > 0 and not self.pair:
            return self.step(x, pos, cache)
        past = cache.conv if cache is not None and self.conv_weight is not None else None   # None: zeros
        q, k, v, r, past = self.project(x, pos, past)
        g = self.decay(x)
        if self.sum_normalised:  # a channel of ones: its output is the normaliser phi(q_t) . sum_j phi(k_j)
            v = torch.cat([v, v.new_ones(*v.shape[:-1], 1)], dim=-1)
        o = self.recur(q, k, v, g, pos, cache, past)
        return self.finish(o.transpose(1, 2), r, x)

    def step(self, x, pos, cache):
        """forward for one token against the cache's state (decoding; the softmax pair's takes forward's
        path): the same parts, written for a step at batch 1, where every op and function call costs
        more than its math. For T = 1 the projection's (B, 1, heads * D) is already (B, heads, 1, D),
        the layout the recurrence reads: no transposes, one split. The decay and the recurrence are
        the member's own (decay, recur), as in forward."""
        B, H, Hkv, D = x.size(0), self.n_head, self.n_kv_head, self.head_dim
        qkv, r = F.linear(x, self.c_attn.weight, self.c_attn.bias).split_with_sizes(
            [(H + 2 * Hkv) * D, H * D if self.gated else 0], dim=-1)            # (B, 1, (H + 2 Hkv) D), gate
        past = None
        if self.conv_weight is not None:
            qkv, past = causal_conv(qkv, self.conv_weight, cache.conv)
        qk, v = qkv.view(B, H + 2 * Hkv, 1, D).split_with_sizes([H + Hkv, Hkv], dim=1)   # (B, heads, 1, D)
        if self.phi is not None:
            qk = self.phi(qk)
        q, k = self.rope(pos, qk)[0].split_with_sizes([H, Hkv], dim=1)
        if self.sum_normalised:
            v = torch.cat([v, v.new_ones(B, Hkv, 1, 1)], dim=-1)
        o = self.recur(q, k, v, self.decay(x), pos, cache, past)      # (B, H, 1, Dv): a member's own recur too
        return self.finish(o.view(B, 1, H, -1), r.view(B, 1, H, D) if self.gated else None, x)

    def finish(self, o, r, x):
        """The recurrence's output o (B, T, H, Dv) -> the layer's (B, T, C): the sum normaliser's division,
        the per-head norm and the output gate r (B, T, H, D) or None, c_proj."""
        B, T, _ = x.shape
        if self.sum_normalised:
            o, norm = o.split([self.head_dim, 1], dim=-1)
            o = o / (norm + SUM_EPS)
        # the norm in the residual stream's dtype (fp32 under bf16 autocast: RMSNorm's fused kernel
        # wants its input and weight alike)
        o = in_dtype(o, x.dtype)
        if r is not None and isinstance(self.o_norm, nn.RMSNorm):      # both at once (attn_kernels/norms.py)
            o = rms_norm_gated(o, self.o_norm.weight, r, self.o_norm.eps)
        else:
            o = self.o_norm(o)
            o = o if r is None else o * F.silu(r)
        return self.resid_dropout(self.c_proj(o.reshape(B, T, self.n_head * self.head_dim)))

    def kernel_cases(self) -> dict:
        """"forward": the full-sequence form; "decode": one token against the state (PyTorch)."""
        return {"forward": ("attn_kernels.gla", dict(chunk_size=self.chunk, head_dim_k=self.head_dim,
                                                head_dim_v=self.value_dim)),
                "decode": (None, {"why": "a one-token step of the recurrence runs in PyTorch (no kernel needed)"})}

    @property
    def value_dim(self) -> int:
        """Value channels the recurrence carries: the head's, plus the sum normaliser's ones."""
        return self.head_dim + self.sum_normalised

    @property
    def state_dim(self) -> int:
        """Columns of the decoding state per key row: the values, plus the softmax pair's log Z, max, decay."""
        return self.value_dim + 3 * self.pair

    def _full_sequence_gla(self, device):
        """The GLA form that attn_impl resolved to on `device` (see the module docstring)."""
        impl = self.impl(device)
        if impl == "naive":
            return naive_recurrent_gla
        if impl == "triton":
            from attn_kernels.gla import chunk_gla as triton_chunk_gla
            return functools.partial(in_fp32(triton_chunk_gla), chunk_size=self.chunk)
        return functools.partial(chunk_gla, chunk_size=self.chunk)

    def init_cache(self, batch_size, max_len, device, dtype):
        """One fp32 state per KV head (and the convolution's window); max_len is not needed (neither grows)."""
        shape = (batch_size, self.n_kv_head, self.head_dim, self.state_dim)
        if self.conv_weight is None:
            return StateCache(shape, device)
        return ConvStateCache(shape, (batch_size, self.conv_size - 1, self.conv_weight.size(0)), device)

    def keys_per_query(self, seq_len: int) -> None:
        return None  # reads a state, not keys

    def chunked_flops(self, intra_keys: float) -> float:
        """Training FLOPs per token of the chunked form: q.k and A.v over intra_keys keys of its chunk
        (2*D each per query head), q.S and the state update k^T v (2*D*D per query head / per KV head),
        the convolution (2 per tap and channel of q, k and v)."""
        D = self.head_dim
        conv = 2 * self.conv_size * (self.n_head + 2 * self.n_kv_head) * D
        return 3 * (4 * self.n_head * D * intra_keys + 2 * (self.n_head + self.n_kv_head) * D * D + conv)

    def attn_flops_per_token(self, seq_len: int) -> float:
        """As computed: within its chunk a query reads only the earlier keys (A is lower triangular),
        (chunk + 1) / 2 on average, as dense softmax is billed its causal half."""
        return self.chunked_flops(mean_keys_in_blocks(seq_len, self.chunk))

    def attn_flops_per_token_palm(self, seq_len: int) -> float:
        """PaLM's convention (MFU only): the chunk's whole square, causal half not subtracted."""
        return self.chunked_flops(min(self.chunk, seq_len))

    def cache_elems_per_token(self) -> int:
        return 0  # constant state: see cache_state_elems

    def cache_state_elems(self) -> int:
        """Elements of this layer's decoding state for batch 1, whatever the length: the state and the
        convolution's last gla_conv - 1 inputs of q, k and v."""
        window = max(self.conv_size - 1, 0) * (self.n_head + 2 * self.n_kv_head) * self.head_dim
        return self.n_kv_head * self.head_dim * self.state_dim + window
