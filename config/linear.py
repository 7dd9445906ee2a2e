# Plain causal linear attention (Katharopoulos et al. 2020): softmax(QK^T)V replaced by
# phi(Q)(phi(K)^T V) with phi = elu + 1 and no decay, so the state never forgets. It is
# GLA's layer with gla_gate=none (same RMSNorm and output gate): the decay's ablation.
include("base_shakespeare_char.py")
out_dir = "out-linear"
attention = "gla"
pos_encoding = "rope"     # without a decay, RoPE is its only sense of distance
gla_gate = "none"
gla_feature_map = "elu"
gla_chunk = 16
