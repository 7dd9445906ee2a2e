# mqa in the GPU tier (config/mqa.py as it is; fineweb30m.py says the scale and the command).
include("../mqa.py")
include("fineweb30m.py")
