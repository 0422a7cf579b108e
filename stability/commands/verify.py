"""``stability verify``: run the theory checks and print one row per check; exit 1 if any fails.

Each row reads ``PASS|FAIL  name  measured <relation> tolerance  source: statement  [instance]``. ``--json PATH``
also writes every record (statement, instance, measured, tolerance, passed); ``--only`` picks checks by name;
``--wrong`` runs each check's deliberately wrong variant instead (every row should then FAIL: that is how one sees
the checks can fail); ``--seed`` draws other random instances.
"""

from __future__ import annotations

import sys
import time

from stability.atomic import check_writable, write_json
from stability.errors import ConfigError
from stability.extras import require

HELP = "check the paper's propositions numerically and symbolically: one row per check, non-zero exit if one fails"


def add_arguments(parser) -> None:
    parser.add_argument("--only", nargs="+", metavar="NAME", default=None,
                        help="run only these checks (see --list)")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the records as JSON")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random instances (default 0)")
    parser.add_argument("--wrong", action="store_true",
                        help="run the deliberately wrong variant of each check (each should FAIL)")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")


def run(args) -> int:
    # lazy: numpy; `stability --help` imports this module without it
    from stability.theory.checks import VERIFIERS, format_listing, format_row

    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")
    if args.list:
        for v in VERIFIERS.values():
            print(format_listing(v))
        return 0
    names = list(dict.fromkeys(args.only)) if args.only else list(VERIFIERS)
    unknown = [n for n in names if n not in VERIFIERS]
    if unknown:
        raise ConfigError(f"unknown check {', '.join(unknown)}; `stability verify --list` names them all")
    for module in dict.fromkeys(VERIFIERS[n].needs for n in names if VERIFIERS[n].needs):
        require(module, f"running the checks {', '.join(n for n in names if VERIFIERS[n].needs == module)}")
    json_path = check_writable(args.json, "file", "--json") if args.json else None
    start = time.perf_counter()
    checks = []
    for name in names:
        check = VERIFIERS[name].run(seed=args.seed, wrong=args.wrong)
        checks.append(check)
        print(format_row(check), flush=True)
    failed = [c.name for c in checks if not c.passed]
    elapsed = time.perf_counter() - start
    variant = "wrong variants" if args.wrong else "checks"
    print(f"{len(checks)} {variant}: {len(checks) - len(failed)} passed, {len(failed)} failed ({elapsed:.1f} s)")
    if json_path is not None:
        record = {"seed": args.seed, "variant": "wrong" if args.wrong else "paper", "passed": not failed,
                  "checks": [c.to_dict() for c in checks]}
        write_json(json_path, record, indent=2, ensure_ascii=False)
    return 1 if failed else 0
