# gated_deltanet without its short convolution over time (delta_conv = 1: a per-channel scale and SiLU only):
# separates the convolution from the delta rule in the recall study (docs/recall.md).
include("gated_deltanet.py")
delta_conv = 1
out_dir = "out-recall-gated_deltanet_noconv"
