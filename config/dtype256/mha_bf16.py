# The bf16 study (docs/speed.md): mha at the fair study's shape, learning rate 4e-3 (the fair study's
# choice for mha), trained in bfloat16 autocast (weights, optimizer and the linear family's state stay fp32).
include("../study256/mha.py")
learning_rate = 4e-3
dtype = "bfloat16"
