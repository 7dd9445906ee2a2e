# Zoology's MQAR model (base.py) around the recall study's mha4: Softmax over every key, 4 heads (the
# 1-head anchor is mha.py).
include("../recall/mha4.py")
include("base.py")
out_dir = "out-zoology-mha4"
attention = "conv,mha"
