"""Multi-head Latent Attention (DeepSeek-V2, arXiv:2405.04434, section 2.1).

Keys and values come from one small latent per token, c_kv (d_c = kv_lora_rank), plus one
RoPE key k_rope (d_r = rope_head_dim) shared by all heads. Decoding caches only those
d_c + d_r numbers per token per layer, instead of MHA's 2 * n_head * d_h.

Paper name -> module here (H heads, C = n_embd, d_h = qk_nope_head_dim and d_v = v_head_dim,
both n_embd / H unless set: DeepSeek-V2 itself has C = 5120, H = 128, d_h = d_v = 128,
d_c = 512, d_r = 64, q_lora_rank = 1536, so H * d_h != C and d_h + d_r != d_v):

    queries   W_DQ -> q_down (C -> q_lora_rank), q_norm (RMSNorm), then W_UQ and W_QR together
              -> q_up (q_lora_rank -> H*(d_h+d_r)); with q_lora_rank = 0, one q_proj (C -> H*(d_h+d_r))
    keys/vals W_DKV and W_KR together -> kv_down (C -> d_c + d_r), kv_norm (RMSNorm on c_kv),
              W_UK -> k_up (d_c -> H*d_h), W_UV -> v_up (d_c -> H*d_v), W_O -> c_proj (H*d_v -> C)

          x (B,T,C)
          |--- q_proj / q_down,q_norm,q_up --> per head [ q_nope (d_h) | q_rope (d_r) ]  (RoPE on q_rope)
          '--- kv_down --> [ c_kv (d_c) | k_rope (d_r) ]    c_kv -> kv_norm, k_rope -> RoPE
                              |              '-- one per token, shared by every head
                              +-- k_up --> k_nope_h (d_h)
                              '-- v_up --> v_h      (d_v)

    score_h(i, j) = (q_nope_h,i . k_nope_h,j + q_rope_h,i . k_rope_j) / sqrt(d_h + d_r)

Two ways to compute the same thing:

  expanded (training; decoding with mla_decode="expanded"): per-head keys and values,
      q = [q_nope | q_rope] (B,H,T,d_h+d_r)   k = [k_nope | k_rope, broadcast] (B,H,T,d_h+d_r)
      v (B,H,T,d_v); a decoding cache (KVCache) then holds H*(d_h + d_r + d_v) per token.

  absorbed (decoding with mla_decode="absorbed", the default): W_UK moves into the query and
      W_UV into the output, so attention runs on the cached latent itself:
          q_nope_h . (W_UK_h c_j) = (W_UK_h^T q_nope_h) . c_j = q_lat_h . c_j
          sum_j p_j (W_UV_h c_j)  = W_UV_h (sum_j p_j c_j)
      one `attend` call with a single shared KV "head" (MQA-like):
          q' = [q_lat | q_rope] (B,H,T,d_c+d_r)   k' = [c_kv | k_rope] (B,1,Tk,d_c+d_r)
          v' = c_kv (B,1,Tk,d_c)                   scale stays 1/sqrt(d_h + d_r)
      and the cache (LatentCache) holds only c_kv and k_rope: d_c + d_r per token.

Biases (bias=True) follow DeepSeek-V2's attention_bias: on the projections that read x
(q_down, kv_down) and on c_proj; the up-projections q_up, k_up and v_up have none, so
absorbing k_up and v_up is a plain matrix product. One deviation: with q_lora_rank = 0 the
full q_proj, which reads x, has a bias too (DeepSeek-V2's has none), so that a converted
MHA model (pretrained.from_pretrained) keeps its query bias. mla_latent_norm=False drops the
RMSNorm on c_kv (a per-token rescaling of K and V that an MHA source does not have).
Position encodings: rope uses the decoupled RoPE key; alibi, learned and none
use rope_head_dim = 0 (ALiBi's bias depends only on positions, so absorption leaves it
alone).
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from attention.base import Attention, attend, relative_error
from attention.cache import KVCache, LatentCache

DECODE_MODES = ("absorbed", "expanded")
NORM_EPS = 1e-6             # DeepSeek-V2's RMSNorm epsilon


class MultiHeadLatentAttention(Attention):
    owned_keys = ("q_lora_rank", "kv_lora_rank", "rope_head_dim", "qk_nope_head_dim", "v_head_dim",
                  "mla_latent_norm", "mla_decode")

    @classmethod
    def check_config(cls, config):
        """Validate the MLA keys (one-line ValueError) and fill their defaults in place:
        qk_nope_head_dim 0 -> n_embd/n_head, v_head_dim 0 -> qk_nope_head_dim, kv_lora_rank 0 -> 4*d_h,
        rope_head_dim -1 -> d_h/2 with rope (else 0), the paper's ratios."""
        for name in ("qk_nope_head_dim", "v_head_dim"):
            if getattr(config, name) < 0:
                raise ValueError(f"{name}={getattr(config, name)} must be >= 0 (0 = n_embd // n_head)")
        if config.qk_nope_head_dim == 0:  # the head dim follows n_embd (else it is free of it)
            if config.n_embd % config.n_head:
                raise ValueError(f"n_embd={config.n_embd} is not divisible by n_head={config.n_head}; "
                                 "or set qk_nope_head_dim")
            config.qk_nope_head_dim = config.n_embd // config.n_head
        if config.v_head_dim == 0:
            config.v_head_dim = config.qk_nope_head_dim
        d_h = config.qk_nope_head_dim
        if config.n_kv_head != config.n_head:
            raise ValueError(f"attention=mla has no KV heads to share (got n_kv_head={config.n_kv_head}); "
                             f"leave n_kv_head unset")
        if config.mla_decode not in DECODE_MODES:
            raise ValueError(f"unknown mla_decode={config.mla_decode!r}; choose one of {', '.join(DECODE_MODES)}")
        if config.q_lora_rank < 0:
            raise ValueError(f"q_lora_rank={config.q_lora_rank} must be >= 0 (0 = a full query projection)")
        if config.kv_lora_rank < 0:
            raise ValueError(f"kv_lora_rank={config.kv_lora_rank} must be >= 0 (0 = 4*head_dim = {4 * d_h})")
        if config.kv_lora_rank == 0:
            config.kv_lora_rank = 4 * d_h
        rope = config.pos_encoding == "rope"
        if config.rope_head_dim < -1:
            raise ValueError(f"rope_head_dim={config.rope_head_dim} must be -1 (default), 0, or even and > 0 "
                             f"with pos_encoding=rope")
        if config.rope_head_dim == -1:
            # d_h/2, rounded down to even (RoPE rotates pairs), at least one pair
            config.rope_head_dim = max(2, d_h // 4 * 2) if rope else 0
        if rope and (config.rope_head_dim <= 0 or config.rope_head_dim % 2):
            raise ValueError(f"rope_head_dim={config.rope_head_dim} must be even and > 0 with pos_encoding=rope "
                             f"(-1 = head_dim/2)")
        if not rope and config.rope_head_dim != 0:
            raise ValueError(f"rope_head_dim={config.rope_head_dim} needs pos_encoding=rope; "
                             f"use 0 (or -1) with pos_encoding={config.pos_encoding}")

    @classmethod
    def rope_dim(cls, config) -> int:
        return config.rope_head_dim   # only the decoupled key and query part turn

    def __init__(self, config, layer_idx: int):
        super().__init__()
        C, H = config.n_embd, config.n_head
        self.n_head = H
        self.qk_nope_head_dim, self.v_head_dim = config.qk_nope_head_dim, config.v_head_dim
        self.head_dim = self.v_head_dim   # what c_proj reads per head (setup_output_and_positions)
        self.kv_lora_rank, self.rope_head_dim = config.kv_lora_rank, config.rope_head_dim
        self.q_lora_rank, self.mla_decode = config.q_lora_rank, config.mla_decode
        d_h, d_v, d_c, d_r = self.qk_nope_head_dim, self.v_head_dim, self.kv_lora_rank, self.rope_head_dim
        # Biases as DeepSeek-V2's attention_bias: on the projections that read x and on the output,
        # never on the up-projections (so absorbing k_up/v_up stays a plain matrix product).
        if self.q_lora_rank > 0:
            self.q_down = nn.Linear(C, self.q_lora_rank, bias=config.bias)
            self.q_norm = nn.RMSNorm(self.q_lora_rank, eps=NORM_EPS)
            self.q_up = nn.Linear(self.q_lora_rank, H * (d_h + d_r), bias=False)
        else:
            self.q_proj = nn.Linear(C, H * (d_h + d_r), bias=config.bias)
        self.kv_down = nn.Linear(C, d_c + d_r, bias=config.bias)
        self.kv_norm = nn.RMSNorm(d_c, eps=NORM_EPS) if config.mla_latent_norm else nn.Identity()
        self.k_up = nn.Linear(d_c, H * d_h, bias=False)
        self.v_up = nn.Linear(d_c, H * d_v, bias=False)
        self.setup_output_and_positions(config)
        # The paper's scale: the score is a dot product over d_h + d_r dims, whichever form computes it.
        self.scale = 1.0 / math.sqrt(d_h + d_r)

    # ---- the pieces both forms share ----
    def _queries(self, x, pos):
        """x (B,T,C) -> q_nope (B,H,T,d_h), q_rope (B,H,T,d_r) with RoPE applied."""
        B, T, _ = x.shape
        q = self.q_up(self.q_norm(self.q_down(x).to(x.dtype))) if self.q_lora_rank > 0 else self.q_proj(x)
        q = q.view(B, T, self.n_head, self.qk_nope_head_dim + self.rope_head_dim).transpose(1, 2)
        q_nope, q_rope = q.split([self.qk_nope_head_dim, self.rope_head_dim], dim=-1)
        q_rope, = self.rope(pos, q_rope)
        return q_nope, q_rope

    def _latent(self, x, pos):
        """x (B,T,C) -> c_kv (B,T,d_c) normalized, k_rope (B,T,d_r) with RoPE applied: what the
        absorbed cache stores. RoPE goes on before caching, at the token's absolute position."""
        c_kv, k_rope = self.kv_down(x).split([self.kv_lora_rank, self.rope_head_dim], dim=-1)
        k_rope, = self.rope(pos, k_rope)
        # the norms in the residual stream's dtype: fp32 under bf16 autocast, as DeepSeek-V2 computes them
        return self.kv_norm(c_kv.to(x.dtype)), k_rope

    def kernel_cases(self) -> dict:
        """"forward" (training, the expanded form) attends over d_h + d_r dims; decoding runs the
        mla_decode form: "absorbed" over d_c + d_r (288 at the paper's ratios with d_h = 64: past the
        flash kernel's head dims, so PyTorch runs it), or "decode", the expanded form against a KVCache."""
        d_h, d_v, d_c, d_r = self.qk_nope_head_dim, self.v_head_dim, self.kv_lora_rank, self.rope_head_dim
        p = self.dropout
        expanded = ("attn_kernels.flash_attn", dict(head_dim_qk=d_h + d_r, head_dim_v=d_v, dropout=p))
        if self.mla_decode == "absorbed":
            return {"forward": expanded,
                    "absorbed": ("attn_kernels.flash_attn", dict(head_dim_qk=d_c + d_r, head_dim_v=d_c, dropout=p))}
        return {"forward": expanded, "decode": expanded}   # decode: the expanded form against a KVCache

    def forward(self, x, pos, cache=None):
        q_nope, q_rope = self._queries(x, pos)
        c_kv, k_rope = self._latent(x, pos)
        if cache is not None and self.mla_decode == "absorbed":
            y = self._absorbed(q_nope, q_rope, c_kv, k_rope, pos, cache)
        else:
            y = self._expanded(q_nope, q_rope, c_kv, k_rope, pos, cache)
        return self.output(y, x)

    def _expanded(self, q_nope, q_rope, c_kv, k_rope, pos, cache):
        """Per-head keys and values (training, and decoding with a KVCache). Returns (B,H,T,d_v)."""
        B, H, T, d_h = q_nope.shape
        k_nope = self.k_up(c_kv).view(B, T, H, d_h).transpose(1, 2)      # (B,H,T,d_h)
        v = self.v_up(c_kv).view(B, T, H, self.v_head_dim).transpose(1, 2)   # (B,H,T,d_v)
        q = torch.cat([q_nope, q_rope], dim=-1)                          # (B,H,T,d_h+d_r)
        k = torch.cat([k_nope, k_rope[:, None].expand(B, H, T, self.rope_head_dim)], dim=-1)
        k_pos = pos
        if cache is not None:
            k, v, k_pos = cache.update(k, v)
        impl = self.impl(q.device, "decode" if cache is not None else "forward")
        d_qk, d_v = q.size(-1), v.size(-1)
        if impl == "sdpa" and d_qk != d_v and q.size(2) > 1:
            # PyTorch's fused SDPA kernels need one head dim for q, k and v; with d_h + d_r != d_v it
            # falls back to its unfused math (~5x slower training on CPU at T = 1k). Zero columns on
            # the narrower side change no score (the scale is explicit) and no kept output column.
            # (Not for one-token decoding steps: padding would copy the whole cache each step.)
            width = max(d_qk, d_v)
            q, k, v = (t if t.size(-1) == width else F.pad(t, (0, width - t.size(-1))) for t in (q, k, v))
        y = attend(q, k, v, pos, k_pos, alibi_slopes=self.alibi_slopes, scale=self.scale,
                   dropout_p=self.attn_dropout, impl=impl)
        return y[..., :d_v]

    def _absorbed(self, q_nope, q_rope, c_kv, k_rope, pos, cache):
        """Attention on the cached latent (LatentCache). Returns (B,H,T,d_v).

            cache rows        [ c_kv (d_c) | k_rope (d_r) ]  one row per token, one buffer
            q' = [ q_nope_h W_UK_h | q_rope_h ]     (B, H, T,  d_c + d_r)
            k' = the cache rows                     (B, 1, Tk, d_c + d_r)   one "KV head" for all H
            v' = their c_kv part                    (B, 1, Tk, d_c)
            attend -> a_h (B,H,T,d_c) = sum_j p_hj c_j  -> out_h = W_UV_h a_h (B,H,T,d_v)

        Speed note: on CPU at batch 1 this form does ~(d_c + d_r)/(d_h + d_r) times the
        multiply-adds of the expanded one per cached token, so it saves memory, not time;
        see python -m tools.bench --suite=mla.
        """
        H, d_c = self.n_head, self.kv_lora_rank
        w_uk = self.k_up.weight.view(H, self.qk_nope_head_dim, d_c)      # rows of head h: W_UK_h (d_h, d_c)
        w_uv = self.v_up.weight.view(H, self.v_head_dim, d_c)
        q = torch.cat([torch.einsum("bhtd,hdc->bhtc", q_nope, w_uk), q_rope], dim=-1)   # (B,H,T,d_c+d_r)
        latent, k_pos = cache.update(torch.cat([c_kv, k_rope], dim=-1))  # (B,Tk,d_c+d_r), (Tk,)
        k, v = latent[:, None], latent[:, None, :, :d_c]                 # views of the cache, no copy
        a = attend(q, k, v, pos, k_pos, alibi_slopes=self.alibi_slopes, scale=self.scale,
                   dropout_p=self.attn_dropout, impl=self.impl(q.device, "absorbed"))   # (B,H,T,d_c)
        return torch.einsum("bhtc,hdc->bhtd", a, w_uv)

    # ---- decoding caches ----
    def init_cache(self, batch_size, max_len, device, dtype):
        if self.mla_decode == "absorbed":
            # One buffer of [c_kv | k_rope] rows (still d_c + d_r per token): the key k' of
            # `_absorbed` is then a view of the cache instead of a concatenation every step.
            return LatentCache(batch_size, max_len, self.kv_lora_rank + self.rope_head_dim, device, dtype)
        return KVCache(batch_size, self.n_head, max_len, self.qk_nope_head_dim + self.rope_head_dim,
                       self.v_head_dim, device, dtype)

    def pair_flops(self) -> int:
        """Training runs the expanded form (dense causal softmax): q.k over d_h + d_r, p.v over d_v."""
        return 3 * 2 * self.n_head * (self.qk_nope_head_dim + self.rope_head_dim + self.v_head_dim)

    def cache_elems_per_token(self) -> int:
        if self.mla_decode == "absorbed":
            return self.kv_lora_rank + self.rope_head_dim
        return self.n_head * (self.qk_nope_head_dim + self.rope_head_dim + self.v_head_dim)

    @classmethod
    def convert_from_mha(cls, state, prefix, config) -> float:
        """MLA from MHA weights (the low-rank factorisation of MHA2MLA and TransMLA; see pretrained.py):
        queries copied into q_proj, K and V through the rank-kv_lora_rank SVD latent."""
        w, b = state.pop(prefix + "c_attn.weight"), state.pop(prefix + "c_attn.bias")
        C = config.n_embd
        state[prefix + "q_proj.weight"], state[prefix + "q_proj.bias"] = w[:C], b[:C]
        (state[prefix + "kv_down.weight"], state[prefix + "kv_down.bias"], state[prefix + "k_up.weight"],
         state[prefix + "v_up.weight"], err) = svd_kv_latent(w, b, config.kv_lora_rank)
        if config.mla_latent_norm:
            state[prefix + "kv_norm.weight"] = torch.ones(config.kv_lora_rank)
        return err


def svd_kv_latent(c_attn_w, c_attn_b, rank):
    """MHA c_attn (3C, C), (3C,) -> MLA kv_down weight (r, C) and bias (r,), k_up (C, r), v_up (C, r),
    from the rank-r truncated SVD of the stacked [W_k W_v | b] map; and that truncation's relative error.
    Ranks beyond the map's C + 1 columns get zero components (exact, but those latent dims stay unused)."""
    C = c_attn_w.size(1)
    affine = torch.cat([c_attn_w, c_attn_b[:, None]], dim=1)[C:].double()   # (2C, C+1)
    U, S, Vh = torch.linalg.svd(affine, full_matrices=False)
    keep = min(rank, S.numel())
    root = S[:keep].sqrt()
    up = torch.zeros(2 * C, rank, dtype=affine.dtype)
    down = torch.zeros(rank, C + 1, dtype=affine.dtype)
    up[:, :keep], down[:keep] = U[:, :keep] * root, root[:, None] * Vh[:keep]
    err = relative_error(affine, up @ down)
    up, down = up.float(), down.float()
    return down[:, :C].contiguous(), down[:, C].contiguous(), up[:C].contiguous(), up[C:].contiguous(), err
