# fox at context 256 (config/fox.py as it is: no positions, the forget gate alone orders the tokens).
include("../fox.py")
include("ctx256.py")
