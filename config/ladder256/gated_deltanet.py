# gated_deltanet at context 256 (config/gated_deltanet.py as it is).
include("../gated_deltanet.py")
include("ctx256.py")
