import sys

from kumiki.cli.main import main

sys.exit(main())
