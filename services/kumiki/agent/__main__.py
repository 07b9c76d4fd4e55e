"""`python -m kumiki.agent`: the node agent (see kumiki.agent.app)."""

import sys

from kumiki.agent.app import main

sys.exit(main())
