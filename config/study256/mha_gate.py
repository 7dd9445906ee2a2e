# Control: MHA with a sigmoid output gate (Qiu et al. 2025, their G1: y_h * sigmoid(x W_g)_h before
# c_proj), the softmax analogue of GLA's swish gate. Does a gate alone explain GLA's lead?
include("../mha.py")
include("ctx256.py")
attn_output_gate = "sigmoid"
