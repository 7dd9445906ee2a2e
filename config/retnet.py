# RetNet-style retention (Sun et al. 2023): linear attention with a fixed decay per head,
# gamma_h = 1 - 2^(-5-h) (the multi-scale decays), no feature map, a per-head norm and a swish
# output gate as in the paper (its GroupNorm here RMSNorm, as GLA's). The rung between "never
# forgets" (config/linear.py) and a data-dependent decay (config/gla.py). attention/retnet.py.
include("base_shakespeare_char.py")
out_dir = "out-retnet"
attention = "retnet"
pos_encoding = "rope"     # RetNet's xPos rotation, here plain RoPE
gla_chunk = 32
