"""The one interface every attention variant implements, and the one softmax.

A variant is a subclass of `Attention` built from (config, layer_idx). The hooks, all declared
on `Attention` (the ones without a default must be written by every variant):

    owned_keys: tuple                 the GPTConfig keys this variant reads beyond the shared ones
                                      (a key several variants read is declared by each). Set away
                                      from its default, a key that no variant of the plan owns is
                                      refused (GPTConfig.validate), as it would be ignored. Default ().
    default_n_kv_head(config) -> int  classmethod: KV heads when n_kv_head is 0 (unset).
                                      Default n_head.
    check_config(config)              classmethod: one-line ValueError for settings the variant
                                      cannot take, and it fills in its own keys' defaults in
                                      place (GPTConfig.validate calls it for the chosen variant
                                      only, so no caller needs to know which keys a variant
                                      reads). Default: the n_embd // n_head head-dim rules.
    forward(x, pos, cache=None) -> y  x, y: (B, T, C); pos: (T,) absolute positions. Required.
    init_cache(batch_size, max_len, device, dtype) -> a cache from attention/cache.py, which
                                      advances itself when updated. Required.
    cache_elems_per_token() -> int    the cache formula per token per layer (0 if constant). Required.
    cache_elems_for(n_tokens) -> int  the cache's elements after n_tokens (batch 1, no constant state).
                                      Default cache_elems_per_token() x min(n_tokens, cache_max_tokens());
                                      nsa adds one compressed K/V per complete block.
    cache_state_elems() -> int        a constant decoding state (batch 1), whatever the length.
                                      Default 0 (caches that grow per token).
    cache_max_tokens() -> int | None  the most tokens the cache holds (swa: its window); None, the
                                      default, for a cache that grows with every token.
    decodes_any_length: bool          the cache keeps all a step needs however long the sequence (a
                                      constant state, a window's ring): decoding never slides or crops
                                      it. Default False.
    context_within_block_size: bool   the variant is defined only up to block_size tokens, so
                                      decoding cannot slide past it. Default False.
    attn_flops_per_token(seq_len)     training FLOPs (forward + backward) of the attention itself as the
                                      variant computes it, what every budget counts (sweep --match=flops,
                                      plan.py, the run log's train_flops): the causal (query, key) pairs
                                      only. Default pair_flops() x mean_keys_per_query(seq_len).
    attn_flops_per_token_palm(seq_len)
                                      the same by PaLM's convention, every key a query may score (causal
                                      half not subtracted): for MFU only. Default pair_flops() x
                                      keys_per_query(seq_len). The recurrent variants override both.
    keys_seen(seq_len) -> bool (T, T) | None
                                      which earlier tokens each position reads in this layer (row =
                                      query), fixed before any data: causal by default (dense softmax;
                                      a recurrent state reads every earlier token too); a sparse pattern's
                                      own; None where content picks the keys (moba). tools/recall.py
                                      composes the layers' to tell which MQAR pairs a query can reach.
    keys_per_query(seq_len)           the most keys one query scores: seq_len by default (dense softmax);
                                      None for a layer that reads a state instead of keys.
    mean_keys_per_query(seq_len)      the keys a query scores averaged over positions 0..seq_len-1,
                                      causal pairs only. Default (seq_len + 1) / 2.
    pair_flops()                      training FLOPs per (query, key) pair over all heads. Default
                                      3 x 4 x n_head x head_dim (q.k and p.v).
    kernel_cases() -> {path: (kernel module, supports() arguments)}: every path the forward
                                      runs ("forward": training and prefill; "decode": new tokens
                                      against a cache; a variant's own, e.g. moba "gathered"), with
                                      the Triton kernel it may hand work to, or None and {"why": ...}
                                      where none serves it. attention/dispatch.py decides what runs
                                      for each and records why (`impl(device, path)`); a forward
                                      body picks the path and looks its answer up, never changes
                                      it. A path that calls `attend(keep=...)` says masked=True:
                                      the flash kernel takes no element mask, so dispatch picks
                                      PyTorch (and `attend` refuses a keep mask with impl="triton").
    convert_from_mha(state, prefix, config) -> float  classmethod: rewrite one layer's MHA weights
                                      (c_attn under prefix, as GPT-2 holds them) in `state` into the
                                      variant's own names -> the relative error of the K/V map it
                                      introduces (pretrained.py calls it per layer). Default: refused.

`attend` is the single softmax-attention routine that all softmax variants call:
positions decide causality and ALiBi, so the same call serves training (pos = 0..T-1),
prefill against a cache and one-token decoding.

attention/record.py holds the recording hook analyze.py reads: off by default, when `attend`
pays one `is None` check for it.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from attention import record
from attention.cache import KVCache
from attention.dispatch import ATTN_IMPLS, check_impl_runs_on, choose_impl  # noqa: F401  (public here too)
from attention.positional import RoPE, alibi_slopes, score_bias, visible_keys
from attn_kernels.gla_chunked import fp32


class Attention(nn.Module):
    """Base class: the hooks of the contract above, with their defaults."""

    context_within_block_size = False
    decodes_any_length = False
    owned_keys: tuple = ()

    @classmethod
    def default_n_kv_head(cls, config) -> int:
        return config.n_head

    @classmethod
    def check_config(cls, config):
        """The head dim n_embd // n_head: n_embd divisible by n_head (RoPE's own rules: rope_dim). A
        variant with its own rules overrides this and calls it (super()) unless it sets its own head dims."""
        if config.n_embd % config.n_head:
            raise ValueError(f"n_embd={config.n_embd} is not divisible by n_head={config.n_head}")

    @classmethod
    def rope_dim(cls, config) -> int:
        """The dims of each query/key head that RoPE sees (after check_config filled the defaults)."""
        return config.n_embd // config.n_head

    def forward(self, x: torch.Tensor, pos: torch.Tensor, cache=None) -> torch.Tensor:
        raise NotImplementedError

    def init_cache(self, batch_size: int, max_len: int, device, dtype):
        raise NotImplementedError

    def cache_elems_per_token(self) -> int:
        raise NotImplementedError

    def cache_state_elems(self) -> int:
        return 0

    def cache_elems_for(self, n_tokens: int) -> int:
        return self.cache_elems_per_token() * min(n_tokens, self.cache_max_tokens() or n_tokens)

    def cache_max_tokens(self) -> int | None:
        return None

    def kernel_cases(self) -> dict:
        return {"forward": (None, {})}

    # ---- which implementation runs (decided in attention/dispatch.py) ----
    @property
    def attn_impl(self) -> str:
        return self._attn_impl

    @attn_impl.setter
    def attn_impl(self, value: str):  # a new request forgets the choices made for the old one
        self._attn_impl = value
        self._impl_choices = {}

    def impl_choices(self, device) -> dict:
        """{path: ImplChoice} on `device`, decided on first use there and kept."""
        device = torch.device(device)
        if device not in self._impl_choices:
            self._impl_choices[device] = {path: choose_impl(self.attn_impl, device, module, case)
                                          for path, (module, case) in self.kernel_cases().items()}
        return self._impl_choices[device]

    def impl(self, device, path: str = "forward") -> str:
        """What runs for `path` on `device`: triton, sdpa or naive."""
        return self.impl_choices(device)[path].used

    # ---- training FLOPs: as computed (budgets) and PaLM's convention (MFU) ----
    def pair_flops(self) -> int:
        """Training FLOPs (forward + backward = 3x forward) of one (query, key) pair over all heads:
        q.k and p.v, 2 * head_dim each (one multiply-add is 2 FLOPs)."""
        return 3 * 4 * self.n_head * self.head_dim

    def keys_seen(self, seq_len: int) -> torch.Tensor | None:
        """bool (seq_len, seq_len): query i reads token j in this layer. Causal: every earlier token."""
        return torch.ones(seq_len, seq_len, dtype=torch.bool).tril()

    def keys_per_query(self, seq_len: int) -> int | None:
        """The most keys one query scores over seq_len tokens, with no causal saving: all of them for
        dense softmax. None for a layer that reads a state instead (the recurrent ones)."""
        return seq_len

    def mean_keys_per_query(self, seq_len: int) -> float:
        """Keys a query scores, averaged over positions 0..seq_len-1, counting only the causal pairs
        (query t reads keys 0..t): (seq_len + 1) / 2 for dense softmax."""
        return (seq_len + 1) / 2

    def attn_flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token of the attention itself (beyond the weight matmuls that 6N counts)
        as this variant computes it: only the pairs its mask keeps, so that budgets matched on FLOPs
        (sweep --match=flops, plan.py) compare the work each variant does. Dense causal softmax
        computes half the score matrix, (seq_len + 1) / 2 keys per query on average."""
        return self.pair_flops() * self.mean_keys_per_query(seq_len)

    def attn_flops_per_token_palm(self, seq_len: int) -> float:
        """The same under PaLM's MFU convention (Chowdhery et al. 2022, appendix B): every query billed
        for all the keys it may score, causal half not subtracted (12 x H x D x T for dense softmax),
        so that MFU compares with published figures. For MFU only; budgets use attn_flops_per_token."""
        return self.pair_flops() * self.keys_per_query(seq_len)

    # ---- what every variant sets up and uses the same way ----
    def setup_output_and_positions(self, config):
        """The output projection c_proj (n_head * head_dim -> n_embd) with its dropout, and the
        position, dropout and impl settings. Variants call it where c_proj belongs among their
        layers: weights are initialised in registration order, so the place fixes the draw."""
        self.c_proj = nn.Linear(self.n_head * self.head_dim, config.n_embd, bias=config.bias)
        # attn_output_gate=sigmoid: one gate per output element, from the layer input (registered after
        # c_proj, so without it the initial weights are drawn exactly as before the key existed)
        self.gate_proj = None
        if config.attn_output_gate == "sigmoid":
            self.gate_proj = nn.Linear(config.n_embd, self.n_head * self.head_dim, bias=config.bias)
        self.resid_dropout = dropout_layer(config.dropout)
        self.dropout = config.dropout
        self.pos_encoding = config.pos_encoding
        self.rotary = RoPE.from_config(config) if config.pos_encoding == "rope" else None
        self.attn_impl = config.attn_impl
        if config.pos_encoding == "alibi":
            self.register_buffer("alibi_slopes", alibi_slopes(self.n_head), persistent=False)
        else:
            self.alibi_slopes = None

    def rope(self, pos, *xs):
        """Rotate each (B, heads, T, d) tensor by RoPE at positions pos (no-op without rope)."""
        return xs if self.rotary is None else self.rotary(pos, *xs)

    @property
    def attn_dropout(self) -> float:
        return self.dropout if self.training else 0.0

    def output(self, y, x=None):
        """y (B, H, T, D) -> (B, T, C) through c_proj; x (B, T, C), the layer input, feeds the gate
        (a variant that passes no x cannot take attn_output_gate).

            attn_output_gate=sigmoid:  y_h <- y_h * sigmoid(x W_g)_h   (Qiu et al. 2025, their G1)
        """
        B, H, T, D = y.shape
        y = y.transpose(1, 2)                                          # (B, T, H, D)
        if self.gate_proj is not None:
            if x is None:
                raise ValueError(f"{type(self).__name__} calls output(y) without the layer input, so "
                                 "attn_output_gate cannot run; pass it: self.output(y, x)")
            y = y * torch.sigmoid(self.gate_proj(x)).view(B, T, H, D)
        return self.resid_dropout(self.c_proj(y.reshape(B, T, H * D)))

    @classmethod
    def convert_from_mha(cls, state, prefix, config) -> float:
        raise ValueError(f"attention={config.attention} cannot be converted from MHA weights; "
                         "choose mha, gqa, mqa or mla")


def chunk_lengths(seq_len: int, block: int) -> list:
    """The lengths of the blocks of `block` tokens that cut seq_len (the last one may be short)."""
    return [min(block, seq_len - start) for start in range(0, seq_len, block)]


def mean_keys_in_blocks(seq_len: int, block: int, earlier=lambda b: 0) -> float:
    """Keys per query, averaged over positions 0..seq_len-1, when the sequence is cut into blocks of
    `block` tokens and a query of block b reads its own block causally (its offset + 1 keys) and
    earlier(b) whole earlier blocks: the count BigBird's and MoBA's blocks and the chunked
    recurrent forms (earlier 0: the causal pairs within a chunk) share, so it is written once.
    Dense causal attention is one block of seq_len, (seq_len + 1) / 2."""
    total = sum(n * (n + 1) // 2 + n * block * earlier(b) for b, n in enumerate(chunk_lengths(seq_len, block)))
    return total / seq_len


def dropout_layer(p: float) -> nn.Module:
    """nn.Dropout(p), or nn.Identity when p is 0: a Dropout call costs ~4 us even when it drops nothing,
    and a decoding step at batch 1 makes 2 * n_layer + 1 of them."""
    return nn.Dropout(p) if p > 0 else nn.Identity()


def relative_error(exact, approx) -> float:
    """||exact - approx||_F / ||exact||_F: what a weight conversion (convert_from_mha) loses."""
    return ((exact - approx).norm() / exact.norm()).item()


class QKVAttention(Attention):
    """Shared by the variants that project x to per-head q and per-KV-head k, v (MHA family,
    BigBird): the fused projection with RoPE on q/k, and a K/V cache. Subclasses write
    forward() from project() and output().

        x (B,T,C) --c_attn--> [ q: n_head*D | k: n_kv_head*D | v: n_kv_head*D ]
    """

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_dim = config.n_embd // config.n_head
        self.c_attn = nn.Linear(config.n_embd, (self.n_head + 2 * self.n_kv_head) * self.head_dim, bias=config.bias)
        self.setup_output_and_positions(config)

    def project(self, x, pos):
        """x (B, T, C) -> q (B, H, T, D), k, v (B, Hkv, T, D), RoPE applied at `pos` to q and k at once
        (views of one tensor of H + Hkv heads: half the small ops of a decoding step's rotation)."""
        B, T, _ = x.shape
        H, Hkv = self.n_head, self.n_kv_head
        heads = self.c_attn(x).view(B, T, H + 2 * Hkv, self.head_dim).transpose(1, 2)   # [q: H | k: Hkv | v: Hkv]
        qk, = self.rope(pos, heads[:, :H + Hkv])
        return qk[:, :H], qk[:, H:], heads[:, H + Hkv:]

    def init_cache(self, batch_size, max_len, device, dtype):
        return KVCache(batch_size, self.n_kv_head, max_len, self.head_dim, self.head_dim, device, dtype)

    def cache_elems_per_token(self) -> int:
        return 2 * self.n_kv_head * self.head_dim

    def kernel_cases(self) -> dict:
        """Training and prefill ("forward") and steps against a cache ("decode", keys in position order
        ending at the last query, as the kernel's bottom-right causality wants): the same kernel case."""
        case = ("attn_kernels.flash_attn",
                dict(head_dim_qk=self.head_dim, head_dim_v=self.head_dim, dropout=self.dropout))
        return {"forward": case, "decode": case}


def attend(q, k, v, q_pos, k_pos, *, alibi_slopes=None, forget=None, keep=None, window=None, scale=None,
           dropout_p: float = 0.0, impl: str = "sdpa", sees_all_keys: bool = False) -> torch.Tensor:
    """Causal softmax attention by absolute positions.

    q: (B, H, Tq, Dqk)   k: (B, Hkv, Tk, Dqk)   v: (B, Hkv, Tk, Dv)   H % Hkv == 0
    q_pos: (Tq,)  k_pos: (Tk,)   query i sees key j iff k_pos[j] <= q_pos[i], in any order of the keys
    forget: optional (c_q (B, H, Tq), c_k (B, H, Tk)) fp32, FoX's cumulative log forget gates: the score
    bias c_q[i] - c_k[j] (attention/fox.py)
    alibi_slopes: (H,) or None    keep: optional bool (Tq, Tk), (H, Tq, Tk) or (B, H, Tq, Tk) extra mask
    window: optional int W: query i sees only keys with k_pos[j] > q_pos[i] - W (its last W positions)
    sees_all_keys: the caller knows that positions let every query see every key (one token after a
    cache's keys: a decoding step), so PyTorch runs without building a mask, a few ops of each step
    Returns (B, H, Tq, Dv).
    """
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    if record.state is not None:  # analyze.py is recording: plain math that keeps the probabilities
        return record.recorded_attention(q, k, v, q_pos, k_pos, alibi_slopes, keep, scale, dropout_p, window, forget)
    # The kernel aligns causality bottom-right, which is what positions mean here: the
    # keys of a cache are contiguous and end at the last query.
    if impl == "triton":  # attention/dispatch.py chose it: no keep mask, no dropout
        if keep is not None:  # the kernel would drop it: a silently wrong result on CUDA only
            raise ValueError("attend: keep= cannot run on the flash kernel, which takes no element mask; declare "
                             "masked=True in the layer's kernel_cases so that dispatch picks PyTorch")
        from attn_kernels.flash_attn import flash_attention  # keys in position order, ending at the last query
        return flash_attention(q, k, v, causal=True, softmax_scale=scale, alibi_slopes=alibi_slopes, window=window,
                               forget=forget)

    unmasked = sees_all_keys and keep is None and window is None and impl != "naive"
    allowed = None if unmasked else visible_keys(q_pos, k_pos, keep, window)   # (Tq, Tk) or keep's shape
    bias = score_bias(alibi_slopes, forget, q_pos, k_pos)   # (H, Tq, Tk), (B, H, Tq, Tk) or None
    if impl == "naive":
        return _naive_attention(q, k, v, allowed, bias, scale, dropout_p)
    plain_causal = bias is None and not unmasked and keep is None and window is None and q.size(2) == k.size(2)
    if plain_causal or (unmasked and bias is None):
        mask = None
    elif bias is None:
        mask = allowed
    else:  # additive float mask carrying ALiBi (and causality, unless every key is visible)
        mask = (bias if unmasked else bias.masked_fill(~allowed, float("-inf"))).to(q.dtype)
    B, H, Tq, _ = q.shape
    Hkv = k.size(1)
    if H != Hkv and not plain_causal:
        # SDPA's enable_gqa copies each KV head once per query head (on CPU), which dominates
        # a decoding step. Instead fold the G query heads of a KV head onto the query axis:
        #   q (B, H, Tq, D) -> (B, Hkv, G*Tq, D);  mask (Tq, Tk) -> (G*Tq, Tk), (H, Tq, Tk) -> (Hkv, G*Tq, Tk)
        G = H // Hkv
        if mask is not None:
            mask = mask.repeat(G, 1) if mask.dim() == 2 else mask.reshape(*mask.shape[:-3], Hkv, G * Tq, -1)
        out = sdpa(q.reshape(B, Hkv, G * Tq, -1), k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
        return out.view(B, H, Tq, -1)
    return sdpa(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=plain_causal, scale=scale,
                enable_gqa=H != Hkv)


def sdpa(q, k, v, attn_mask=None, **kwargs):
    """F.scaled_dot_product_attention, in fp32 under CPU autocast (the result cast back to q's dtype).
    CPU autocast would run it in bf16, whose flash backward cost more than the bf16 matmuls saved at
    the studies' contexts (64-256 keys) on the CPUs measured (docs/speed.md, 'bf16 autocast'); in
    fp32 the scores and softmax statistics also keep fp32's precision, as in the Triton kernel."""
    if q.device.type != "cpu" or not torch.is_autocast_enabled("cpu"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **kwargs)
    mask = attn_mask if attn_mask is None or attn_mask.dtype == torch.bool else fp32(attn_mask)
    with torch.autocast("cpu", enabled=False):
        return F.scaled_dot_product_attention(fp32(q), fp32(k), fp32(v), attn_mask=mask, **kwargs).to(q.dtype)


def _naive_attention(q, k, v, allowed, bias, scale, dropout_p):
    """Explicit scores and softmax; GQA by grouping query heads (K/V are not copied)."""
    B, H, Tq, _ = q.shape
    Hkv = k.size(1)
    qg = q.view(B, Hkv, H // Hkv, Tq, -1)                            # (B, Hkv, G, Tq, D)
    if allowed.dim() >= 3:                                           # per-head (and per-sequence) mask
        allowed = allowed.view(*allowed.shape[:-3], Hkv, H // Hkv, Tq, -1)
    scores = (qg @ k.unsqueeze(2).transpose(-1, -2)).float() * scale  # (B, Hkv, G, Tq, Tk)
    if bias is not None:
        scores = scores + bias.view(*bias.shape[:-3], Hkv, H // Hkv, *bias.shape[-2:])
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = F.dropout(scores.softmax(dim=-1), p=dropout_p).to(v.dtype)
    return (probs @ v.unsqueeze(2)).reshape(B, H, Tq, -1)
