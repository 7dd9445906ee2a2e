"""Positional encodings: RoPE (one object: base, scaling, fraction) and ALiBi, used by every
attention variant, and the sinusoidal absolute code (added to the token embeddings by model.py).

All work on absolute positions (a LongTensor of the tokens' indices in the
sequence), so a decoder with a cache just passes the positions of the new tokens.
"""
import math
from dataclasses import dataclass

import torch


def rope_inv_freq(dim: int, base: float) -> torch.Tensor:
    """theta_i = base^(-2i/dim) for i in [0, dim/2) (RoFormer, eq. 15)."""
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def rope_turns(rotated_dims: int, base: float, context: int) -> torch.Tensor:
    """Full turns each pair makes over `context` positions, unscaled: context * theta_i / (2 pi), (r/2,) fp64,
    fastest (pair 0) first. YaRN's bands are set by this count (Peng et al. 2023, section 3.2)."""
    return context * rope_inv_freq(rotated_dims, base) / (2 * math.pi)


def rope_cos_sin(pos: torch.Tensor, inv_freq: torch.Tensor, scale: float = 1.0):
    """cos/sin of m*theta_i for each position m, times scale: two (T, len(inv_freq)) fp32 tensors.

    Computed on the fly in fp64 (so large positions keep their precision) rather
    than read from a table, so decoding may run past any training length.
    """
    angles = pos.to(torch.float64)[:, None] * inv_freq.to(pos.device)[None, :]
    cos, sin = angles.cos(), angles.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos.float(), sin.float()


def rope_rotation(pos: torch.Tensor, inv_freq: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """rope_cos_sin as one complex64 (T, len(inv_freq)) tensor cos + j sin: what rotate_pairs multiplies by."""
    return torch.complex(*rope_cos_sin(pos, inv_freq, scale))


def rotate_pairs(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x[2i], x[2i+1]) of the last dim by the angle m*theta_i.

    x: (B, H, T, D) with D even; rotation: (T, D/2) complex, cos + j sin. Returns x's dtype.
    A pair is a complex number x[2i] + j*x[2i+1]; rotating it is one complex product,
    which is much cheaper on CPU than the four real products written out.
    """
    pairs = x.float().unflatten(-1, (-1, 2))                  # (B, H, T, D/2, 2)
    if pairs.stride(-2) != 2 or any(st % 2 for st in pairs.stride()[:-2]):
        pairs = pairs.contiguous()                            # view_as_complex needs even strides
    return torch.view_as_real(torch.view_as_complex(pairs) * rotation).flatten(-2).type_as(x)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """rotate_pairs with the angles' cos and sin, each (T, D/2)."""
    return rotate_pairs(x, torch.complex(cos, sin))


ROPE_SCALINGS = ("none", "pi", "ntk", "yarn")
ROPE_TABLE_MIN = 1024  # positions a CPU rotation table starts with; it doubles as positions pass it
ROPE_TABLE_MAX = 1 << 16  # ... up to this many (32 MiB at head dim 128); later positions are computed
# Published extensions go 4x to 64x (PI, YaRN, Llama 3.1's 8x; LongRoPE's 512x the far end): a
# factor past 1024 is a typo (e.g. 1e308, which trained: theta / 1e308 is all but 0), not a study.
MAX_ROPE_FACTOR = 1024.0


@dataclass(frozen=True)
class RoPE:
    """The one rotation every variant applies (MHA family, BigBird, MLA's decoupled key, GLA), so
    training, decoding with a cache, eval.py and analyze.py see the same angles.

        head dims:  [ x_0 x_1 | x_2 x_3 | ... | x_{r-2} x_{r-1} | x_r ... x_{d-1} ]
                      pair 0    pair 1          pair r/2-1        passed through
        r = int(fraction * d) rotated dims (GPT-NeoX's rotary_pct, litgpt's rotary_percentage);
        pair i turns by m * theta_i at position m, theta_i = base^(-2i/r) before scaling.

    Scalings that stretch a model trained at `original_context` tokens by `factor`:
        pi    theta_i / factor: positions squeezed into the trained range (Chen et al. 2023)
        ntk   base * factor^(r/(r-2)): the lowest frequency interpolated by exactly `factor`,
              the highest kept ("NTK-aware" scaling, bloc97 2023)
        yarn  per pair, by how many turns it makes over the original context: more than
              beta_fast keep theta_i, fewer than beta_slow get theta_i / factor, a linear ramp
              in the pair index between; cos and sin times the attention factor (logits times
              its square), 0.1 ln(factor) + 1 by default (Peng et al. 2023; the ramp as in
              their code and Hugging Face's, with the bounds rounded outward)
    """
    base: float = 10000.0
    scaling: str = "none"
    factor: float = 1.0
    original_context: int = 0     # the trained context (yarn's ramp); resolved from block_size by from_config
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attn_factor: float = 0.0      # yarn's cos/sin multiplier; 0 = 0.1 ln(factor) + 1
    fraction: float = 1.0

    @classmethod
    def from_config(cls, config) -> "RoPE":
        return cls(config.rope_base, config.rope_scaling, config.rope_factor,
                   config.rope_original_context or config.block_size, config.rope_beta_fast,
                   config.rope_beta_slow, config.rope_attn_factor, config.rope_fraction)

    def check(self, head_dim: int) -> None:
        """ValueError (one line) for settings that would rotate nonsense, given the dims RoPE sees."""
        if not self.base > 1 or not math.isfinite(self.base):
            raise ValueError(f"rope_base={self.base} must be a finite number > 1 (theta_i = base^(-2i/d))")
        if self.scaling not in ROPE_SCALINGS:
            raise ValueError(f"unknown rope_scaling={self.scaling!r}; choose one of {', '.join(ROPE_SCALINGS)}")
        if not 1 <= self.factor <= MAX_ROPE_FACTOR:
            raise ValueError(f"rope_factor={self.factor} must be >= 1 and at most {MAX_ROPE_FACTOR:g} (the context "
                             "extension factor: the scaled context over the trained one)")
        if self.original_context < 1:  # yarn's ramp takes ln(original_context / ...)
            raise ValueError(f"rope_original_context={self.original_context} must be at least 1 (the context the "
                             "model was trained at), or 0 for block_size")
        if self.scaling == "none" and self.factor != 1:
            raise ValueError(f"rope_factor={self.factor} needs rope_scaling=pi, ntk or yarn")
        yarn_keys = (self.beta_fast, self.beta_slow, self.attn_factor)
        if self.scaling != "yarn" and yarn_keys != (RoPE.beta_fast, RoPE.beta_slow, RoPE.attn_factor):
            raise ValueError("rope_beta_fast, rope_beta_slow and rope_attn_factor are yarn's; set "
                             f"rope_scaling=yarn or leave them unset (rope_scaling={self.scaling})")
        if not self.beta_fast > self.beta_slow > 0:
            raise ValueError(f"rope_beta_fast={self.beta_fast} must be > rope_beta_slow={self.beta_slow} > 0")
        if not 0 <= self.attn_factor < math.inf:
            raise ValueError(f"rope_attn_factor={self.attn_factor} must be >= 0 (0 = yarn's 0.1 ln(factor) + 1)")
        if not 0 <= self.fraction <= 1:
            raise ValueError(f"rope_fraction={self.fraction} must be in [0, 1]")
        rotated = self.rotated_dims(head_dim)
        if rotated % 2:
            raise ValueError(f"RoPE rotates pairs, but rope_fraction={self.fraction} of the head dim {head_dim} "
                             f"is {rotated} dims, an odd number; change n_embd, n_head or rope_fraction")
        if self.scaling == "ntk" and rotated < 4:
            raise ValueError(f"rope_scaling=ntk needs at least 4 rotated dims (base * factor^(r/(r-2))), got {rotated}")

    def rotated_dims(self, head_dim: int) -> int:
        return int(head_dim * self.fraction)

    def inv_freq(self, head_dim: int) -> torch.Tensor:
        """theta_i of the rotated pairs after scaling: (r/2,) fp64."""
        r = self.rotated_dims(head_dim)
        if self.scaling == "ntk":
            return rope_inv_freq(r, self.base * self.factor ** (r / (r - 2)))
        theta = rope_inv_freq(r, self.base)
        if self.scaling == "pi":
            return theta / self.factor
        if self.scaling == "yarn":
            keep = self._yarn_keep(r)                            # 1: extrapolate (keep), 0: interpolate
            return theta / self.factor * (1 - keep) + theta * keep
        return theta

    def _yarn_keep(self, r: int) -> torch.Tensor:
        """Per pair i, the weight of the unscaled theta_i: 1 below pair `low`, 0 above `high`, linear
        between, where a pair index is found from the turns it makes over the original context:
            pair(turns) = r * ln(L / (2 pi turns)) / (2 ln base)       (theta_i L = 2 pi turns)"""
        def pair_of(turns):
            return r * math.log(self.original_context / (2 * math.pi * turns)) / (2 * math.log(self.base))
        low = max(math.floor(pair_of(self.beta_fast)), 0)
        high = min(math.ceil(pair_of(self.beta_slow)), r - 1)
        high = high if high != low else high + 0.001             # a one-pair ramp: avoid 0/0
        ramp = ((torch.arange(r // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        return 1 - ramp

    def yarn_regime(self, head_dim: int) -> dict:
        """Where YaRN's bands fall for this model: the turns of its fastest and slowest pairs over the
        original context L against beta_fast and beta_slow, how many pairs lie above beta_fast (kept),
        between (ramped) and below beta_slow (interpolated) by those turns, and how many the ramp as
        computed (bounds rounded outward, so a fastest pair below beta_fast may still be kept) keeps,
        ramps and interpolates; pairs are ordered fastest first, so each band is a run of indices.
        regime: "three bands" (YaRN as designed), "partial interpolation" (no pair above beta_fast:
        every pair is interpolated in part, as at L = 64 with d = 32), "position interpolation" (every
        pair below beta_slow) or "no full interpolation" (no pair below beta_slow)."""
        r = self.rotated_dims(head_dim)
        turns, keep = rope_turns(r, self.base, self.original_context), self._yarn_keep(r)
        above, below = int((turns > self.beta_fast).sum()), int((turns < self.beta_slow).sum())
        if below == len(turns):
            regime = "position interpolation"
        elif above == 0:
            regime = "partial interpolation"
        elif below == 0:
            regime = "no full interpolation"
        else:
            regime = "three bands"
        return {"context": self.original_context, "rotated_dims": r, "beta_fast": self.beta_fast,
                "beta_slow": self.beta_slow, "turns_fastest": turns[0].item(), "turns_slowest": turns[-1].item(),
                "by_turns": {"above_beta_fast": above, "between": len(turns) - above - below, "below_beta_slow": below},
                "by_ramp": {"kept": int((keep == 1).sum()), "ramped": int(((keep > 0) & (keep < 1)).sum()),
                            "interpolated": int((keep == 0).sum())},
                "regime": regime}

    def attention_factor(self) -> float:
        if self.scaling != "yarn":
            return 1.0
        if self.attn_factor:
            return self.attn_factor
        return 0.1 * math.log(self.factor) + 1.0 if self.factor > 1 else 1.0

    def rotation(self, pos: torch.Tensor, head_dim: int) -> torch.Tensor:
        """cos + j sin of m * theta_i (times the attention factor) at positions pos (T,): (T, r/2) complex64.

        On CPU, eagerly, rows of a table of positions [0, L), one per (RoPE, head_dim, device), L a
        power of two past the largest position (up to ROPE_TABLE_MAX): a decoding step then pays one
        row lookup instead of the ~10 small ops that compute the angles, and the rows equal those
        angles bit for bit (the same fp64 products). The rows last looked up are kept with their
        positions tensor: the model hands the same one to every layer, and the layers after the first
        reuse them. On CUDA (sizing the table needs the largest position on the host: a sync in every
        layer) and while torch.compile traces (it fuses the angles) they are computed."""
        if pos.device.type != "cpu" or torch.compiler.is_compiling() or pos.numel() == 0:
            return rope_rotation(pos, self.inv_freq(head_dim), self.attention_factor())
        last = _LAST_ROTATION.get((self, head_dim))
        if last is not None and last[0] is pos and last[1] == pos._version:  # the layer before took these
            return last[2]
        lo, hi = (int(t) for t in torch.aminmax(pos))
        if not 0 <= lo <= hi < ROPE_TABLE_MAX:  # not positions a table holds
            return rope_rotation(pos, self.inv_freq(head_dim), self.attention_factor())
        rotation = _rotation_table(self, head_dim, pos.device, hi + 1).index_select(0, pos)
        _LAST_ROTATION[(self, head_dim)] = (pos, pos._version, rotation)
        return rotation

    def __call__(self, pos: torch.Tensor, *xs: torch.Tensor):
        """Rotate the first r dims of each (B, heads, T, d) tensor at positions pos (T,)."""
        d = xs[0].size(-1)
        if self.fraction == 1.0:  # every dim turns (the usual case; a decoding step's shortest path)
            rotation = self.rotation(pos, d)                                             # (T, d/2)
            return tuple(rotate_pairs(x, rotation) for x in xs)
        r = self.rotated_dims(d)                                   # < d: a fraction below 1 turns fewer dims
        if r == 0:
            return xs
        rotation = self.rotation(pos, d)                                                 # (T, r/2)
        # split, not slices: one cat in the backward instead of a zeroed copy of x per slice
        return tuple(torch.cat([rotate_pairs(a, rotation), b], dim=-1)
                     for a, b in (x.split([r, x.size(-1) - r], dim=-1) for x in xs))


# (RoPE, head_dim) -> (positions tensor, its version counter, rotation): RoPE.rotation's last lookup
_LAST_ROTATION = {}
# (RoPE, head_dim, device) -> RoPE.rotation at positions 0..L-1 (RoPE is frozen, so hashable)
_ROTATION_TABLES = {}


def _rotation_table(rope: RoPE, head_dim: int, device: torch.device, rows: int) -> torch.Tensor:
    """The rotation table of (rope, head_dim, device) with at least `rows` rows: made at ROPE_TABLE_MIN
    and remade at the next power of two when positions pass it (one table per key)."""
    key = (rope, head_dim, device)
    table = _ROTATION_TABLES.get(key)
    if table is None or table.size(0) < rows:
        length = max(ROPE_TABLE_MIN, 1 << (rows - 1).bit_length())
        table = rope_rotation(torch.arange(length, device=device), rope.inv_freq(head_dim), rope.attention_factor())
        _ROTATION_TABLES[key] = table
    return table


def alibi_slopes(n_head: int) -> torch.Tensor:
    """Head slopes of "Train Short, Test Long" (Press et al. 2022).

    For n a power of two: the geometric sequence 2^(-8/n), 2^(-16/n), ..., 2^(-8).
    Otherwise the paper's rule: the slopes of the closest power of two below n,
    then every other slope of the sequence for twice that power, until n heads.
    """
    def power_of_two_slopes(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_head).is_integer():
        slopes = power_of_two_slopes(n_head)
    else:
        closest = 2 ** math.floor(math.log2(n_head))
        slopes = power_of_two_slopes(closest) + power_of_two_slopes(2 * closest)[0::2][: n_head - closest]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(slopes: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """Additive score bias -m_h * (i - j): (H, Tq, Tk) fp32. Future keys get a positive
    bias here, but the causal mask removes them."""
    distance = (q_pos[:, None] - k_pos[None, :]).float()   # (Tq, Tk)
    return -slopes.to(q_pos.device)[:, None, None] * distance


def score_bias(alibi_slopes, forget, q_pos, k_pos):
    """The additive score bias: ALiBi's (H, Tq, Tk), plus FoX's c_q[i] - c_k[j] (B, H, Tq, Tk); None if neither."""
    bias = alibi_bias(alibi_slopes, q_pos, k_pos) if alibi_slopes is not None else None
    if forget is not None:
        c_q, c_k = forget
        gap = c_q[..., :, None] - c_k[..., None, :]
        bias = gap if bias is None else bias + gap
    return bias


def visible_keys(q_pos, k_pos, keep=None, window=None):
    """Which keys each query may see (bool, (Tq, Tk), or keep's shape): causal by position, within
    the window, and kept."""
    allowed = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        allowed = allowed & (k_pos[None, :] > q_pos[:, None] - window)
    if keep is not None:
        allowed = allowed & keep
    return allowed


def sinusoidal_encoding(pos: torch.Tensor, dim: int, base: float = 10000.0) -> torch.Tensor:
    """The fixed code of "Attention Is All You Need" (section 3.5): (T, dim) fp32 with
        PE[m, 2i] = sin(m * base^(-2i/dim)),  PE[m, 2i+1] = cos(m * base^(-2i/dim)).
    Each (sin, cos) pair is a point on a circle turning with m, so PE[m] . PE[n] is
    sum_i cos((m - n) * base^(-2i/dim)): it depends only on the offset m - n.
    Computed on the fly in fp64 (the same frequencies as RoPE), so any position works.
    An odd dim leaves the last column without its cos partner: it gets the sin only."""
    angles = pos.to(torch.float64)[:, None] * rope_inv_freq(dim, base).to(pos.device)[None, :]
    code = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)   # (T, 2 * ceil(dim/2))
    return code[:, :dim].float()
