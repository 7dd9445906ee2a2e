# Native Sparse Attention (attention/nsa.py; Yuan et al. 2025): per query, softmax over the mean keys of
# complete blocks of 8, over the 4 blocks those scores rank highest (the first, its own and the previous
# one always among them) and over a window of the last 16 keys, mixed by learned gates: at most
# 8 + 32 + 16 of block_size=64 keys.
include("base_shakespeare_char.py")
out_dir = "out-nsa"
attention = "nsa"
pos_encoding = "rope"
sparse_block = 8
nsa_topk = 4
sliding_window = 16
