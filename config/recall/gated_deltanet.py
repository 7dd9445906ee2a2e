# Gated DeltaNet: the delta rule with a per-head decay.
include("../gated_deltanet.py")
include("study.py")
out_dir = "out-recall-gated_deltanet"
