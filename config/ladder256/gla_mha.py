# A hybrid: three GLA layers under one MHA layer (3:1), GLA's keys on its layers.
include("../gla.py")
include("ctx256.py")
attention = "gla,gla,gla,mha"
