# Zoology's MQAR model (base.py) around the recall study's mha: Softmax attention keeps every key: the
# recall study's anchor.
include("../recall/mha.py")
include("base.py")
out_dir = "out-zoology-mha"
attention = "conv,mha"
