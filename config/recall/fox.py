# FoX: softmax over every key, its scores decayed by a data-dependent forget gate, 4 heads.
include("../fox.py")
include("study.py")
out_dir = "out-recall-fox"
