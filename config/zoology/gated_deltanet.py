# Zoology's MQAR model (base.py) around the recall study's gated_deltanet: Gated DeltaNet: the delta
# rule with a per-head decay.
include("../recall/gated_deltanet.py")
include("base.py")
out_dir = "out-zoology-gated_deltanet"
attention = "conv,gated_deltanet"
pos_encoding = "none"
