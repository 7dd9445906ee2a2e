# Linear attention (Katharopoulos et al.): a state that only adds.
include("../linear.py")
include("study.py")
out_dir = "out-recall-linear"
