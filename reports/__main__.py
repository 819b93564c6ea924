import sys

from .cli import main

sys.exit(main(["report", *sys.argv[1:]]) if sys.argv[1:2] and sys.argv[1] != "report" else main())
