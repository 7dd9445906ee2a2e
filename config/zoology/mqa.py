# Zoology's MQAR model (base.py) around the recall study's mqa: Multi-query attention: 1 KV head (a
# quarter of MHA's cache).
include("../recall/mqa.py")
include("base.py")
out_dir = "out-zoology-mqa"
attention = "conv,mqa"
