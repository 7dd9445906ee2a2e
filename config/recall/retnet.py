# RetNet: a fixed decay per head.
include("../retnet.py")
include("study.py")
out_dir = "out-recall-retnet"
