"""RoPE and ALiBi against the papers' definitions."""
import math

import torch

from attention.positional import alibi_bias, alibi_slopes, apply_rope, rope_cos_sin, rope_inv_freq


def rope_by_hand(x, m, base):
    """RoFormer eq. 34 written out: each pair (x[2i], x[2i+1]) times a 2x2 rotation by m*theta_i."""
    out = x.clone()
    d = x.numel()
    for i in range(d // 2):
        theta = m * base ** (-2 * i / d)
        c, s = math.cos(theta), math.sin(theta)
        out[2 * i] = c * x[2 * i] - s * x[2 * i + 1]
        out[2 * i + 1] = s * x[2 * i] + c * x[2 * i + 1]
    return out


def test_rope_matches_rotation_matrices():
    torch.manual_seed(0)
    x = torch.randn(1, 1, 5, 16, dtype=torch.float64)
    pos = torch.tensor([0, 1, 7, 100, 4095])
    cos, sin = rope_cos_sin(pos, rope_inv_freq(16, 10000.0))
    got = apply_rope(x.float(), cos, sin)
    for t, m in enumerate(pos.tolist()):
        want = rope_by_hand(x[0, 0, t], m, 10000.0).float()
        assert torch.allclose(got[0, 0, t], want, atol=1e-5)


def test_rope_score_depends_only_on_offset():
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 32), torch.randn(1, 1, 1, 32)

    def score(m, n):
        cq, sq = rope_cos_sin(torch.tensor([m]), rope_inv_freq(32, 500.0))
        ck, sk = rope_cos_sin(torch.tensor([n]), rope_inv_freq(32, 500.0))
        return (apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum().item()

    for offset in (0, 1, 5, 37):
        ref = score(offset, 0)
        for shift in (3, 100, 1000):
            assert abs(score(offset + shift, shift) - ref) < 1e-4
    assert abs(score(5, 0) - score(6, 0)) > 1e-3  # and it does depend on the offset


def test_alibi_slopes_power_of_two():
    want = [1 / 2 ** i for i in range(1, 9)]   # the paper: 1/2, 1/4, ..., 1/256 for 8 heads
    assert torch.allclose(alibi_slopes(8), torch.tensor(want))


def test_alibi_slopes_non_power_of_two():
    # 6 heads: the 4-head slopes (1/4, 1/16, 1/64, 1/256), then every other of the
    # 8-head sequence (1/2, 1/8, ...) until 6 heads.
    want = [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]
    assert torch.allclose(alibi_slopes(6), torch.tensor(want))
    assert alibi_slopes(12).shape == (12,)


def test_alibi_bias_is_linear_in_distance():
    slopes = torch.tensor([0.5, 0.25])
    bias = alibi_bias(slopes, torch.tensor([3, 4]), torch.tensor([0, 1, 2, 3, 4]))
    assert bias[0, 0].tolist() == [-1.5, -1.0, -0.5, 0.0, 0.5]
    assert bias[1, 1].tolist() == [-1.0, -0.75, -0.5, -0.25, 0.0]


def test_rope_table_rows_equal_the_computed_angles():
    """RoPE.rotation on CPU reads rows of a table (grown past 1024 positions, none past ROPE_TABLE_MAX,
    none for negative positions): bit for bit the angles computed on the fly, also with scaling."""
    from attention.positional import ROPE_TABLE_MAX, RoPE, rope_rotation
    for rope in (RoPE(), RoPE(500.0, "yarn", 4.0, 64)):
        for pos in ([0, 1, 2], [1023], [1024], list(range(3000, 3010)), [9, 2, 5], [-3, 2], [ROPE_TABLE_MAX + 7]):
            pos = torch.tensor(pos)
            want = rope_rotation(pos, rope.inv_freq(16), rope.attention_factor())
            assert torch.equal(rope.rotation(pos, 16), want)
            assert torch.equal(rope.rotation(pos, 16), want)  # the rows kept for the next layer
