# bigbird at context 512: blocks of 32, window 2 + global 1 + random 1 = 128 keys (a fixed pattern
# with a sink and random reach).
include("../bigbird.py")
include("ctx512.py")
sparse_block = 32
