from __future__ import annotations

from snoozeml.cli.main import main

raise SystemExit(main())
