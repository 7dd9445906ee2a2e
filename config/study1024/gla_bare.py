# Control: GLA without its output gate and norm in the GPU tier.
include("gla.py")
gla_output_gate = "none"
gla_norm = "none"
