"""The short causal convolution that the delta rule (attention/deltanet.py) and, optionally, the linear
family (attention/linear_family.py, gla_conv) run on q, k and v: a few taps per channel over the last
tokens, then SiLU (flash-linear-attention's ShortConvolution). Its last K - 1 inputs are part of the
decoding cache (attention/cache.py ConvStateCache).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from attn_kernels.gla_chunked import in_dtype


def causal_conv(x, weight, past):
    """Depthwise causal convolution then SiLU. x (B, T, C), weight (C, K), past (B, K-1, C) the
    inputs before x (zeros at the start). Returns (B, T, C) and the last K-1 inputs (the next past).
    The taps' weighted sum of K shifted views in x's (B, T, C) layout, the sum a one-token decoding
    step takes too: on a CPU at the fair study's shape faster, forward and backward, than conv1d on a
    transposed (B, C, T) copy. Under autograd, ConvSilu runs it with its backward written out."""
    full = torch.cat([in_dtype(past, x.dtype), x], dim=1)                     # (B, K-1+T, C)
    K = weight.size(1)
    grad = torch.is_grad_enabled() and (full.requires_grad or weight.requires_grad)
    if x.size(1) == 1 and not grad:
        # a decoding step: its K inputs times the taps, one product and one sum (no per-tap ops)
        y = F.silu((full * in_dtype(weight.t(), x.dtype)).sum(dim=1, keepdim=True))
    else:
        # the taps from a contiguous (K, C) copy: the (C, K) weight's transposed view would make every
        # tap's broadcast strided (on a CPU twice the time of the sum)
        w = in_dtype(weight.t().contiguous(), x.dtype)                        # (K, C)
        y = ConvSilu.apply(full, w) if grad else F.silu(taps_sum(full, w))
    return y, full[:, full.size(1) - (K - 1):]


def taps_sum(full, w):
    """sum_j full[:, j:j+T] * w[j]: tap j reads token t-(K-1)+j. full (B, K-1+T, C), w (K, C)."""
    K = w.size(0)
    T = full.size(1) - (K - 1)
    y = full[:, :T] * w[0]
    for j in range(1, K):
        y = torch.addcmul(y, full[:, j:j + T], w[j])
    return y


class ConvSilu(torch.autograd.Function):
    """silu(taps_sum(full, w)) with its backward written out: autograd's would, for each tap, fill
    and copy a zero tensor of the whole input to return the gradient of one shifted view; here the
    taps accumulate in place into one buffer:

        dy = silu'(y) dout      dfull[:, j:j+T] += w[j] dy      dw[j] = sum_{b,t} full[:, j:j+T] dy"""

    @staticmethod
    def forward(ctx, full, w):
        y = taps_sum(full, w)
        ctx.save_for_backward(full, w, y)
        return F.silu(y)

    @staticmethod
    def backward(ctx, dout):
        full, w, y = ctx.saved_tensors
        K = w.size(0)
        T = full.size(1) - (K - 1)
        dy = torch.ops.aten.silu_backward(dout.contiguous(), y)              # (B, T, C)
        dfull = torch.zeros_like(full)
        dw = torch.empty_like(w)
        for j in range(K):  # (one product of all K windows at once, from a strided view: no faster in a layer)
            dfull[:, j:j + T].addcmul_(dy, w[j])
            dw[j] = (full[:, j:j + T] * dy).sum(dim=(0, 1))
        return dfull, dw


def conv_weight(channels, taps):
    """One filter of `taps` per channel, initialised as fla's ShortConvolution (nn.Conv1d's default)."""
    weight = nn.Parameter(torch.empty(channels, taps))
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    return weight
