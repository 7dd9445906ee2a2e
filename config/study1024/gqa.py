# GQA in the GPU tier: 6 query heads share 2 K/V heads (fineweb30m.py says the scale and the command).
include("../gqa.py")
include("fineweb30m.py")
n_kv_head = 2
