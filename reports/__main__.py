import sys

from .cli import main

# `python -m reports merge …` is short for `python -m reports report merge …`.
args = sys.argv[1:]
sys.exit(main(["report", *args] if args and args[0] not in ("report", "run", "-h", "--help") else args))
