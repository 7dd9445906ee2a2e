# Zoology's MQAR model (base.py) around the recall study's hybrid: a Gated DeltaNet layer under an MHA
# layer, after the conv layer (3 layers; no positions: gated_deltanet refuses learned ones).
include("../recall/gdn_mha.py")
include("base.py")
out_dir = "out-zoology-gdn_mha"
attention = "conv,gated_deltanet,mha"
n_layer = 3
pos_encoding = "none"
