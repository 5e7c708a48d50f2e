"""``python -m ocibuild build|archive``: see docs/images.md."""

from ocibuild.cli import main

raise SystemExit(main())
