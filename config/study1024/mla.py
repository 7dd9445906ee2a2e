# MLA in the GPU tier at a compressing rank: kv_lora_rank 128 + rope 32 = 160 cached elements per
# token per layer against MHA's 768 (fineweb30m.py says the scale and the command).
include("../mla.py")
include("fineweb30m.py")
kv_lora_rank = 128
