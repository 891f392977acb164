"""What each client example in examples/ needs besides .venv, whether this machine has it, and
how to get it: the one table that tests/examples (a missing toolchain is a skip that says so,
and under CI a failure) and the Makefile (`make examples` builds only what it can here, and
prints a banner naming the rest) both read.

Python and grpcurl come with .venv. The others:

    curl        curl, perl, od and awk
    typescript  node to run, and npm to install the packages of package-lock.json
    rust        cargo and Debian's packaged crates to build (offline); the binary to run

Run with any Python 3 (the standard library only), from the repository root:
    build   the examples `make examples-deps` builds: every one under CI, else those whose
            toolchain is here
    banner  the banner naming each example whose toolchain is missing (nothing under CI,
            where pytest fails instead, or when none is)
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEBIAN_REGISTRY = "/usr/share/cargo/registry"
DEBIAN_CRATES = ("ureq-2.*", "serde_derive-1.*", "serde_json-1.*")
APT_RUST = ("cargo librust-ureq-dev librust-serde-dev librust-serde-derive-dev "
            "librust-serde-json-dev")


def ci() -> bool:
    """A CI run (CI set, and not to 0, false or no): every example must run there."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def cargo() -> str | None:
    """The cargo the Makefile builds with: EXAMPLES_CARGO, else the PATH's, else rustup's
    (~/.cargo/bin, where a shell that never read rustup's profile still has it)."""
    chosen = os.environ.get("EXAMPLES_CARGO")
    if chosen:
        return shutil.which(chosen)
    return shutil.which("cargo") or shutil.which(str(Path.home() / ".cargo/bin/cargo"))


def _commands(*names: str) -> list[str]:
    return [name for name in names if shutil.which(name) is None]


def _rust_build() -> list[str]:
    lacking = [] if cargo() else ["cargo"]
    if not all(glob.glob(os.path.join(DEBIAN_REGISTRY, crate)) for crate in DEBIAN_CRATES):
        lacking.append(f"Debian's Rust crates (in {DEBIAN_REGISTRY})")
    return lacking


@dataclass(frozen=True)
class Toolchain:
    """One example's needs: commands it runs with, and what building it takes when its
    built form (`built`, from the repository root) is not there yet."""

    example: str
    run: tuple[str, ...]
    build: Callable[[], list[str]]
    built: str | None
    get: str

    def missing(self) -> list[str]:
        """What this machine lacks to run the example now (building it first if needed)."""
        lacking = _commands(*self.run)
        if self.built is not None and not (ROOT / self.built).exists():
            lacking += self.build()
        return lacking

    def can_build(self) -> bool:
        return not _commands(*self.run) and not self.build()


TOOLCHAINS = {
    "curl": Toolchain(
        "curl", ("curl", "perl", "od", "awk"), lambda: [], None,
        "sudo apt-get install curl perl (Debian, Ubuntu); macOS has them"),
    "typescript": Toolchain(
        "typescript", ("node",), lambda: _commands("npm"),
        "examples/typescript/node_modules/.bin/tsx",
        "Node.js 18 or newer with npm: https://nodejs.org/en/download, "
        "or sudo apt-get install nodejs npm"),
    "rust": Toolchain(
        "rust", (), _rust_build, "examples/rust/target/debian/target/debug/snoozeml-client",
        f"sudo apt-get install {APT_RUST} (Debian, Ubuntu), or CI=true make examples"),
}
BUILT = ("typescript", "rust")  # what `make examples-deps` builds


def skipped() -> dict[str, list[str]]:
    """Each example whose toolchain is missing here, with what is missing."""
    return {name: lacking for name, toolchain in TOOLCHAINS.items()
            if (lacking := toolchain.missing())}


def banner(lacking: dict[str, list[str]]) -> str:
    rule = "#" * 96
    lines = [rule, f"#  SKIPPED: {len(lacking)} of the 5 client examples, their toolchains "
             "are missing here:"]
    for name, missing in lacking.items():
        lines += [f"#    {name:<11} needs {', '.join(missing)}",
                  f"#    {'':<11} get it: {TOOLCHAINS[name].get}"]
    lines += ["#  The other examples run. With CI=true, make installs the npm packages and "
              "Debian's crates,", "#  and an example that cannot run fails.", rule]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv == ["build"]:
        print(" ".join(name for name in BUILT if ci() or TOOLCHAINS[name].can_build()))
        return 0
    if argv == ["banner"]:
        lacking = skipped()
        if lacking and not ci():
            print(banner(lacking))
        return 0
    print(f"usage: {sys.argv[0]} build|banner", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
