# Zoology's MQAR model (base.py) around the recall study's retnet: RetNet: a fixed decay per head.
include("../recall/retnet.py")
include("base.py")
out_dir = "out-zoology-retnet"
attention = "conv,retnet"
pos_encoding = "none"
