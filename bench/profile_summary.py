"""Summarise a py-spy raw (collapsed) profile: `python -m bench.profile_summary FILE [N]`.

Prints the top N functions by own time and by inclusive time, as % of samples.
Profiles come from `python -m bench.scenario NAME --profile` (bench/results/profile-NAME.txt).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path


def summarise(path: Path, top: int = 25) -> str:
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = [f.split(" (")[0] + " (" + f.split("/")[-1] if "/" in f else f
                  for f in stack.split(";")]  # fmt: skip
        own[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    lines = [f"{path.name}: {total} samples", "", "own %   function"]
    lines += [f"{100 * n / total:5.1f}   {f}" for f, n in own.most_common(top)]
    lines += ["", "incl %  function"]
    lines += [f"{100 * n / total:5.1f}   {f}" for f, n in incl.most_common(top)]
    return "\n".join(lines)


if __name__ == "__main__":
    print(summarise(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 25))
