"""Gated linear attention (GLA, Yang et al. 2023) and plain causal linear attention.

Softmax attention is replaced by a recurrence over a fixed-size state per KV head:

    S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t        S: (Dk, Dv), g_t <= 0 the log-decay
    o_t = scale * q_t S_t

so decoding keeps one (Dk, Dv) matrix per head instead of a cache that grows with the
context. gla_gate=data makes the decay data-dependent (g = logsigmoid(W2 W1 x) / 16, a
rank-16 projection, as in the paper and flash-linear-attention); gla_gate=none is plain
linear attention (g = 0: nothing is forgotten, o = Q (K^T V) masked causally).

The layer (flash-linear-attention's GatedLinearAttention, without its expansion factors):

    x --c_attn--> [ q: H*D | k: Hkv*D | v: Hkv*D | r: H*D ]      (r: the output gate)
    x --gk_proj (C->16->Hkv*D)--> logsigmoid / 16 = g             (gla_gate=data only)
    q, k <- phi(q), phi(k) (identity or elu+1), then RoPE (if pos_encoding=rope)
    o = GLA(q, k, v, g)           (B, H, T, D); query head h reads KV head h // (H/Hkv)
    y = c_proj( RMSNorm_per_head(o) * silu(r) )

Four computations of the same recurrence (the first three with the signature of
kernels.gla.chunk_gla in DESIGN.md, extended to GQA: k, v, g and the state may have fewer
heads than q; g=None means no decay). The layer picks one by attn_impl:
    naive_recurrent_gla   a Python loop over time: the reference (attn_impl=naive); it is
                          kernels.reference.gla_reference
    chunk_gla             the chunked parallel form in PyTorch: training and prefill off CUDA
                          (attn_impl=sdpa, the default there)
    kernels.gla.chunk_gla the same chunked form as a Triton kernel: training and prefill when
                          attn_impl resolves to triton (auto on CUDA; triton on CPU runs it under
                          the interpreter). Imported on first use, so CPU users never need Triton.
                          The kernel takes chunk sizes that are powers of two >= 16; with another
                          gla_chunk the layer uses the PyTorch chunk_gla instead.
    recurrent_gla_step    one token against the state: decoding, whatever attn_impl
"""
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

from attention.base import Attention, record_linear, resolve_impl
from attention.cache import StateCache
from kernels.reference import gla_reference as naive_recurrent_gla  # the loop reference (attn_impl=naive)

GATE_LOW_RANK = 16     # rank of the decay projection W2 W1 (the paper's 16)
GATE_NORMALIZER = 16   # g = logsigmoid(.) / 16: decays start near 1 (exp(-log2/16) ~ 0.958)
MAX_FACTORED_SPAN = 40.0  # nats a chunk may decay for chunk_gla's one-matmul intra-chunk form


def _fp32(fn):
    """Run the recurrence math in fp32 even under autocast: autocast would run the einsums
    in bf16/fp16, where the state loses precision and (fp16) exp(40) overflows."""
    @functools.wraps(fn)
    def wrapper(q, *args, **kwargs):
        with torch.autocast(q.device.type, enabled=False):
            return fn(q, *args, **kwargs)
    return wrapper


@_fp32
def recurrent_gla_step(q, k, v, g, state, scale=None):
    """One decoding step: q (B, H, 1, Dk); k, g (B, Hkv, 1, Dk); v (B, Hkv, 1, Dv);
    state (B, Hkv, Dk, Dv) fp32. Returns o (B, H, 1, Dv) and the next state."""
    B, H, _, Dk = q.shape
    Hkv = k.size(1)
    scale = Dk ** -0.5 if scale is None else scale
    k_t, v_t = k[:, :, 0].float(), v[:, :, 0].float()                  # (B, Hkv, Dk), (B, Hkv, Dv)
    if g is not None:                                                  # forget: decay each key row
        state = g[:, :, 0].float().exp()[..., None] * state
    state = state + k_t[..., None] * v_t[..., None, :]                 # write: outer product k^T v
    q_t = q[:, :, 0].float().reshape(B, Hkv, H // Hkv, Dk) * scale
    o = torch.einsum("bhgd,bhde->bhge", q_t, state)                    # read: q S
    return o.reshape(B, H, 1, -1).to(q.dtype), state


@_fp32
def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, chunk_size=64):
    """The chunked parallel form (GLA paper, section 4): same arguments and results as
    naive_recurrent_gla; differentiable by autograd in q, k, v, g and initial_state.

    Time is cut into N chunks of C tokens (the tail is zero-padded: k = v = g = 0 there
    changes neither the outputs nor the final state). Within chunk n, with
    b_i = g_0 + ... + g_i the cumulative log-decay from the chunk's start (b <= 0, falling):

        o_i = scale * [ (q_i * exp(b_i)) S_n                                   (inter-chunk)
                       + sum_{j<=i} (sum_d q_id k_jd exp(b_id - b_jd)) v_j ]   (intra-chunk)
        S_{n+1} = exp(b_{C-1}) * S_n + sum_j (k_j * exp(b_{C-1} - b_j))^T v_j

    Numerical safety. Every exponent above is <= 0 except the intra-chunk exp(b_i - b_j)
    when factored the textbook way, (q_i * exp(b_i)) . (k_j * exp(-b_j)): exp(-b_j)
    overflows fp32 once a chunk decays by more than ~88 nats. Two ways, chosen per call:

    - factored (fast: one matmul), when no chunk decays by more than MAX_FACTORED_SPAN
      = 40 nats: every factor then lies in [e^-40, e^40], far from fp32's limits (also
      through the backward), and each product equals the direct one to a few ulps. This
      is the usual case (GLA's g = logsigmoid(.)/16 decays ~0.04-1 nats a step);
    - sub-chunked, otherwise: sub-chunks of c ~ sqrt(C) tokens (8 for C = 64), where no
      exponent is ever positive:

              j: sub-chunk 0   1   2   3
        i: 0     [ D0 ]                      D = diagonal block: pairwise (c, c, Dk)
           1     [ F  ][ D1 ]                    tensor exp(b_i - b_j), exponent masked
           2     [ F  ][ F  ][ D2 ]              to -inf above the diagonal before exp
           3     [ F  ][ F  ][ F  ][ D3 ]    F = factored through r = b at the first token
                                                 of the row's sub-chunk: exp(b_i - r) and
                                                 exp(r - b_j), both exponents <= 0
      so only a (C/c, C, Dk) and a (C, c, Dk) tensor per chunk are formed, not (C, C, Dk)
      (flash-linear-attention's kernel does the same with c = 16, the pairs in registers).
    """
    B, H, T, Dk = q.shape
    Hkv, Dv = k.size(1), v.size(-1)
    G = H // Hkv
    scale = Dk ** -0.5 if scale is None else scale
    C = chunk_size
    pad = (-T) % C
    N = (T + pad) // C

    def chunks(x):  # (B, h, T, D) -> (B, h, N, C, D), fp32, zero-padded at the end
        return F.pad(x.float(), (0, 0, 0, pad)).view(x.size(0), x.size(1), N, C, x.size(-1))

    qc = (chunks(q) * scale).view(B, Hkv, G, N, C, Dk)                 # (B, Hkv, G, N, C, Dk)
    kc, vc = chunks(k), chunks(v)                                      # (B, Hkv, N, C, Dk|Dv)
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()

    if g is None:  # plain linear attention: no decay anywhere
        A = torch.einsum("bhgnid,bhnjd->bhgnij", qc, kc).masked_fill(~causal, 0.0)
        q_inter, k_end, chunk_decay = qc, kc, None
    else:
        # Step 1: cumulative log-decay from each chunk's start.
        b = chunks(g).cumsum(dim=-2)                                   # (B, Hkv, N, C, Dk)
        b_last = b[..., -1:, :]                                        # (B, Hkv, N, 1, Dk)
        q_inter = qc * b.exp()[:, :, None]                             # exp(b_i) <= 1
        # Step 2: intra-chunk scores A (B, Hkv, G, N, C, C), factored or sub-chunked (above).
        if b.min().item() >= -MAX_FACTORED_SPAN:  # b falls from <= 0: its min is the largest span
            k_rel = kc * (-b).exp()                                    # exp(-b_j) <= e^40
            A = torch.einsum("bhgnid,bhnjd->bhgnij", q_inter, k_rel).masked_fill(~causal, 0.0)
        else:
            A = _intra_chunk_scores(qc, kc, b, _sub_chunk(C))
        # Step 3: what each chunk adds to the state and how much it decays the old one.
        k_end = kc * (b_last - b).exp()                                # exp(b_{C-1} - b_j) <= 1
        chunk_decay = b_last.squeeze(-2).exp()                         # (B, Hkv, N, Dk)
    o_intra = torch.einsum("bhgnij,bhnjd->bhgnid", A, vc)             # (B, Hkv, G, N, C, Dv)
    U = torch.einsum("bhncd,bhnce->bhnde", k_end, vc)                 # (B, Hkv, N, Dk, Dv)

    # Step 4: pass the state from chunk to chunk (N small sequential steps).
    S = q.new_zeros(B, Hkv, Dk, Dv, dtype=torch.float32) if initial_state is None else initial_state.float()
    entering = []
    for n in range(N):
        entering.append(S)
        S = (S if chunk_decay is None else chunk_decay[:, :, n, :, None] * S) + U[:, :, n]
    S_in = torch.stack(entering, dim=2)                                # (B, Hkv, N, Dk, Dv)

    # Step 5: outputs = what the earlier chunks left in the state + the chunk itself.
    o = torch.einsum("bhgncd,bhnde->bhgnce", q_inter, S_in) + o_intra
    o = o.reshape(B, H, N * C, Dv)[:, :, :T].to(q.dtype)
    return o, (S if output_final_state else None)


def _sub_chunk(C):
    """The divisor c of C nearest sqrt(C) (the smaller on a tie): the two tensors of
    _intra_chunk_scores hold C/c + c elements per token and key dim, least at c = sqrt(C)."""
    return min((c for c in range(1, C + 1) if C % c == 0), key=lambda c: (C // c + c, c))


def _intra_chunk_scores(qc, kc, b, c):
    """sum_d q_id k_jd exp(b_id - b_jd) for j <= i within each chunk, else 0.

    qc (B, Hkv, G, N, C, Dk), kc and b (B, Hkv, N, C, Dk), c divides C.
    Returns (B, Hkv, G, N, C, C).
    """
    B, Hkv, G, N, C, Dk = qc.shape
    ns = C // c
    bs = b.view(B, Hkv, N, ns, c, Dk)
    ref = bs[..., :1, :]                                               # r: b at each sub-chunk's first token
    idx = torch.arange(C, device=qc.device)
    # Off-diagonal blocks: query side exp(b_i - r) <= 1; key side exp(r - b_j) <= 1 for the
    # keys of earlier sub-chunks, and the exponent of the rest (positive there) is set to
    # -inf before exp, so those keys contribute an exact 0 without ever overflowing.
    q_rel = qc.view(B, Hkv, G, N, ns, c, Dk) * (bs - ref).exp()[:, :, None]
    earlier = idx[None, :] < (idx[::c][:, None])                       # (ns, C): key j before sub-chunk s
    k_exp = (ref - b[:, :, :, None]).masked_fill(~earlier[:, :, None], float("-inf"))
    k_rel = kc[:, :, :, None] * k_exp.exp()                            # (B, Hkv, N, ns, C, Dk)
    A = torch.einsum("bhgnsid,bhnsjd->bhgnsij", q_rel, k_rel)         # (B, Hkv, G, N, ns, c, C)
    # Diagonal blocks: pairwise exp(b_i - b_j) for j <= i inside a sub-chunk.
    tri = torch.ones(c, c, dtype=torch.bool, device=qc.device).tril()
    pair = (bs[..., :, None, :] - bs[..., None, :, :]).masked_fill(~tri[:, :, None], float("-inf"))
    k_pair = kc.view(B, Hkv, N, ns, 1, c, Dk) * pair.exp()             # (B, Hkv, N, ns, c, c, Dk)
    A_diag = torch.einsum("bhgnsid,bhnsijd->bhgnsij", qc.view(B, Hkv, G, N, ns, c, Dk), k_pair)
    # Put each diagonal block in its place: A is zero there so far (those keys were masked).
    eye = torch.eye(ns, device=qc.device, dtype=qc.dtype)[:, None, :, None]   # (ns, 1, ns, 1)
    A = A.view(B, Hkv, G, N, ns, c, ns, c) + A_diag[..., None, :] * eye
    return A.reshape(B, Hkv, G, N, C, C)


def _kernel_takes_chunk(chunk):
    """kernels.gla.chunk_gla's chunk sizes: powers of two >= 16."""
    return chunk >= 16 and chunk & (chunk - 1) == 0


class GatedLinearAttention(Attention):
    FEATURE_MAPS = ("identity", "elu")
    GATES = ("data", "none")

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_dim = D = config.n_embd // config.n_head
        H, Hkv = self.n_head, self.n_kv_head
        self.c_attn = nn.Linear(config.n_embd, (2 * H + 2 * Hkv) * D, bias=config.bias)
        # Low-rank decay projection; its second bias sets each channel's base decay rate
        # (the paper and flash-linear-attention keep it whatever config.bias says).
        self.gk_proj = nn.Sequential(nn.Linear(config.n_embd, GATE_LOW_RANK, bias=False),
                                     nn.Linear(GATE_LOW_RANK, Hkv * D, bias=True)) if config.gla_gate == "data" else None
        # Linear attention's output has no softmax bounding its scale; the per-head
        # RMSNorm (weights shared by the heads, as in flash-linear-attention) restores it.
        self.o_norm = nn.RMSNorm(D, eps=1e-5)
        self.setup_output_and_positions(config)
        self.feature_map, self.chunk = config.gla_feature_map, config.gla_chunk

    @classmethod
    def check_config(cls, config):
        # sinusoidal is added to the embeddings and defined at every position, like rope and none
        if config.pos_encoding not in ("rope", "sinusoidal", "none"):
            raise ValueError(f"attention=gla works with pos_encoding rope, sinusoidal or none (no score matrix "
                             f"for alibi, no fixed context for learned), got {config.pos_encoding}")
        if config.gla_gate not in cls.GATES:
            raise ValueError(f"unknown gla_gate={config.gla_gate!r}; choose one of {', '.join(cls.GATES)}")
        if config.gla_feature_map not in cls.FEATURE_MAPS:
            raise ValueError(f"unknown gla_feature_map={config.gla_feature_map!r}; "
                             f"choose one of {', '.join(cls.FEATURE_MAPS)}")
        if config.gla_chunk < 1:
            raise ValueError(f"gla_chunk={config.gla_chunk} must be at least 1 (64 is the default)")

    def forward(self, x, pos, cache=None):
        B, T, _ = x.shape
        H, Hkv, D = self.n_head, self.n_kv_head, self.head_dim
        q, k, v, r = self.c_attn(x).split([H * D, Hkv * D, Hkv * D, H * D], dim=-1)
        q = q.view(B, T, H, D).transpose(1, 2)                        # (B, H, T, D)
        k = k.view(B, T, Hkv, D).transpose(1, 2)                      # (B, Hkv, T, D)
        v = v.view(B, T, Hkv, D).transpose(1, 2)
        if self.feature_map == "elu":
            q, k = F.elu(q) + 1, F.elu(k) + 1
        q, k = self.rope(pos, q, k)  # after phi, so q.k keeps RoPE's relative-position form
        g = None
        if self.gk_proj is not None:
            g = (F.logsigmoid(self.gk_proj(x).float()) / GATE_NORMALIZER).view(B, T, Hkv, D).transpose(1, 2)
        record_linear(q, k, g, pos, scale=D ** -0.5)  # no-op unless analyze.py records (attention/base.py)

        if cache is not None and T == 1:
            o, cache.state = recurrent_gla_step(q, k, v, g, cache.state)
        else:
            o, state = self._chunked_impl(x.device)(q, k, v, g, initial_state=None if cache is None else cache.state,
                                                    output_final_state=cache is not None)
        if cache is not None:
            if T > 1:
                cache.state = state
            cache.pos += T
        o = self.o_norm(o).transpose(1, 2)                             # (B, T, H, D)
        y = (o * F.silu(r.view(B, T, H, D))).reshape(B, T, H * D)
        return self.resid_dropout(self.c_proj(y))

    def _chunked_impl(self, device):
        """The full-sequence GLA for attn_impl on `device` (see the module docstring)."""
        impl = resolve_impl(self.attn_impl, device)
        if impl == "naive":
            return naive_recurrent_gla
        if impl == "triton" and _kernel_takes_chunk(self.chunk):
            from kernels.gla import chunk_gla as triton_chunk_gla
            return functools.partial(_fp32(triton_chunk_gla), chunk_size=self.chunk)
        return functools.partial(chunk_gla, chunk_size=self.chunk)

    def init_cache(self, batch_size, max_len, device, dtype):
        """One fp32 state per KV head; max_len is not needed (the state never grows)."""
        return StateCache((batch_size, self.n_kv_head, self.head_dim, self.head_dim), device)

    def attn_flops_per_token(self, seq_len: int) -> float:
        """Chunked form per token: q.k and A.v within its chunk (2*D*chunk each), q.S and the
        state update k^T v (2*D*D per query head / per KV head)."""
        D, C = self.head_dim, min(self.chunk, seq_len)
        return 3 * (4 * self.n_head * D * C + 2 * (self.n_head + self.n_kv_head) * D * D)

    def cache_elems_per_token(self) -> int:
        return 0  # constant state: see cache_state_elems

    def cache_state_elems(self) -> int:
        """Elements of this layer's decoding state for batch 1, whatever the length."""
        return self.n_kv_head * self.head_dim * self.head_dim
