"""One GPT whose attention is chosen by config: GPTConfig, Block, GPT.

    idx -> wte (+ wpe if learned, + sinusoidal code) -> [Block: x + attn(ln_1(x)), x + mlp(ln_2(x))] x n_layer
        -> ln_f -> lm_head (tied to wte) -> logits

The attention variant comes from attention/ (config.attention); positions are absolute
token indices handed to every layer, so the same forward serves training, prefill and
one-token decoding with per-layer caches.
"""
import functools
import math
from dataclasses import asdict, dataclass, fields, replace
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from attention import VARIANTS, build_attention, key_owners, member_named_by_gla_knobs, variant_class
from attention.base import dropout_layer
from attention.dispatch import ATTN_IMPLS, impl_report, why_impl_cannot_run
from attention.positional import RoPE, sinusoidal_encoding

POS_ENCODINGS = ("rope", "alibi", "learned", "sinusoidal", "none")
ABSOLUTE_POSITIONS = ("learned", "sinusoidal")   # added to the token embeddings
ROPE_KEYS = ("rope_base", "rope_scaling", "rope_factor", "rope_original_context", "rope_beta_fast",
             "rope_beta_slow", "rope_attn_factor", "rope_fraction")
# The sin/cos code (elements of rms 1/sqrt(2)) is scaled to the rms of the 0.02-std tables of
# _init_weights (wte, and wpe for learned): at full scale its norm is ~35x a token's here and
# training stalls (the paper scales the embeddings up by sqrt(d_model) instead; GPT-2's init does not).
SINUSOIDAL_SCALE = 0.02 * math.sqrt(2)


@dataclass
class GPTConfig:
    block_size: int = 1024        # training context length (and the learned-position table size)
    vocab_size: int = 50304       # set from the dataset's meta.json by train.py
    n_layer: int = 12
    n_head: int = 12              # query heads; head_dim = n_embd // n_head (MLA: see qk_nope_head_dim)
    n_embd: int = 768
    dropout: float = 0.0          # on attention probabilities, residual branches and embeddings
    bias: bool = False            # biases in Linear and LayerNorm layers (GPT-2: True); MLA: see attention/mla.py
    gelu_approximate: str = "none"  # MLP activation, F.gelu's `approximate`: none (exact erf) | tanh (GPT-2's)
    mlp_hidden: int = 0           # MLP hidden width; 0 = 4 * n_embd (sweep --match=params solves it per variant)
    mlp: bool = True              # an MLP after each layer's mixer; False: the mixers alone (Zoology's MQAR models,
                                  # whose state mixer is an Identity: config/recall/zoology.py)
    layer_norm_eps: float = 1e-5  # LayerNorm epsilon (PyTorch's default, and GPT-2's)
    attention: str = "mha"        # one of attention.VARIANTS (mha, gqa, mqa, ...) for every layer, or a plan of
                                  # them, one per layer, comma-separated (Gemma 3's 5:1 "swa,swa,swa,swa,swa,mha")
    n_kv_head: int = 0            # KV heads; 0 = what `attention` implies (mha: n_head, mqa: 1)
    pos_encoding: str = "rope"    # rope | alibi | learned | sinusoidal | none
    rope_base: float = 10000.0    # RoPE theta_i = rope_base^(-2i/d); > 1
    rope_scaling: str = "none"    # RoPE past the trained context (attention/positional.py, RoPE): none | pi
                                  # (theta / factor) | ntk (base * factor^(d/(d-2))) | yarn (per-frequency ramp)
    rope_factor: float = 1.0      # pi/ntk/yarn: the context extension factor s >= 1
    rope_original_context: int = 0  # yarn: the context the model was trained at; 0 = block_size
    rope_beta_fast: float = 32.0  # yarn: pairs turning more than this often over the original context keep theta
    rope_beta_slow: float = 1.0   # yarn: pairs turning less often get theta / factor (a linear ramp between)
    rope_attn_factor: float = 0.0  # yarn: cos and sin times this (logits times its square); 0 = 0.1 ln(s) + 1
    rope_fraction: float = 1.0    # rotate the first int(fraction * d) dims of each head (GPT-NeoX rotary_pct;
                                  # MLA: of the decoupled key); 0 = no positions
    attn_impl: str = "auto"       # auto (Triton on CUDA, else SDPA) | triton | sdpa | naive
    attn_output_gate: str = "none"  # softmax variants: none | sigmoid (y_h * sigmoid(x W_g)_h before c_proj,
                                  # elementwise per head from the block input: Qiu et al. 2025, "Gated Attention")
    # --- MLA (attention/mla.py), DeepSeek-V2 section 2.1 ---
    q_lora_rank: int = 0          # query compression rank; 0 = a full query projection
    kv_lora_rank: int = 0         # latent KV rank d_c; 0 = 4 * qk_nope_head_dim (the paper's ratio)
    rope_head_dim: int = -1       # decoupled RoPE dim d_h^R; -1 = qk_nope_head_dim / 2 with rope, else 0
    qk_nope_head_dim: int = 0     # per-head q/k dims without RoPE d_h; 0 = n_embd // n_head (any value frees
                                  # n_head * d_h from n_embd, e.g. DeepSeek-V2: 5120 wide, 128 heads of 128)
    v_head_dim: int = 0           # per-head value dims (what c_proj reads, H * v_head_dim); 0 = qk_nope_head_dim
    mla_latent_norm: bool = True  # RMSNorm on the latent c_kv (DeepSeek-V2); off in conversions from MHA
    mla_decode: str = "absorbed"  # absorbed (cache only the latent) | expanded (cache per-head K/V)
    # --- BigBird block-sparse (attention/bigbird.py) ---
    sparse_block: int = 16        # tokens per block
    sparse_window: int = 3        # blocks back, including the diagonal block
    sparse_global: int = 1        # first blocks every query attends to
    sparse_random: int = 1        # random earlier blocks per query block
    sparse_seed: int = 0          # seed of the random blocks (the layout is saved with the model)
    # --- sliding window (attention/swa.py) and MoBA (attention/moba.py, blocks of sparse_block) ---
    sliding_window: int = 256     # swa: keys each query sees, itself included (Mistral 7B: 4096); the cache
                                  # holds at most this many tokens per layer
    moba_topk: int = 2            # moba: earlier key blocks each query picks by q . mean(k), besides its own
    # --- gated linear attention (attention/gla.py) ---
    gla_gate: str = "data"        # the decay: data (GLA's, from x) | fixed (RetNet's gamma_h = 1 - 2^(-5-h)) | none
    gla_feature_map: str = "identity"  # phi on q and k: identity (GLA) | elu (elu + 1, Katharopoulos) | relu |
                                  # softmax (Efficient Attention's pair: q over features, k over the keys seen)
    gla_chunk: int = 64           # chunk length of the chunked parallel form
    gla_output_gate: str = "swish"  # swish (o * silu(x W_r), the paper's) | none (no r projection)
    gla_norm: str = "rms"         # rms (per-head RMSNorm on o, the paper's) | sum (o_t / phi(q_t) . sum_j phi(k_j),
                                  # Katharopoulos et al.; positive maps, no RoPE) | none
    gla_conv: int = 0             # taps of a short causal convolution (then SiLU) on q, k and v before phi and RoPE
                                  # (fla's use_short_conv, 4 there); 0 = none. Its last gla_conv - 1 inputs join
                                  # the decoding state
    # --- FoX (attention/fox.py): softmax with a data-dependent forget gate, log f_t summed into the scores ---
    fox_pro: bool = False         # the paper's "Pro" attention parts: QK-norm (per-head RMSNorm on q, k) and the
                                  # sigmoid output gate; off: FoX differs from MHA in the forget gate alone
    # --- NSA (attention/nsa.py): compressed blocks of sparse_block keys, the top blocks by their scores, a
    # window of sliding_window keys, mixed by learned gates ---
    nsa_stride: int = 0           # a compressed block every nsa_stride keys (dividing sparse_block; the paper's
                                  # 16 for blocks of 32); 0 = sparse_block, disjoint blocks (fla's)
    nsa_topk: int = 4             # selection blocks each query reads, the first, its own and the previous one
                                  # among them (>= 3; the paper's 16 blocks of 64)
    nsa_compress: str = "mean"    # phi of a block's keys and values: mean (fla's) | mlp (the paper's learned map)
    # --- conv (attention/conv.py): Zoology's BaseConv as a layer of a plan, e.g. attention="conv,mha" ---
    conv_taps: int = 3            # taps of its depthwise causal convolution (Zoology's 3); its last conv_taps - 1
                                  # inputs are its decoding state
    # --- the delta rule (attention/deltanet.py: deltanet, gated_deltanet) ---
    delta_conv: int = 4           # taps of the short causal convolution on q, k and v (the papers' 4; 1 = none
                                  # over time); its last delta_conv - 1 inputs are part of the decoding cache
    delta_chunk: int = 16         # chunk length of the chunked (WY) form: 16 is the fastest on a CPU at the studies'
                                  # 256 tokens, about even with 32 to 4,096 (fla's GPU kernels use 64; docs/speed.md)
    delta_beta: str = "sigmoid"   # the write strength: sigmoid (beta in (0, 1), the papers') | sigmoid2 (2 sigmoid,
                                  # in (0, 2): I - beta k k^T may flip sign, Grazzi et al. 2025's negative eigenvalues)

    def __post_init__(self):
        self.validate()

    @property
    def attention_plan(self) -> list:
        """The attention variant of each layer (n_layer names)."""
        plan = [a.strip() for a in self.attention.split(",")]
        return plan if len(plan) > 1 else plan * self.n_layer

    def layer_config(self, layer_idx: int) -> "GPTConfig":
        """The config layer layer_idx is built from: this one, or for a plan the copy validated for
        that layer's variant (validate made them; each fills its own defaults, e.g. n_kv_head)."""
        plan = self.attention_plan
        return self._layer_configs[plan[layer_idx]] if "," in self.attention else self

    def validate(self):
        """Raise ValueError with one line naming the problem and what is allowed."""
        plan = self.attention_plan
        for name in dict.fromkeys(plan):
            if name not in VARIANTS:
                where = f" in the plan attention={self.attention!r}" if "," in self.attention else ""
                raise ValueError(f"unknown attention={name!r}{where}; choose one of {', '.join(VARIANTS)}")
        if self.pos_encoding not in POS_ENCODINGS:
            raise ValueError(f"unknown pos_encoding={self.pos_encoding!r}; choose one of {', '.join(POS_ENCODINGS)}")
        if self.attn_impl not in ATTN_IMPLS:
            raise ValueError(f"unknown attn_impl={self.attn_impl!r}; choose one of {', '.join(ATTN_IMPLS)}")
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout} must be in [0, 1)")
        if self.gelu_approximate not in ("none", "tanh"):
            raise ValueError(f"unknown gelu_approximate={self.gelu_approximate!r}; choose none or tanh")
        if self.mlp_hidden < 0:
            raise ValueError(f"mlp_hidden={self.mlp_hidden} must be >= 0 (0 = 4 * n_embd)")
        if self.mlp_hidden and not self.mlp:
            raise ValueError(f"mlp_hidden={self.mlp_hidden} sets the width of an MLP that mlp=False leaves out; "
                             "leave mlp_hidden at 0 or set mlp=True")
        if self.attn_output_gate not in ("none", "sigmoid"):
            raise ValueError(f"unknown attn_output_gate={self.attn_output_gate!r}; choose none or sigmoid")
        if not self.layer_norm_eps > 0:
            raise ValueError(f"layer_norm_eps={self.layer_norm_eps} must be > 0")
        self.check_owned_keys(plan)
        if "," in self.attention:
            self.validate_plan()
            return
        variant = variant_class(self.attention)
        if self.n_kv_head == 0:
            self.n_kv_head = variant.default_n_kv_head(self)
        variant.check_config(self)  # the variant's own rules (KV heads, allowed positions, its knobs)
        if self.n_kv_head < 1 or self.n_head % self.n_kv_head:
            raise ValueError(f"n_head={self.n_head} is not divisible by n_kv_head={self.n_kv_head}")
        self.check_rope(variant)

    def validate_plan(self):
        """A per-layer plan: one variant per layer, and every variant's own rules on a copy of this
        config with that attention (other variants' keys at their defaults there)."""
        plan = self.attention_plan  # as written: a plan names its layers
        if len(plan) != self.n_layer:
            raise ValueError(f"attention={self.attention!r} plans {len(plan)} layers but n_layer={self.n_layer}; "
                             "name one variant per layer")
        self._layer_configs = {}
        for name in dict.fromkeys(plan):
            others = {k: getattr(GPTConfig, k) for k, owners in key_owners().items() if name not in owners}
            try:
                self._layer_configs[name] = replace(self, attention=name, **others)
            except ValueError as e:
                raise ValueError(f"attention plan, its {name} layers: {e}") from None

    def check_owned_keys(self, plan):
        """A variant's own key (attention.key_owners: each variant declares its owned_keys) set away
        from its default is refused when no variant of the plan reads it: it would be ignored. The
        fix names the default as a command-line flag, which resets a value a config file set."""
        for key, owners in key_owners().items():
            value, default = getattr(self, key), getattr(GPTConfig, key)
            if value != default and not set(owners) & set(plan):
                raise ValueError(f"{key}={value!r} is set but no variant of attention={self.attention} reads it "
                                 f"(owned by attention={', '.join(owners)}); drop it, or reset it to its "
                                 f"default on the command line: --{key}={default}")

    def check_rope(self, variant):
        """The rope_* keys: checked against the dims the variant rotates, refused without RoPE."""
        if self.pos_encoding == "rope":
            RoPE.from_config(self).check(variant.rope_dim(self))
            return
        for key in ROPE_KEYS:  # without RoPE they would be silently ignored
            if getattr(self, key) != getattr(GPTConfig, key):
                raise ValueError(f"{key} needs pos_encoding=rope (got {self.pos_encoding}); leave it unset")

    def to_dict(self):
        return asdict(self)

    @classmethod
    def from_dict(cls, d):
        """A saved config (checkpoint, summary): unknown keys dropped; attention=gla whose knobs spell a
        named linear-family member renamed to it (same layer, same weights, config/linear.py before the
        names); and a variant's key that no variant of its plan reads reset to its default (such a key
        was ignored when the model was built, before check_owned_keys refused it): every checkpoint loads."""
        defaults = {f.name: f.default for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in defaults}
        attention = [a.strip() for a in str(d.get("attention", cls.attention)).split(",")]
        member = "gla" in attention and member_named_by_gla_knobs(SimpleNamespace(**{**defaults, **d}))
        if member:  # attention=gla with a named member's knobs (saved before the names): that name
            d["attention"] = ",".join(member if a == "gla" else a for a in attention)
            attention = d["attention"].split(",")
        ignored = {k for k, owners in key_owners().items() if not set(owners) & set(attention)}
        return cls(**{k: v for k, v in d.items() if k not in ignored})


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        hidden = config.mlp_hidden or 4 * config.n_embd
        self.c_fc = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = dropout_layer(config.dropout)
        self.gelu_approximate = config.gelu_approximate

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate=self.gelu_approximate)))


class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias)
        self.attn = build_attention(config.layer_config(layer_idx), layer_idx)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias) if config.mlp else None
        self.mlp = MLP(config) if config.mlp else None

    def forward(self, x, pos, cache=None):
        x = x + self.attn(self.ln_1(x), pos, cache)
        return x if self.mlp is None else x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd) if config.pos_encoding == "learned" else None
        self.drop = dropout_layer(config.dropout)
        self.h = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        self.apply(self._init_weights)
        # GPT-2: residual projections scaled by 1/sqrt(2 * n_layer)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # ---- which attention implementation runs (decided in attention/dispatch.py) ----
    def to(self, *args, **kwargs):
        """nn.Module.to, then every layer decides what runs on the new device, once: forward
        passes (compiled ones too) only look the choice up. Where attn_impl cannot run at all
        (triton off CUDA without the interpreter) the choice waits for the first forward, so that
        scripts can refuse first in one line (check_impl_runs_on)."""
        super().to(*args, **kwargs)
        device = next(self.parameters()).device
        if device.type != "meta" and not why_impl_cannot_run(self.config.attn_impl, device):
            self.attn_impl_report()
        return self

    def attn_impl_report(self, device=None) -> dict:
        """What attention runs on `device` (default: the model's), for logs and summary.json:
        {"requested": attn_impl, "used": triton|sdpa|naive (or per path / per layer where they
        differ), "why": the reasons for any fallback, or None}."""
        device = device if device is not None else next(self.parameters()).device
        return impl_report([b.attn.impl_choices(device) for b in self.h])

    def forward(self, idx, targets=None, caches=None, last_only=False, counted_only=False):
        """idx (B, T) -> logits (B, T, V) (or (B, 1, V) with last_only), loss or None.
        With caches, idx holds only the new tokens and positions continue from the caches.
        counted_only (with targets): the head runs only where a target is counted (not -1), and the
        logits are (N, V) for those N positions in row-major order; the loss is the same. For datasets
        of examples (MQAR: 4 answers in 64 tokens), where the head over every position is a fifth
        of the step's work for nothing."""
        T = idx.size(1)
        start = caches[0].pos if caches is not None else 0
        pos = torch.arange(start, start + T, device=idx.device)
        x = self.wte(idx)
        if self.wpe is not None:
            if start + T > self.config.block_size:
                raise ValueError(f"learned positions stop at block_size={self.config.block_size}")
            x = x + self.wpe(pos)
        elif self.config.pos_encoding == "sinusoidal":
            x = x + (SINUSOIDAL_SCALE * sinusoidal_encoding(pos, self.config.n_embd)).to(x.dtype)
        x = self.drop(x)
        for i, block in enumerate(self.h):
            x = block(x, pos, caches[i] if caches is not None else None)
        if targets is not None:
            h = self.ln_f(x)
            if counted_only:
                counted = targets != -1
                h, targets = h[counted], targets[counted]          # (N, C), (N,)
            logits = self.lm_head(h)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
            return logits, loss
        return self.lm_head(self.ln_f(x[:, -1:] if last_only and T > 1 else x)), None

    # ---- decoding ----
    def init_caches(self, batch_size, max_len, device=None, dtype=None):
        p = next(self.parameters())
        return [b.attn.init_cache(batch_size, max_len, device or p.device, dtype or p.dtype) for b in self.h]

    def cache_elems_per_token(self) -> int:
        """Formula: cache elements per token, summed over layers."""
        return sum(b.attn.cache_elems_per_token() for b in self.h)

    def cache_elems_per_seq(self, n_tokens: int) -> int:
        """Formula: elements of the per-token cache after n_tokens, summed over layers (a window's
        ring stops at its window); the constant state (cache_state_elems) comes on top."""
        return sum(b.attn.cache_elems_for(n_tokens) for b in self.h)

    def cache_max_tokens(self) -> int | None:
        """The fewest tokens a layer's cache stops at (swa: its window), or None if every cache grows."""
        caps = [b.attn.cache_max_tokens() for b in self.h if b.attn.cache_max_tokens() is not None]
        return min(caps) if caps else None

    def cache_state_elems(self) -> int:
        """Constant decoding state (elements, batch 1, all layers): linear attention's
        recurrent state; 0 for K/V caches, which grow per token instead."""
        return sum(b.attn.cache_state_elems() for b in self.h)

    def context_window(self, max_context=None) -> int:
        """How many tokens decoding keeps: learned positions end at block_size, and so do
        variants whose pattern is defined on block_size (`Attention.context_within_block_size`);
        RoPE, ALiBi and no positions slide a cache of max_context (default block_size) tokens."""
        limited = self.wpe is not None or any(b.attn.context_within_block_size for b in self.h)
        if limited and max_context and max_context > self.config.block_size:
            why = ("learned positions stop" if self.wpe is not None
                   else f"attention={self.config.attention} is defined up to")
            raise ValueError(f"{why} at block_size={self.config.block_size}; lower max_context to at most that")
        if self.wpe is not None:
            return self.config.block_size
        return max_context or self.config.block_size

    @torch.no_grad()
    def generate_stream(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None,
                        generator=None, use_cache=True, max_context=None, compile=False):
        """Yield the next token ids (B,) one step at a time.

        With the cache: one prefill pass over the prompt (cropped to the window), then one
        token per step. Learned positions fall back to recomputing the last block_size
        tokens once the cache reaches block_size; the others slide their cache.
        Without the cache: recompute the last `window` tokens every step.
        Sinusoidal positions are absolute too, so they fall back like learned ones once the
        cache holds `window` tokens (a slid cache would disagree with a recompute from 0).
        compile=True runs the one-token steps through torch.compile (compiled_step); off by default.
        """
        window = self.context_window(max_context)
        # A cache that holds all a step needs at any length (linear attention's state, a window's
        # ring) never drops old tokens' influence: it covers everything since the cropped prompt,
        # so recomputing starts from the same token to agree with it.
        any_length = all(b.attn.decodes_any_length for b in self.h)
        first = max(0, idx.size(1) - window) if any_length else None
        step = self.compiled_step if compile and use_cache else self
        tokens = idx.new_empty(idx.size(0), idx.size(1) + max_new_tokens)  # the sequence so far, written in place
        tokens[:, :idx.size(1)] = idx
        caches = None
        for n in range(idx.size(1), tokens.size(1)):
            idx = tokens[:, :n]
            if not use_cache:
                logits, _ = self(idx[:, first:] if first is not None else idx[:, -window:], last_only=True)
            elif caches is None:
                context = idx[:, -window:]
                length = context.size(1) + max_new_tokens
                caches = self.init_caches(idx.size(0), length if any_length else min(window, length))
                logits, _ = self(context, caches=caches, last_only=True)
            elif self.config.pos_encoding in ABSOLUTE_POSITIONS and first is None and caches[0].pos >= window:
                logits, _ = self(idx[:, -window:], last_only=True)
            else:
                logits, _ = step(idx[:, -1:], caches=caches, last_only=True)
            tokens[:, n] = next_id = sample_next(logits[:, -1, :].float(), temperature, top_k, top_p, generator)
            yield next_id

    @functools.cached_property
    def compiled_step(self):
        """forward through torch.compile, for one-token decoding steps against caches (generate_stream's
        compile=True). On CPU at small widths a step is mostly per-op overhead, which compiling removes
        (~2-4x fewer ms per token; python -m tools.bench --suite=decode --compile), at the price of a
        first call that compiles for tens of seconds and needs a C++ compiler: opt-in, never the default.
        torch.compile caches by code object: every model compiled in one process, and each new cache
        shape, counts against torch._dynamo.config.recompile_limit (8; past it, steps run eagerly)."""
        return torch.compile(self.forward)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, **kwargs):
        """idx (B, T) -> (B, T + max_new_tokens)."""
        new = list(self.generate_stream(idx, max_new_tokens, **kwargs))
        return torch.cat([idx] + [t[:, None] for t in new], dim=1)

    # ---- training helpers ----
    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW; weight decay only on matrices (not biases, norms)."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type == "cuda")

    def flops_per_token(self, seq_len=None) -> float:
        """Training FLOPs per token as each variant computes them, at seq_len (default block_size): 6N
        for the weights plus each layer's attn_flops_per_token (the causal pairs only: 12 * H * D *
        (T + 1) / 2 for dense softmax; the visited keys for sparse, the chunked form for linear). What
        every budget counts: sweep --match=flops, plan.py, the run log's train_flops."""
        seq_len = seq_len or self.config.block_size
        return 6 * self.num_params() + sum(b.attn.attn_flops_per_token(seq_len) for b in self.h)

    def flops_per_token_palm(self, seq_len=None) -> float:
        """Training FLOPs per token under PaLM's convention (Chowdhery et al. 2022, appendix B): 6N plus
        12 * H * D * T per layer for dense softmax, the causal half not subtracted (each layer's
        attn_flops_per_token_palm). For MFU only, so that it compares with published figures."""
        seq_len = seq_len or self.config.block_size
        return 6 * self.num_params() + sum(b.attn.attn_flops_per_token_palm(seq_len) for b in self.h)

    def estimate_mfu(self, tokens_per_sec: float, device: torch.device):
        """Model FLOPs utilization against the device's bf16 dense peak, with FLOPs counted by PaLM's
        convention (flops_per_token_palm); None when the peak is unknown (CPU)."""
        peak = device_peak_flops(device)
        return None if peak is None else self.flops_per_token_palm() * tokens_per_sec / peak


# bf16 dense tensor-core peaks (FLOP/s), matched by substring of the CUDA device name
GPU_PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12,
                  "L4": 121e12, "4090": 165e12, "3090": 71e12, "V100": 125e12, "T4": 65e12}


def device_peak_flops(device: torch.device):
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in GPU_PEAK_FLOPS.items() if key in name), None)


def sample_next(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    """logits (B, V) -> token ids (B,). temperature 0 = greedy."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cum - sorted_logits.softmax(dim=-1) >= top_p   # keep the smallest prefix reaching top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
