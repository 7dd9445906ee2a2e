# NSA: blocks of 8, 4 of them read per query (the first, its own and the previous one among them, one
# picked by the compressed scores) besides the compressed keys and a window of 8.
include("../nsa.py")
include("study.py")
out_dir = "out-recall-nsa"
sparse_block = 8
nsa_topk = 4
sliding_window = 8
