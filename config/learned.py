# MHA with learned absolute position embeddings (GPT-2 / nanoGPT's wpe).
include("base_shakespeare_char.py")
out_dir = "out-learned"
attention = "mha"
pos_encoding = "learned"
