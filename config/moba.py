# MoBA (attention/moba.py; Lu et al. 2025): blocks of 8 tokens; each query reads its own block and
# the 2 earlier blocks whose mean key scores highest against it: at most 24 of block_size=64 keys.
include("base_shakespeare_char.py")
out_dir = "out-moba"
attention = "moba"
pos_encoding = "rope"
sparse_block = 8
moba_topk = 2
