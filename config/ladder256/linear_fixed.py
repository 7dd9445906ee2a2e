# linear (Katharopoulos et al.: elu + 1, sum normaliser, no gate, no positions) with RetNet's fixed
# per-head decay: the rung that adds only the decay, between linear.py and retnet.py.
include("linear.py")
gla_gate = "fixed"
