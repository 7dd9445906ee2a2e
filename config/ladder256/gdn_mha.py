# A hybrid: three Gated DeltaNet layers under one MHA layer (3:1), as recent production hybrids
# interleave them; the delta keys on its gated_deltanet layers. RoPE serves the mha layer (the
# delta layers take it too).
include("../gated_deltanet.py")
include("ctx256.py")
attention = "gated_deltanet,gated_deltanet,gated_deltanet,mha"
pos_encoding = "rope"
