# DeltaNet (Schlag et al. 2021; Yang et al. 2024): a fixed state written by the delta rule, which
# overwrites what a key stored before (attention/deltanet.py). No positions, as in the papers: the
# short convolution tells near from far.
include("base_shakespeare_char.py")
out_dir = "out-deltanet"
attention = "deltanet"
pos_encoding = "none"
delta_conv = 4
delta_chunk = 16
