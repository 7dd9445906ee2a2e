# BigBird-style causal block-sparse attention (attention/bigbird.py). With block_size=64 in
# blocks of 8 (8 blocks), each query block sees its own and the previous block (window 2),
# block 0 (global 1) and one random earlier block: at most 4 of 8 blocks (32 keys), 69% of
# the causal query-key pairs. (Blocks of 16 would give 4 blocks, and window 2 + global 1 +
# random 1 would then cover every earlier block: dense attention.)
include("base_shakespeare_char.py")
out_dir = "out-bigbird"
attention = "bigbird"
pos_encoding = "rope"
sparse_block = 8
sparse_window = 2
sparse_global = 1
sparse_random = 1
