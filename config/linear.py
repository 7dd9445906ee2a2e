# Linear attention as Katharopoulos et al. 2020 write it ("Transformers are RNNs"): phi = elu + 1,
# o_t = phi(q_t) S_t / (phi(q_t) . z_t) with S_t = sum_j phi(k_j)^T v_j and z_t = sum_j phi(k_j):
# no decay (the state never forgets), the sum normaliser, no output gate, no RMSNorm, no positions
# (the normaliser needs phi(q) . phi(k) >= 0, which RoPE's rotation breaks). attention/linear.py.
include("base_shakespeare_char.py")
out_dir = "out-linear"
attention = "linear"
pos_encoding = "none"
gla_chunk = 16
