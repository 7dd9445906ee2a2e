"""Softmax attention under CPU bf16 autocast runs in fp32 (attention/base.py `sdpa`): the output and the
gradients of q, k, v equal float64 math on the same bf16 inputs to fp32 rounding, on each of attend's
SDPA paths (plain causal, GQA folded under a mask, ALiBi's float mask). Autocast's own choice, bf16
scores, would miss by about 1e-2."""
import math

import pytest
import torch

from attention.base import attend
from attention.positional import alibi_slopes


def reference(q, k, v, slopes, window):
    """float64 causal softmax attention by positions 0..T-1, a loop over heads (GQA: head h reads KV head h // G)."""
    q, k, v = (t.double() for t in (q, k, v))
    B, H, T, D = q.shape
    G = H // k.size(1)
    pos = torch.arange(T, dtype=torch.float64)
    dist = pos[:, None] - pos[None, :]                                   # query i minus key j
    seen = (dist >= 0) & (dist < (window or T))
    out = []
    for h in range(H):
        scores = q[:, h] @ k[:, h // G].transpose(-1, -2) / math.sqrt(D)  # (B, T, T)
        if slopes is not None:
            scores = scores - slopes[h].double() * dist
        out.append(torch.softmax(scores.masked_fill(~seen, float("-inf")), -1) @ v[:, h // G])
    return torch.stack(out, 1)


def inputs(case, dtype):
    gen = torch.Generator().manual_seed(0)
    H, Hkv = (4, 2) if case == "gqa_window" else (4, 4)
    q, k, v = (torch.randn(2, h, 24, 16, generator=gen).to(dtype).requires_grad_() for h in (H, Hkv, Hkv))
    do = torch.randn(2, H, 24, 16, generator=gen)
    return q, k, v, do, alibi_slopes(H) if case == "alibi" else None, 7 if case == "gqa_window" else None


def attend_under_autocast(q, k, v, slopes, window):
    pos = torch.arange(q.size(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return attend(q, k, v, pos, pos, alibi_slopes=slopes, window=window)


@pytest.mark.parametrize("case", ["causal", "gqa_window", "alibi"])
def test_attention_under_cpu_bf16_autocast_computes_in_fp32(case):
    """fp32 q, k, v: autocast must not round them to bf16 (which misses float64 by ~1e-2)."""
    q, k, v, do, slopes, window = inputs(case, torch.float32)
    out = attend_under_autocast(q, k, v, slopes, window)
    assert out.dtype == torch.float32
    grads = torch.autograd.grad(out, (q, k, v), do)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = reference(*leaves, slopes, window)
    want_grads = torch.autograd.grad(want, leaves, do.double())
    for got, ref in zip((out, *grads), (want, *want_grads)):
        assert (got.double() - ref).abs().max() <= 1e-5 * ref.abs().max()


@pytest.mark.parametrize("case", ["causal", "gqa_window", "alibi"])
def test_bf16_inputs_get_a_bf16_output_rounded_once(case):
    """What a layer under autocast hands attend (its projections' bf16 output): the result comes back in bf16,
    within one bf16 rounding of float64 math on the same inputs."""
    q, k, v, do, slopes, window = inputs(case, torch.bfloat16)
    out = attend_under_autocast(q, k, v, slopes, window)
    assert out.dtype == torch.bfloat16
    want = reference(q.detach(), k.detach(), v.detach(), slopes, window)
    assert (out.double() - want).abs().max() <= 2 ** -8 * want.abs().max()
