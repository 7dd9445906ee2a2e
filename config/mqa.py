# Multi-query attention: all query heads share one K/V head (cache 2*d_h per token per layer).
include("base_shakespeare_char.py")
out_dir = "out-mqa"
attention = "mqa"
pos_encoding = "rope"
