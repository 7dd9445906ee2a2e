# Zoology's MQAR model (base.py) around the recall study's deltanet: DeltaNet: the delta rule
# overwrites what a key stored.
include("../recall/deltanet.py")
include("base.py")
out_dir = "out-zoology-deltanet"
attention = "conv,deltanet"
pos_encoding = "none"
