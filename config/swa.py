# Sliding-window attention (attention/swa.py; Mistral 7B's layers): each query sees its last 32
# tokens, half of block_size=64, and decoding keeps at most 32 tokens of K/V per layer.
include("base_shakespeare_char.py")
out_dir = "out-swa"
attention = "swa"
pos_encoding = "rope"
sliding_window = 32
