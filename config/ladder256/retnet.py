# retnet at context 256 (config/retnet.py as it is).
include("../retnet.py")
include("ctx256.py")
