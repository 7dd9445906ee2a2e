# Control: MHA with the sigmoid output gate (Qiu et al. 2025) in the GPU tier.
include("../mha.py")
include("fineweb30m.py")
attn_output_gate = "sigmoid"
