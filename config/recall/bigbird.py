# BigBird: blocks of 8; each query block sees its own and the previous block, the first block, one random block.
include("../bigbird.py")
include("study.py")
out_dir = "out-recall-bigbird"
sparse_block = 8
sparse_window = 2
sparse_global = 1
sparse_random = 1
