# Zoology's MQAR model (base.py) around the recall study's mla: MLA: keys and values from a latent of
# 4 x head dim (64 at width 64: 72 cached per token and layer against MHA's 128).
include("../recall/mla.py")
include("base.py")
out_dir = "out-zoology-mla"
attention = "conv,mla"
