# Gated DeltaNet (Yang et al., ICLR 2025): the delta rule with Mamba-2's per-head decay, the layer
# recent production hybrids use for their linear layers (attention/deltanet.py).
include("base_shakespeare_char.py")
out_dir = "out-gated_deltanet"
attention = "gated_deltanet"
pos_encoding = "none"
delta_conv = 4
delta_chunk = 16
