# MHA with rotary position embeddings (RoFormer): q and k rotated by m*theta_i.
include("base_shakespeare_char.py")
out_dir = "out-rope"
attention = "mha"
pos_encoding = "rope"
