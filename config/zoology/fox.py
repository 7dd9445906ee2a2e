# Zoology's MQAR model (base.py) around the recall study's fox: learned positions as mha4's, so that
# the two differ in the forget gate alone.
include("../recall/fox.py")
include("base.py")
out_dir = "out-zoology-fox"
attention = "conv,fox"
