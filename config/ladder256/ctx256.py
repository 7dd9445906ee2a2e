# The ladder study's scale (issue 23): the fair study's (config/study256/ctx256.py), context 256, batch 3.
include("../study256/ctx256.py")
