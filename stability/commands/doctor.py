"""``stability doctor``: what computes this machine's numbers, and (``--kernels``) which CPU kernels give other
bits here than on the reference machines (stability/fingerprint.py)."""

from __future__ import annotations

import argparse
import os

from stability import atomic, hardware
from stability.errors import StabilityError

HELP = ("what computes this machine's numbers (versions, CPU, kernel set); --kernels: which CPU kernels give other "
        "bits here than on the reference machines")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kernels", action="store_true",
                   help="fingerprint ~100 kernels (pinned, in a fresh process) and compare with the shipped "
                        "references and --against files")
    p.add_argument("--unpinned", action="store_true", help="with --kernels: fingerprint the unpinned paths")
    p.add_argument("--against", metavar="FILE", action="append", default=[],
                   help="with --kernels: also compare with this fingerprint file (another machine's --out)")
    p.add_argument("--out", metavar="FILE", help="with --kernels: write this machine's fingerprint file")


def _check(args) -> None:
    if not args.kernels and (args.unpinned or args.against or args.out):
        raise StabilityError("--unpinned, --against and --out go with --kernels")
    for path in args.against:
        if not os.path.isfile(path):
            raise StabilityError(f"--against {path}: no such file")
    if args.out:
        atomic.check_writable(args.out, "file", "--out")


def _signature() -> None:
    sig = hardware.signature()
    print(f"cpu: {sig['cpu']} ({', '.join(sig['cpu_flags'])}); ATen capability {sig['cpu_capability']}")
    print(f"torch {sig['torch']} (BLAS {sig['blas']}, MKL {sig['mkl']}), numpy {sig['numpy']}, scipy {sig['scipy']}")
    print(f"kernel set: {sig['kernels']} ({hardware.KERNEL_SETS[sig['kernels']]})")
    print(f"reproducible mode here: {'on' if sig['reproducible'] else 'off'}")


def _kernels(args) -> int:
    # lazy: torch; `stability --help` imports this module without it
    from stability import atomic, fingerprint

    header, rows = fingerprint.measure()
    print(header)
    refs = fingerprint.references()
    refs.update({path: fingerprint.read(path) for path in args.against})
    for name, (ref_header, ref) in refs.items():
        diff = fingerprint.differing(rows, ref)
        shared = sum(r.name in ref for r in rows)
        print(f"against {name} ({ref_header.lstrip('# ')}): {len(diff)} of {shared} kernels differ")
        for n in diff:
            why = fingerprint.routed(n)
            print(f"  differs: {n}" + (f" -> {why}" if why else " -> not known to differ: a kernel this CPU "
                                                                    "computes its own way"))
    for r in rows:
        if r.ieee is not None:
            print(f"{'equal to' if r.ieee else 'NOT equal to'} an IEEE reference: {r.name}")
    if args.out:
        atomic.write_text(args.out, fingerprint.text(header, rows))
        print(f"fingerprint: {args.out}")
    return 0


def run(args: argparse.Namespace) -> int:
    _check(args)
    if args.kernels and not args.unpinned and not hardware.env_is_pinned():
        return hardware.run_pinned(args._argv, replace=args._top)
    if args.kernels:
        return _kernels(args)
    _signature()
    return 0
