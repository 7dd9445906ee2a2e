# Grouped-query attention: 4 query heads share 2 K/V heads (cache 2*n_kv_head*d_h per token per layer).
include("base_shakespeare_char.py")
out_dir = "out-gqa"
attention = "gqa"
n_kv_head = 2
pos_encoding = "rope"
