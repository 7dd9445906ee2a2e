# mha in the GPU tier (config/mha.py as it is; fineweb30m.py says the scale and the command).
include("../mha.py")
include("fineweb30m.py")
