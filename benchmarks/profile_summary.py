#!/usr/bin/env python3
"""Summarise a py-spy profile recorded with ``--format raw`` (collapsed stacks):
the frames with the most inclusive and self time, as % of all samples.

    py-spy record --pid PID --duration 10 --format raw -o prof.txt
    .venv/bin/python benchmarks/profile_summary.py prof.txt --top 30
    .venv/bin/python benchmarks/profile_summary.py prof.txt --match pydantic --match json

``--match WORD`` (repeatable) also prints the share of samples whose stack
contains a frame matching WORD (by function or file), e.g. how much of the time
is under pydantic, sqlite3 or logging.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys

_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^:()]+)(?::(?P<line>\d+))?\)$")


def short(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m.group("file")
    for marker in ("site-packages/", "/lib/python3.11/", "/work/main/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{m.group('fn')} ({path})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("profile", help="py-spy --format raw output")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--match", action="append", default=[], help="share of samples under frames matching this (repeatable)")
    p.add_argument("--idle", action="store_true", help="keep idle samples (epoll/select waits); dropped by default")
    args = p.parse_args(argv)

    inclusive: collections.Counter[str] = collections.Counter()
    self_time: collections.Counter[str] = collections.Counter()
    matched: collections.Counter[str] = collections.Counter()
    total = idle = 0
    for line in open(args.profile, errors="replace"):
        line = line.rstrip("\n")
        if not line:
            continue
        stack, _, count_text = line.rpartition(" ")
        try:
            count = int(count_text)
        except ValueError:
            continue
        frames = [f for f in stack.split(";") if f]
        leaf = frames[-1] if frames else ""
        if not args.idle and any(w in leaf for w in ("epoll", "select (selectors", "poll (selectors", "get_events", "wait (threading", "_wait_for_tstate_lock")):
            idle += count
            continue
        total += count
        names = [short(f) for f in frames]
        for name in set(names):
            inclusive[name] += count
        if names:
            self_time[names[-1]] += count
        for word in args.match:
            if any(word in f for f in frames):
                matched[word] += count
    if not total:
        print("no samples")
        return 1
    print(f"{total} busy samples ({idle} idle samples dropped)")
    print(f"\n-- top {args.top} by inclusive time")
    for name, c in inclusive.most_common(args.top):
        print(f"{100 * c / total:6.1f}%  {name}")
    print(f"\n-- top {args.top} by self time")
    for name, c in self_time.most_common(args.top):
        print(f"{100 * c / total:6.1f}%  {name}")
    if args.match:
        print("\n-- samples under matching frames")
        for word in args.match:
            print(f"{100 * matched[word] / total:6.1f}%  {word}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
