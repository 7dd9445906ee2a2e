# MHA with ALiBi (Press et al.): no position embeddings, a -m_h*(i-j) bias on the scores.
include("base_shakespeare_char.py")
out_dir = "out-alibi"
attention = "mha"
pos_encoding = "alibi"
