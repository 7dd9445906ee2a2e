# linear at context 256: GLA without its decay (config/gla_nodecay.py; the paper's form is config/linear.py).
include("../gla_nodecay.py")  # the study's "linear": GLA without its decay
include("ctx256.py")
