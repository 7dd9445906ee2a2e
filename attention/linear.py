"""Linear attention as Katharopoulos et al. 2020 write it ("Transformers are RNNs"): attention=linear.

    phi = elu + 1          S_t = sum_j phi(k_j)^T v_j          z_t = sum_j phi(k_j)
    o_t = phi(q_t) S_t / (phi(q_t) . z_t)

No decay (the state never forgets), the sum normaliser, no output gate, no RMSNorm. The normaliser
needs phi(q) . phi(k) >= 0, which RoPE's rotation breaks: pos_encoding sinusoidal or none.
The parts and the recurrence: attention/linear_family.py (this is its decay=none, feature_map=elu,
norm=sum, output_gate=none; attention=gla with those knobs builds the same layer).
"""
from attention.linear_family import LinearFamilyAttention, Recipe


class LinearAttention(LinearFamilyAttention):
    recipe = Recipe(decay="none", feature_map="elu", norm="sum", output_gate="none")
