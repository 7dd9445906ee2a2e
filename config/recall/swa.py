# Sliding window of 8 tokens: 2 layers see 15 back, so queries far from their pair cannot reach it.
include("../swa.py")
include("study.py")
out_dir = "out-recall-swa"
sliding_window = 8
