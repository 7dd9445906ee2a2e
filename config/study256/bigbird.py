# BigBird at context 256 in blocks of 16 (16 blocks): window 2 + global 1 + random 1 = at most 4
# blocks (64 keys) per query, 39% of the causal query-key pairs (at context 64 it was 69%).
include("../bigbird.py")
include("ctx256.py")
sparse_block = 16
