# mqa at context 256 (config/mqa.py as it is).
include("../mqa.py")
include("ctx256.py")
