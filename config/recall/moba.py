# MoBA: blocks of 8; each query reads its own block and the 2 earlier blocks whose mean key scores highest.
include("../moba.py")
include("study.py")
out_dir = "out-recall-moba"
sparse_block = 8
moba_topk = 2
