# Zoology's MQAR model (base.py) around the recall study's bigbird: BigBird: blocks of 8; each query
# block sees its own and the previous block, the first block, one random block.
include("../recall/bigbird.py")
include("base.py")
out_dir = "out-zoology-bigbird"
attention = "conv,bigbird"
