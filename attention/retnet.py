"""RetNet's retention (Sun et al. 2023): attention=retnet.

    S_t = gamma_h S_{t-1} + k_t^T v_t,   gamma_h = 1 - 2^(-5-h) per KV head (the multi-scale decays)
    y = c_proj( RMSNorm_per_head(q_t S_t) * silu(x W_r) )

A fixed decay per head, no feature map, a per-head norm (the paper's GroupNorm, here RMSNorm as
GLA's) and the swish output gate. The paper's xPos rotation is plain RoPE here (pos_encoding=rope).
The parts and the recurrence: attention/linear_family.py (this is its decay=fixed,
feature_map=identity, norm=rms, output_gate=swish; attention=gla with those knobs builds the same layer).
"""
from attention.linear_family import LinearFamilyAttention, Recipe


class MultiScaleRetention(LinearFamilyAttention):
    recipe = Recipe(decay="fixed", feature_map="identity", norm="rms", output_gate="swish")
