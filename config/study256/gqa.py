# gqa at context 256 (config/gqa.py as it is).
include("../gqa.py")
include("ctx256.py")
