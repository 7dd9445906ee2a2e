# Zoology's MQAR model (base.py) around the recall study's gqa: Grouped-query attention: 2 KV heads
# for 4 query heads (half MHA's cache).
include("../recall/gqa.py")
include("base.py")
out_dir = "out-zoology-gqa"
attention = "conv,gqa"
