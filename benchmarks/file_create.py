"""The CPU cost of creating a run's log file, fresh and right after a mass delete.

Every run creates one log file. On the ext4 of the machines this was
measured on, what creating a file costs depends on what was deleted in its
block group before (perf puts the time in the inode allocator's check for
recently deleted inodes): a retention prune, or a benchmark cleaning up its
previous pass. This prints the CPU per created file:

  1. in a fresh directory;
  2. beside it (the same parent, a second directory);
  3. right after both were deleted;
  4. ``--wait`` seconds later (default 45).

Run: python benchmarks/file_create.py [--files N] [--wait S] [--dir DIR]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path


def create(directory: Path, files: int) -> float:
    """Create ``files`` empty files in a new ``directory``; CPU microseconds per file."""
    directory.mkdir()
    before = time.process_time()
    for n in range(files):
        (directory / f"run-{n:06d}.log").open("wb").close()
    return (time.process_time() - before) / files * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--wait", type=float, default=45.0)
    parser.add_argument("--dir", type=Path, default=None, help="parent (default: $TMPDIR)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        base = Path(tmp)
        print(f"fresh directory:           {create(base / 'a', args.files):6.0f} us/file")
        print(f"a second one beside it:    {create(base / 'b', args.files):6.0f} us/file")
        shutil.rmtree(base / "a")
        shutil.rmtree(base / "b")
        print(f"right after deleting both: {create(base / 'c', args.files):6.0f} us/file")
        time.sleep(args.wait)
        print(
            f"{args.wait:.0f} s later:                {create(base / 'd', args.files):6.0f} us/file"
        )


if __name__ == "__main__":
    main()
