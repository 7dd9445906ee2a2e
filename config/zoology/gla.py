# Zoology's MQAR model (base.py) around the recall study's gla: GLA: a data-dependent decay.
include("../recall/gla.py")
include("base.py")
out_dir = "out-zoology-gla"
attention = "conv,gla"
pos_encoding = "none"
