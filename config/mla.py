# Multi-head Latent Attention (DeepSeek-V2): keys/values from a latent c_kv plus one shared RoPE key;
# decoding caches only kv_lora_rank + rope_head_dim per token per layer (defaults 4*d_h + d_h/2 = 144
# here, against MHA's 2*n_head*d_h = 256). Knobs: q_lora_rank, kv_lora_rank, rope_head_dim, mla_decode.
include("base_shakespeare_char.py")
out_dir = "out-mla"
attention = "mla"
pos_encoding = "rope"
