# GLA in the GPU tier, chunks of 64 (fineweb30m.py says the scale and the command).
include("../gla.py")
include("fineweb30m.py")
gla_chunk = 64
