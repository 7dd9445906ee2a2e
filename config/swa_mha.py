# A local:global stack (Gemma 3's pattern, 5 sliding-window layers per global one; at 4 layers 3:1):
# three swa layers of a 32-token window under one mha layer that sees all of block_size=64.
# Decoding keeps 32 tokens of K/V in each swa layer and the whole context in the mha layer.
include("base_shakespeare_char.py")
out_dir = "out-swa-mha"
attention = "swa,swa,swa,mha"
pos_encoding = "rope"
sliding_window = 32
