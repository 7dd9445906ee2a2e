"""Two small ops of the delta rule's and the linear family's layers, with their backward written out:

    l2_normalize(x)                    x / max(||x||, eps) over the last dim    (F.normalize's math)
    rms_norm_gated(o, weight, r, eps)  RMSNorm(o) * weight * silu(r)            (fla's FusedRMSNormGated)

On a CPU at the fair study's shape a delta-rule layer is many small elementwise ops beside its
matmuls, and autograd's replay of F.normalize and of nn.RMSNorm times silu takes about 30 of them
forward and backward, several on whole-size temporaries; written out they take about a third.
Without autograd (decoding) each is its plain forward. Both compute in the input's dtype, as the
modules they replace do; tests/test_norms.py holds them to float64 F.normalize and nn.RMSNorm.
"""
import torch
import torch.nn.functional as F


def l2_normalize(x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """F.normalize(x, dim=-1, eps=eps)."""
    if torch.is_grad_enabled() and x.requires_grad:
        return L2Normalize.apply(x, eps)
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min_(eps)   # F.normalize's own formula


def l2_forward(x, eps):
    """(y, r, ||x||): y = x r with r = 1 / max(||x||, eps) per row."""
    norm = x.norm(dim=-1, keepdim=True)                                       # [..., 1]
    r = norm.clamp_min(eps).reciprocal()
    return x * r, r, norm


class L2Normalize(torch.autograd.Function):
    """y = x r with r = 1 / max(||x||, eps) per row; where ||x|| > eps, dx = r (dy - y <dy, y>), else
    (r a constant) dx = r dy."""

    @staticmethod
    def forward(ctx, x, eps):
        y, r, norm = l2_forward(x, eps)
        ctx.save_for_backward(y, r, norm > eps)
        return y

    @staticmethod
    def backward(ctx, dy):
        y, r, unclamped = ctx.saved_tensors
        along = (dy * y).sum(dim=-1, keepdim=True) * unclamped                # <dy, y>, 0 where clamped
        return (dy - y * along) * r, None


def rms_norm_gated(o: torch.Tensor, weight: torch.Tensor, r: torch.Tensor, eps: float) -> torch.Tensor:
    """nn.RMSNorm(D, eps)(o) (its weight) * silu(r), o and r (..., D) of one shape (o may be a transposed
    view); the output is laid out as r is (contiguous when r is)."""
    if torch.is_grad_enabled() and (o.requires_grad or weight.requires_grad or r.requires_grad):
        return RMSNormGated.apply(o, weight, r, eps)
    return rms_gated_forward(o, weight, r, eps)[0]


def rms_gated_forward(o, weight, r, eps):
    """(y, n, rstd): n = o rstd with rstd = 1 / sqrt(mean(o^2) + eps) per row, y = silu(r) (n weight)."""
    rstd = (o * o).mean(dim=-1, keepdim=True).add_(eps).rsqrt_()              # [..., 1]; in place: a decoding
    # step's cost is its op count, and a Python scalar's out-of-place add costs a wrapped tensor
    n = o * rstd
    return F.silu(r) * (n * weight), n, rstd


class RMSNormGated(torch.autograd.Function):
    """y = n w s with n = o rstd (rstd = 1 / sqrt(mean(o^2) + eps)), s = silu(r):

        dr = silu'(r) (dy n w)      dw = sum over rows of dy s n
        dn = dy s w                 do = rstd (dn - n mean(dn n))"""

    @staticmethod
    def forward(ctx, o, weight, r, eps):
        y, n, rstd = rms_gated_forward(o, weight, r, eps)
        ctx.save_for_backward(n, rstd, weight, r)
        return y

    @staticmethod
    def backward(ctx, dy):
        n, rstd, weight, r = ctx.saved_tensors
        dr = torch.ops.aten.silu_backward((dy * (n * weight)).to(r.dtype), r)
        dn_w = dy * F.silu(r)                                                  # dL/d(n w)
        dweight = (dn_w * n).reshape(-1, n.size(-1)).sum(0)
        dn = dn_w * weight
        do = (dn - n * (dn * n).mean(dim=-1, keepdim=True)) * rstd
        return do, dweight.to(weight.dtype), dr, None
