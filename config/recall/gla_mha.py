# A hybrid: a GLA layer under an MHA layer (the 2-layer form of 3 gla : 1 mha).
include("../gla.py")
include("study.py")
out_dir = "out-recall-gla_mha"
attention = "gla,mha"
