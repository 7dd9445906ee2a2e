# gla without its output gate and norm: the decay alone on linear attention.
include("../gla.py")
include("ctx256.py")
gla_output_gate = "none"
gla_norm = "none"
