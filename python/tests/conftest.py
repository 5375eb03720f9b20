import sys
from pathlib import Path

# The helpers next to the tests (stablehlo_check) import by name.
sys.path.insert(0, str(Path(__file__).resolve().parent))
