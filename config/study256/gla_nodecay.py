# gla_nodecay at context 256: GLA without its decay (config/gla_nodecay.py). The fair study ran it as "linear"
# (this file's old name); `linear` is Katharopoulos et al.'s attention (config/linear.py).
include("../gla_nodecay.py")
include("ctx256.py")
