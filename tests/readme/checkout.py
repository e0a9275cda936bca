"""A copy of this working tree, for running the README as a new user would: ``python -m tests.readme.checkout
DEST`` copies every file git tracks or would track (ignored ones left out, so no ``.venv`` or ``.cache``) to
DEST, then ``make -C DEST .venv/.installed-run`` installs it the way ``make run`` does (the base package
only). Files keep their times, so that install is redone only when ``pyproject.toml`` or the lock changed;
anything else found there (what the commands left: recordings, results) is removed, but for the
environment itself (``.venv``, the install's ``*.egg-info``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ".copied-files"
KEPT_DIRS = {".venv", "__pycache__"}


def tracked_files(root: Path) -> list[str]:
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    )
    return sorted({name for name in listing.stdout.decode().split("\0") if name and (root / name).is_file()})


def copy_tree(root: Path, dest: Path) -> int:
    """Copy ``root``'s files to ``dest``; the number copied (unchanged ones are skipped)."""
    files = tracked_files(root)
    _remove_others(dest, {*files, MANIFEST})
    copied = 0
    for name in files:
        source, target = root / name, dest / name
        stat = source.stat()
        if target.exists() and (target.stat().st_mtime_ns, target.stat().st_size) == (
            stat.st_mtime_ns,
            stat.st_size,
        ):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        copied += 1
    (dest / MANIFEST).write_text("\n".join(files) + "\n")
    return copied


def _remove_others(dest: Path, keep: set[str]) -> None:
    for directory, subdirectories, names in os.walk(dest):
        subdirectories[:] = [d for d in subdirectories if d not in KEPT_DIRS and not d.endswith(".egg-info")]
        for name in names:
            path = Path(directory, name)
            if path.relative_to(dest).as_posix() not in keep:
                path.unlink()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.readme.checkout DEST", file=sys.stderr)
        return 2
    dest = Path(argv[0]).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    copied = copy_tree(ROOT, dest)
    print(f"readme checkout: {copied} file(s) copied to {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
