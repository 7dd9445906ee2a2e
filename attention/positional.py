"""Positional encodings: RoPE and ALiBi (used by every attention variant) and the
sinusoidal absolute code (added to the token embeddings by model.py).

All work on absolute positions (a LongTensor of the tokens' indices in the
sequence), so a decoder with a cache just passes the positions of the new tokens.
"""
import math

import torch


def rope_inv_freq(dim: int, base: float) -> torch.Tensor:
    """theta_i = base^(-2i/dim) for i in [0, dim/2) (RoFormer, eq. 15)."""
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def rope_cos_sin(pos: torch.Tensor, dim: int, base: float):
    """cos/sin of m*theta_i for each position m: two (T, dim/2) fp32 tensors.

    Computed on the fly in fp64 (so large positions keep their precision) rather
    than read from a table, so decoding may run past any training length.
    """
    angles = pos.to(torch.float64)[:, None] * rope_inv_freq(dim, base).to(pos.device)[None, :]
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x[2i], x[2i+1]) of the last dim by the angle m*theta_i.

    x: (B, H, T, D) with D even; cos, sin: (T, D/2). Returns x's dtype.
    A pair is a complex number x[2i] + j*x[2i+1]; rotating it is one complex product,
    which is much cheaper on CPU than the four real products written out.
    """
    pairs = x.float().unflatten(-1, (-1, 2))                  # (B, H, T, D/2, 2)
    if pairs.stride(-2) != 2 or any(st % 2 for st in pairs.stride()[:-2]):
        pairs = pairs.contiguous()                            # view_as_complex needs even strides
    rotated = torch.view_as_complex(pairs) * torch.complex(cos, sin)
    return torch.view_as_real(rotated).flatten(-2).type_as(x)


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
