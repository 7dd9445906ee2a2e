"""The short causal convolution that the delta rule (attention/deltanet.py) and, optionally, the linear
family (attention/linear_family.py, gla_conv) run on q, k and v: a few taps per channel over the last
tokens, then SiLU (flash-linear-attention's ShortConvolution). Its last K - 1 inputs are part of the
decoding cache (attention/cache.py ConvStateCache).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels.gla_chunked import in_dtype


def causal_conv(x, weight, past):
    """Depthwise causal convolution then SiLU. x (B, T, C), weight (C, K), past (B, K-1, C) the
    inputs before x (zeros at the start). Returns (B, T, C) and the last K-1 inputs (the next past).
    The taps' weighted sum of K shifted views in x's (B, T, C) layout, the sum a one-token decoding
    step takes too: on a CPU at the fair study's shape 1.4x faster, forward and backward, than
    conv1d on a transposed (B, C, T) copy."""
    K, T = weight.size(1), x.size(1)
    full = torch.cat([in_dtype(past, x.dtype), x], dim=1)                     # (B, K-1+T, C)
    w = in_dtype(weight.t(), x.dtype)                                         # (K, C)
    y = full[:, :T] * w[0]
    for j in range(1, K):
        y = torch.addcmul(y, full[:, j:j + T], w[j])                          # tap j reads token t-(K-1)+j
    return F.silu(y), full[:, full.size(1) - (K - 1):]


def conv_weight(channels, taps):
    """One filter of `taps` per channel, initialised as fla's ShortConvolution (nn.Conv1d's default)."""
    weight = nn.Parameter(torch.empty(channels, taps))
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    return weight
