# BigBird in the GPU tier: blocks of 64 (16 blocks at 1024), window 2 + global 1 + random 1: at most
# 4 of 16 blocks per query, as in the CPU study (fineweb30m.py says the scale and the command).
include("../bigbird.py")
include("fineweb30m.py")
sparse_block = 64
