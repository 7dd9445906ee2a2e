# deltanet without its short convolution over time (delta_conv = 1: a per-channel scale and SiLU only):
# separates the convolution from the delta rule in the recall study (docs/recall.md).
include("deltanet.py")
delta_conv = 1
out_dir = "out-recall-deltanet_noconv"
