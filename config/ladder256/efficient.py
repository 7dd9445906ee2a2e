# efficient at context 256 (config/efficient.py as it is).
include("../efficient.py")
include("ctx256.py")
