# Efficient Attention (Shen et al. 2021) in causal form: rho_q = softmax over each query's features,
# rho_k = each key feature's exp normalised over the keys seen so far, o_t = rho_q(q_t) (S_t / Z_t):
# linear attention that keeps softmax's row normalisation with two maps, no decay, stable by a running
# max (attn_kernels/gla_chunked.py softmax_pair_inputs). No gate, no norm; no RoPE (the pair exponentiates
# q, k). attention/efficient.py.
include("base_shakespeare_char.py")
out_dir = "out-efficient"
attention = "efficient"
pos_encoding = "none"
gla_chunk = 16
