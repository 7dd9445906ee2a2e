# Zoology's MQAR model (base.py) around the recall study's linear: Linear attention (Katharopoulos et
# al.): a state that only adds.
include("../recall/linear.py")
include("base.py")
out_dir = "out-zoology-linear"
attention = "conv,linear"
pos_encoding = "none"
