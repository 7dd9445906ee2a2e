# Zoology's MQAR model (base.py) around the recall study's swa: a window of 8 tokens, so a query
# farther than 8 (plus the conv's 2) from its pair cannot reach it.
include("../recall/swa.py")
include("base.py")
out_dir = "out-zoology-swa"
attention = "conv,swa"
pos_encoding = "none"
