# Zoology's MQAR model (base.py) around the recall study's moba: MoBA: blocks of 8; each query reads
# its own block and the 2 earlier blocks whose mean key scores highest.
include("../recall/moba.py")
include("base.py")
out_dir = "out-zoology-moba"
attention = "conv,moba"
