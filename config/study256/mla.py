# MLA at a compressing rank: kv_lora_rank 64 (half of n_embd; config/mla.py's default 4*d_h = 128
# equals n_embd and compresses nothing). Cache 64 + 16 = 80 elements per token per layer, MHA's 256.
include("../mla.py")
include("ctx256.py")
kv_lora_rank = 64
