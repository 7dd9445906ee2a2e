# A hybrid: a Gated DeltaNet layer under an MHA layer (the 2-layer form of 3 gated_deltanet : 1 mha,
# the delta rule's ladder's last rung); RoPE serves the mha layer.
include("../gated_deltanet.py")
include("study.py")
out_dir = "out-recall-gdn_mha"
attention = "gated_deltanet,mha"
pos_encoding = "rope"
