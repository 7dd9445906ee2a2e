# linear (Katharopoulos et al.: elu + 1, sum normaliser, no gate, no positions) with RetNet's fixed
# per-head decay: the rung that adds only the decay, between linear.py and retnet.py. No paper names
# this combination, so it is attention=gla with its knobs (gla's parts are its own keys).
include("linear.py")
attention = "gla"
gla_gate = "fixed"
gla_feature_map = "elu"
gla_norm = "sum"
gla_output_gate = "none"
