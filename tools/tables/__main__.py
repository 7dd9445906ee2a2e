"""python -m tools.tables [--check]: see tools/tables/__init__.py."""
from tools.tables import main

main()
