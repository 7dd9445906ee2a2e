# GLA: a data-dependent decay.
include("../gla.py")
include("study.py")
out_dir = "out-recall-gla"
