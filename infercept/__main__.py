import sys

from infercept.cli import main

sys.exit(main())
