# MLA: keys and values from a latent of 4 x head dim (64 at width 64: 72 cached per token and layer against MHA's 128).
include("../mla.py")
include("study.py")
out_dir = "out-recall-mla"
