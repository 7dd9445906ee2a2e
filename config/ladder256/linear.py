# linear at context 256 (config/linear.py as it is).
include("../linear.py")
include("ctx256.py")
