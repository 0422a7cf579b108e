from stability.cli import main

raise SystemExit(main())
