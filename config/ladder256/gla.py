# gla at context 256 (config/gla.py as it is).
include("../gla.py")
include("ctx256.py")
