# Multi-head attention: every query head has its own K/V head (cache 2*n_head*d_h per token per layer).
include("base_shakespeare_char.py")
out_dir = "out-mha"
attention = "mha"
pos_encoding = "rope"
