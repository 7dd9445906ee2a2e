# mha at context 256 (config/mha.py as it is).
include("../mha.py")
include("ctx256.py")
