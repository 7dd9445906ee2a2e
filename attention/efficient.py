"""Efficient Attention (Shen et al. 2021) in causal form: attention=efficient.

    rho_q(q_t) = softmax over q_t's features      rho_k = each key feature's exp over the keys seen so far
    o_t = rho_q(q_t) (S_t / Z_t),   S_t = sum_j exp(k_j)^T v_j,   Z_t = sum_j exp(k_j)

Linear attention that keeps softmax's row normalisation with two maps, no decay, stable by a running
max (attn_kernels/gla_chunked.py softmax_pair_inputs); no gate, no norm; no RoPE (the pair exponentiates
q and k): pos_encoding sinusoidal or none. The decoding state carries 3 more columns (log Z, max, decay).
The parts and the recurrence: attention/linear_family.py (this is its decay=none, feature_map=softmax,
norm=none, output_gate=none; attention=gla with those knobs builds the same layer).
"""
from attention.linear_family import LinearFamilyAttention, Recipe


class EfficientAttention(LinearFamilyAttention):
    recipe = Recipe(decay="none", feature_map="softmax", norm="none", output_gate="none")
