#!/usr/bin/env python3
"""Summarises EMBER_TRACE task timelines (runtime/trace.c) per StarPU worker.

    python3 scripts/trace-summary.py TRACE.json [TRACE.json.rank1 ...] [--skip 0.2]

For each file and worker: tasks, busy time (union of the task spans), busy
share of the window, and the codelets that take the most time. --skip drops
the first fraction of the window (warm-up). Spans of asynchronous GPU tasks
run from launch to completion seen by the worker, so overlapping spans on a
GPU worker are queued work, not parallel work. Idle time between tasks is
split into "starved" (the next task was not even submitted yet when the
worker became free: the submitting thread is behind) and "waiting" (it was
submitted but its inputs or its launch were not ready).
"""
import argparse
import collections
import json


def union_length(spans):
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--skip", type=float, default=0.2, help="fraction of the window to drop at the start")
    ap.add_argument("--top", type=int, default=6)
    a = ap.parse_args()
    for path in a.files:
        try:
            d = json.load(open(path))
        except (OSError, ValueError) as e:
            raise SystemExit(f"trace-summary: cannot read {path}: {e}")
        names = {e["tid"]: e["args"]["name"] for e in d["traceEvents"] if e.get("ph") == "M"}
        ev = [e for e in d["traceEvents"] if e.get("ph") == "X"]
        if not ev:
            print(f"{path}: no task spans")
            continue
        t_lo = min(e["ts"] for e in ev)
        t_hi = max(e["ts"] + e["dur"] for e in ev)
        t_lo += (t_hi - t_lo) * a.skip
        ev = [e for e in ev if e["ts"] >= t_lo]
        window = t_hi - t_lo
        print(f"{path}: {len(ev)} tasks in a window of {window / 1e3:.1f} ms (first {a.skip:.0%} skipped)")
        by_w = collections.defaultdict(list)
        for e in ev:
            by_w[e["tid"]].append(e)
        for w in sorted(by_w):
            es = by_w[w]
            busy = union_length([(e["ts"], e["ts"] + e["dur"]) for e in es])
            per = collections.Counter()
            cnt = collections.Counter()
            for e in es:
                per[e["name"]] += e["dur"]
                cnt[e["name"]] += 1
            top = ", ".join(f"{n} {t / 1e3:.1f} ms/{cnt[n]}" for n, t in per.most_common(a.top))
            es.sort(key=lambda e: e["ts"])
            starved = waiting = 0.0
            end = es[0]["ts"] + es[0]["dur"]
            for e in es[1:]:
                gap = e["ts"] - end
                if gap > 0:
                    sub = e.get("args", {}).get("submit", e["ts"])
                    s_part = min(gap, max(0.0, sub - end))
                    starved += s_part
                    waiting += gap - s_part
                end = max(end, e["ts"] + e["dur"])
            print(f"  worker {w:2d} {names.get(w, '?'):28.28s} {len(es):6d} tasks  busy {busy / 1e3:8.1f} ms "
                  f"({busy / window:5.1%})  idle: starved {starved / 1e3:.1f} ms, waiting {waiting / 1e3:.1f} ms  {top}")


if __name__ == "__main__":
    main()
