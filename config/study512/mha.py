# mha at context 512: every query reads all earlier keys (up to 512).
include("../mha.py")
include("ctx512.py")
