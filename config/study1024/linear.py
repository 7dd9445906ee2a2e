# linear in the GPU tier (GLA without its decay, config/gla_nodecay.py; fineweb30m.py says the scale and the command).
include("../gla_nodecay.py")  # the study's "linear": GLA without its decay
include("fineweb30m.py")
