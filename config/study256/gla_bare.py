# Control: GLA without its extras (no swish output gate, no per-head RMSNorm): decay + linear
# attention alone, against gla.py with both.
include("../gla.py")
include("ctx256.py")
gla_output_gate = "none"
gla_norm = "none"
