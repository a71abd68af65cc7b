"""Check that the compiled modules of a wheel load on the glibc / libstdc++ floor of its platform tag.

    python packaging/check_glibc.py WHEEL_OR_SO... [--policy manylinux_2_28]

For every shared object (a wheel's are unpacked to a scratch folder) it prints the newest version it needs
of each versioned dependency (GLIBC_, GLIBCXX_, CXXABI_, GCC_, GOMP_, OMP_) and fails when one is above
the policy's floor, or when an undefined symbol that the build machine's glibc exports carries no version:
such a reference binds at load time to glibc's newest version of that name, which an older glibc may lack
(``stat`` is a function only since 2.33), so the symbol versions alone would not show it. Uses objdump.
"""

from __future__ import annotations

import argparse
import ctypes.util
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# The newest version each tag may need. manylinux_2_28: glibc 2.28 and GCC 8's libstdc++ (the policy of
# auditwheel); GOMP / OMP: what the libgomp bundled by torch 2.13 (GCC 11) exports, the one OpenMP runtime
# the CPU core runs on.
POLICIES: dict[str, dict[str, tuple[int, ...]]] = {
    "manylinux_2_28": {
        "GLIBC": (2, 28),
        "GLIBCXX": (3, 4, 25),
        "CXXABI": (1, 3, 11),
        "GCC": (7, 0, 0),
        "GOMP": (5, 0),
        "OMP": (5, 0),
    },
}
# Version tags of the libraries we link on purpose that are no floor (the CUDA runtime's own tags).
VERSION = re.compile(r"^(GLIBCXX|GLIBC|CXXABI|GCC|GOMP|OMP)_([0-9][0-9.]*)$")
GLIBC_LIBRARIES = ("c", "m", "pthread", "dl", "rt")


def dynamic_symbols(path: Path) -> list[tuple[bool, str, str]]:
    """(undefined, version, name) of every dynamic symbol of ``path``: version '' when unversioned, in
    parentheses when it is not the name's default version."""
    out = subprocess.run(["objdump", "-T", str(path)], check=True, capture_output=True, text=True).stdout
    symbols = []
    for line in out.splitlines():
        # 0000000000000000      DF *UND*  0000000000000000 (GLIBC_2.2.5) memcpy
        match = re.match(r"^[0-9a-f]{16} .{7} (\S+)\s+[0-9a-f]+\s+(?:(\S+)\s+)?(\S+)$", line)
        if match:
            section, version, name = match.groups()
            unversioned = version in (None, "Base", "(Base)")  # objdump's word for "no version"
            symbols.append((section == "*UND*", "" if unversioned else version, name))
    return symbols


def host_glibc_defaults() -> dict[str, tuple[int, ...]]:
    """The default (newest) glibc version of each name that the build machine's glibc libraries define."""
    names: dict[str, tuple[int, ...]] = {}
    for lib in GLIBC_LIBRARIES:
        found = ctypes.util.find_library(lib)
        if not found:
            continue
        path = next(
            (Path(d) / found for d in ("/lib/x86_64-linux-gnu", "/usr/lib64", "/lib64") if (Path(d) / found).exists()),
            None,
        )
        if path is not None:
            for undefined, version, name in dynamic_symbols(path):
                if not undefined and re.fullmatch(r"GLIBC_[0-9.]+", version):
                    names[name] = max(names.get(name, ()), parse_version(version.removeprefix("GLIBC_")))
    return names


def parse_version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part)


def check(path: Path, policy: dict[str, tuple[int, ...]], glibc_names: dict[str, tuple[int, ...]]) -> list[str]:
    """The problems of one shared object (empty: it loads on the policy's floor); prints its newest versions."""
    newest: dict[str, tuple[int, ...]] = {}
    unversioned_glibc = []
    for undefined, version, name in dynamic_symbols(path):
        if not undefined:
            continue
        match = VERSION.match(version.strip("()"))
        if match:
            tag, number = match.group(1), parse_version(match.group(2))
            newest[tag] = max(newest.get(tag, ()), number)
        elif not version and glibc_names.get(name, ()) > policy["GLIBC"]:
            unversioned_glibc.append(name)
    shown = ", ".join(f"{tag}_{'.'.join(map(str, v))}" for tag, v in sorted(newest.items())) or "no versioned symbols"
    print(f"{path.name}: {shown}")
    problems = [
        f"{path.name} needs {tag}_{'.'.join(map(str, v))}, above the floor {tag}_{'.'.join(map(str, policy[tag]))}"
        for tag, v in sorted(newest.items())
        if v > policy[tag]
    ]
    if unversioned_glibc:
        problems.append(
            f"{path.name} has unversioned references to glibc symbols newer than the floor (they bind at load time "
            "to the newest version, which an older glibc lacks): " + ", ".join(sorted(set(unversioned_glibc)))
        )
    return problems


def shared_objects(paths: list[Path], scratch: Path) -> list[Path]:
    """The .so files of the given wheels (unpacked into ``scratch``) and plain .so paths."""
    found = []
    for path in paths:
        if path.suffix == ".whl":
            target = scratch / path.stem
            with zipfile.ZipFile(path) as wheel:
                members = [m for m in wheel.namelist() if re.search(r"\.so(\.\d+)*$", m)]
                wheel.extractall(target, members)
            found += [target / m for m in members]
        else:
            found.append(path)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="wheels or shared objects")
    parser.add_argument("--policy", default="manylinux_2_28", choices=sorted(POLICIES))
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.paths if not p.is_file()]
    if missing:
        print(f"not a file: {', '.join(missing)}", file=sys.stderr)
        return 2
    glibc_names = host_glibc_defaults()
    if not glibc_names:
        print(
            "the build machine's glibc libraries were not found (needed for the unversioned-symbol check)",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        objects = shared_objects(args.paths, Path(scratch))
        if not objects:
            print("no shared objects found in " + ", ".join(map(str, args.paths)), file=sys.stderr)
            return 1
        problems = [p for obj in objects for p in check(obj, POLICIES[args.policy], glibc_names)]
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return 1
    print(f"{len(objects)} shared object(s) within {args.policy}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
