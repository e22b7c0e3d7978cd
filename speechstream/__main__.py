import sys

from speechstream.cli import main

sys.exit(main())
