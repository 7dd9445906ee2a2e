"""attn_kernels/norms.py's two ops against float64 PyTorch modules: F.normalize, and nn.RMSNorm times
silu of the gate, in outputs and in the gradients of every input (with and without autograd)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from attn_kernels.norms import l2_normalize, rms_norm_gated


def grads(out, inputs, w):
    return torch.autograd.grad((out * w).sum(), inputs)


def test_l2_normalize_equals_f_normalize_with_a_clamped_row():
    """Rows of every size, one of them all but zero (||x|| < eps: the clamp's constant-scale branch)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 8, 16, generator=g)
    x[1, 2, 3] = 1e-14
    x32, x64 = x.clone().requires_grad_(), x.double().requires_grad_()
    got, want = l2_normalize(x32), F.normalize(x64, dim=-1)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    w = torch.randn(want.shape, generator=g, dtype=torch.float64)
    g_got, = grads(got, [x32], w.float())
    g_want, = grads(want, [x64], w)
    torch.testing.assert_close(g_got.double(), g_want, rtol=1e-5, atol=1e-3)  # the clamped row's grads are 1/eps-sized
    with torch.no_grad():
        torch.testing.assert_close(l2_normalize(x).double(), want.detach(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("transposed", [False, True])
def test_rms_norm_gated_equals_rmsnorm_times_silu(transposed):
    """o as the layers pass it (a (B, H, T, D) tensor seen as (B, T, H, D)) or contiguous."""
    g = torch.Generator().manual_seed(1)
    B, T, H, D = 2, 7, 3, 16
    o = torch.randn(B, H, T, D, generator=g) if transposed else torch.randn(B, T, H, D, generator=g)
    r, weight = torch.randn(B, T, H, D, generator=g), 1 + 0.3 * torch.randn(D, generator=g)
    norm64 = nn.RMSNorm(D, eps=1e-5).double()
    with torch.no_grad():
        norm64.weight.copy_(weight)
    o32, r32, w32 = (t.clone().requires_grad_() for t in (o, r, weight))
    o64, r64 = o.double().requires_grad_(), r.double().requires_grad_()
    view = (lambda t: t.transpose(1, 2)) if transposed else (lambda t: t)
    got = rms_norm_gated(view(o32), w32, r32, 1e-5)
    want = norm64(view(o64)) * F.silu(r64)
    assert got.is_contiguous()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    w = torch.randn(want.shape, generator=g, dtype=torch.float64)
    for a, b in zip(grads(got, [o32, w32, r32], w.float()), grads(want, [o64, norm64.weight, r64], w)):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(rms_norm_gated(view(o), weight, r, 1e-5).double(), want.detach(), rtol=1e-5,
                                   atol=1e-5)
