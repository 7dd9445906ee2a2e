# GLA with a short convolution on q, k and v (gla_conv = 4 taps, fla's use_short_conv): the delta
# rule's convolution without the delta rule, to separate the two in the recall study (docs/linear.md).
include("gla.py")
gla_conv = 4
out_dir = "out-recall-gla_conv"
