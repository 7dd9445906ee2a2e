# linear in the GPU tier (config/linear.py as it is; fineweb30m.py says the scale and the command).
include("../linear.py")
include("fineweb30m.py")
