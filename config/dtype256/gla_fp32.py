# The bf16 study (docs/speed.md): gla at the fair study's shape, learning rate 4e-3 (the fair study's
# choice for gla), trained in float32.
include("../study256/gla.py")
learning_rate = 4e-3
dtype = "float32"
