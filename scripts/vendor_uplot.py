"""Fetch uPlot, the dashboard's charting library, from the npm registry and check its digests.

The operator dashboard serves uPlot from the package (``reference/src/rollnet/reference/
coordinator/dashboard_static/``) so nothing is fetched at run time; this script is how those
files got there and how to check or renew them::

    python scripts/vendor_uplot.py           # fetch with `npm pack`, check, write the files
    python scripts/vendor_uplot.py --check   # only check the committed files' digests

A new version means new digests below (printed when they differ), reviewed like any change.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "uplot"
VERSION = "1.6.32"
#: SHA-256 of the npm tarball and of each file taken from it (file in the tarball -> name here).
TARBALL_SHA256 = "4b8a8191e425658e3ea8c8c1314b0fc679c861ee3a1af2b20c7b16ba50b5133d"
FILES: dict[str, tuple[str, str]] = {
    "package/dist/uPlot.iife.min.js": (
        "uPlot.iife.min.js",
        "19c8d4c6ad88929a79f4ae49d6f7161566dfd0ba3d15cc495e974f787eb78f1f",
    ),
    "package/dist/uPlot.min.css": (
        "uPlot.min.css",
        "df630c6a8d6f8eeaff264b50f73ce5b114f646ffd9a0bb74f049b0a00135fa04",
    ),
    "package/LICENSE": (
        "uPlot.LICENSE",
        "8f989229699b4fe2f1a0432d0e9edc338a8a911e250e2d1b01ecd770a5f5b1bd",
    ),
}
DESTINATION = (
    Path(__file__).resolve().parent.parent
    / "reference/src/rollnet/reference/coordinator/dashboard_static"
)


def sha256(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def fetch(work: Path) -> Path:
    """``npm pack`` the pinned version into ``work``; returns the tarball."""
    subprocess.run(
        ["npm", "pack", f"{PACKAGE}@{VERSION}", "--pack-destination", str(work), "--silent"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return work / f"{PACKAGE}-{VERSION}.tgz"


def vendor() -> int:
    """Fetch, check and write the files."""
    with tempfile.TemporaryDirectory() as temporary:
        tarball = fetch(Path(temporary))
        digest = sha256(tarball.read_bytes())
        if digest != TARBALL_SHA256:
            print(f"{tarball.name}: sha256 {digest}, expected {TARBALL_SHA256}", file=sys.stderr)
            return 1
        with tarfile.open(tarball) as archive:
            for member, (name, expected) in FILES.items():
                extracted = archive.extractfile(member)
                if extracted is None:
                    print(f"{member} missing from {tarball.name}", file=sys.stderr)
                    return 1
                data = extracted.read()
                if sha256(data) != expected:
                    print(f"{member}: sha256 {sha256(data)}, expected {expected}", file=sys.stderr)
                    return 1
                (DESTINATION / name).write_bytes(data)
                print(f"wrote {DESTINATION / name}")
    return 0


def check() -> int:
    """Check the committed files against the pinned digests."""
    bad = 0
    for name, expected in FILES.values():
        path = DESTINATION / name
        if not path.is_file():
            print(f"{path}: missing", file=sys.stderr)
            bad += 1
        elif sha256(path.read_bytes()) != expected:
            print(
                f"{path}: sha256 {sha256(path.read_bytes())}, expected {expected}", file=sys.stderr
            )
            bad += 1
    if not bad:
        print(f"uPlot {VERSION}: vendored files match their digests")
    return 1 if bad else 0


def main() -> int:
    """Command line: fetch (default) or ``--check``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check the committed files")
    args = parser.parse_args()
    return check() if args.check else vendor()


if __name__ == "__main__":
    sys.exit(main())
