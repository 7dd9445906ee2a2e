# Zoology's MQAR model (base.py) around the recall study's nsa: blocks of 8, 4 read per query, a window
# of 8, learned positions as mha4's.
include("../recall/nsa.py")
include("base.py")
out_dir = "out-zoology-nsa"
attention = "conv,nsa"
