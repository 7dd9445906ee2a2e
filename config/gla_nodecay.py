# GLA without its decay (gla_gate=none), everything else GLA's: elu + 1 features, RoPE, the per-head
# RMSNorm and the swish output gate. The decay's ablation, the fair study's gla_nodecay
# (config/study256/gla_nodecay.py, run as "linear" before the rename); the paper's linear attention is
# config/linear.py.
include("base_shakespeare_char.py")
out_dir = "out-gla-nodecay"
attention = "gla"
pos_encoding = "rope"     # without a decay, RoPE is its only sense of distance
gla_gate = "none"
gla_feature_map = "elu"
gla_chunk = 16
