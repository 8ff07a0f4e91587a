"""Build hook: compile the optional TOPLOC field kernel (``_field_kernel.c``) with the system C
compiler into a plain shared library that ``rollnet.sdk.proofs._field`` loads with ctypes.

Without a working compiler the package is built without it (a warning says so) and the numpy code
runs instead: the kernel is ~5x faster at committing windows and bit-identical. An editable
install builds the library next to its source; a wheel carries it and is tagged
``py3-none-<platform>`` (the library uses no Python ABI).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PACKAGE_DIR = Path("src/rollnet/sdk/proofs")
SOURCE = PACKAGE_DIR / "_field_kernel.c"
LIBRARY = "_field_kernel.so"
FLAGS = [
    "-O3",
    "-shared",
    "-fPIC",
    # The kernel's sums are of integers below 2**53: exact in any order, so letting the compiler
    # reorder them (to vectorize) changes no result. floor() never sets errno.
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fassociative-math",
    "-fno-signed-zeros",
]


def _compiler() -> list[str] | None:
    configured = os.environ.get("CC") or sysconfig.get_config_var("CC") or ""
    for candidate in (shlex.split(configured), ["cc"], ["gcc"], ["clang"]):
        if candidate and shutil.which(candidate[0]):
            return candidate
    return None


def build_kernel(root: Path, out: Path) -> str | None:
    """Compile the kernel to ``out``; returns why not, or None on success."""
    if sys.platform == "win32":
        return "not built on Windows (the numpy code runs)"
    compiler = _compiler()
    if compiler is None:
        return "no C compiler found (set CC)"
    source = root / SOURCE
    # A failed build must not leave an older library behind to be loaded.
    out.unlink(missing_ok=True)
    # The loader checks this against the source next to the library: a library built from
    # another version of the source is not used.
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    flags = [*FLAGS, f'-DROLLNET_KERNEL_SOURCE="{digest}"']
    if platform.machine().lower() in ("x86_64", "amd64"):
        # One build for every x86-64: AVX-512, AVX2 and baseline versions, picked at load time.
        flags.append("-DROLLNET_TARGET_CLONES")
    command = [*compiler, *flags, "-o", str(out), str(source), "-lm"]
    try:
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as error:
        detail = getattr(error, "stderr", "") or str(error)
        return f"{shlex.join(command)} failed: {detail.strip()[:2000]}"
    return None


def _platform_tag() -> str:
    """This platform's wheel tag (``linux_x86_64``, ``macosx_14_0_arm64``, ...)."""
    return sysconfig.get_platform().replace("-", "_").replace(".", "_")


class KernelBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    """Compile the kernel for editable installs and wheels (not for the sdist)."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        root = Path(self.root)
        if version == "editable":
            out = root / PACKAGE_DIR / LIBRARY
        else:
            out = Path(tempfile.mkdtemp(prefix="rollnet-kernel-")) / LIBRARY
        why_not = build_kernel(root, out)
        if why_not is not None:
            self.app.display_warning(f"rollnet-sdk: TOPLOC field kernel not built: {why_not}")
            return
        if version != "editable":
            build_data["force_include"][str(out)] = str(Path("rollnet/sdk/proofs") / LIBRARY)
            build_data["pure_python"] = False
            # The library uses no Python ABI (ctypes loads it): any Python 3, this platform.
            build_data["tag"] = f"py3-none-{_platform_tag()}"
