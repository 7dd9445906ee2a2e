# deltanet at context 256 (config/deltanet.py as it is: no positions, a conv of 4, chunks of 16).
include("../deltanet.py")
include("ctx256.py")
