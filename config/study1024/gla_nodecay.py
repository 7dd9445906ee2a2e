# gla_nodecay in the GPU tier: GLA without its decay (config/gla_nodecay.py); fineweb30m.py says the scale
# and the command.
include("../gla_nodecay.py")
include("fineweb30m.py")
