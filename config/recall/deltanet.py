# DeltaNet: the delta rule overwrites what a key stored.
include("../deltanet.py")
include("study.py")
out_dir = "out-recall-deltanet"
