#!/usr/bin/env python3
"""Where a profiled run's GPU time went: ncu's per-kernel summary, summed and ranked.

Reads what `ncu --metrics gpu__time_duration.sum --print-summary per-kernel --csv` prints (other lines, such
as the profiled program's own output, are skipped) and prints each kernel's total time, its share of all
kernels' time, its calls and its mean time per call, largest first. Kernels are named without their
argument lists and anonymous namespaces; launches of one kernel with different grids are added together.

With --base, an earlier run's summary (a commit before, the same GPU and batch) beside it: each kernel's time
then, and the change, ranked by today's time, kernels gone since then listed after.

usage: kernel_times.py [--top N] [--base EARLIER_NCU_CSV] NCU_CSV
"""
import argparse
import collections
import csv
import re


def short_name(name):
    name = re.sub(r"\(.*", "", name)  # the argument list
    name = name.removeprefix("void ")
    return name.replace("(anonymous namespace)::", "").replace("<unnamed>::", "")


def kernel_times(lines):
    """{kernel: [total ns, calls]} from ncu's CSV lines."""
    rows = csv.reader(lines)
    header = next((r for r in rows if "Kernel Name" in r and "Invocations" in r), None)
    if header is None:
        raise SystemExit("no ncu per-kernel summary (a header with 'Kernel Name' and 'Invocations') in the input")
    col = {name: i for i, name in enumerate(header)}
    times = collections.defaultdict(lambda: [0.0, 0])
    for r in rows:
        if len(r) != len(header) or r[col["Metric Name"]] != "gpu__time_duration.sum":
            continue
        calls = int(r[col["Invocations"]])
        entry = times[short_name(r[col["Kernel Name"]])]
        entry[0] += calls * float(r[col["Average"]].replace(",", ""))
        entry[1] += calls
    return times


def read_times(path):
    with open(path, newline="") as f:
        return kernel_times(f)


def print_ranked(times, top):
    ranked = sorted(times.items(), key=lambda kv: -kv[1][0])
    total = sum(ns for ns, _ in times.values())
    print(f"{total / 1e6:.2f} ms in {sum(n for _, n in times.values())} kernel calls")
    print(f"{'ms':>9} {'share':>6} {'calls':>6} {'us/call':>9}  kernel")
    for name, (ns, calls) in ranked[:top]:
        print(f"{ns / 1e6:9.2f} {ns / total:6.1%} {calls:6d} {ns / calls / 1e3:9.1f}  {name}")
    rest = ranked[top:]
    if rest:
        ns = sum(t for _, (t, _) in rest)
        print(f"{ns / 1e6:9.2f} {ns / total:6.1%} {sum(c for _, (_, c) in rest):6d} {'':>9}  {len(rest)} others")


def print_against(times, base, top):
    """Each kernel's ms now and in `base`, and the change; then the kernels `base` had and this run has not."""
    def ms(table, name):
        return table.get(name, [0.0, 0])[0] / 1e6

    total, was = sum(ns for ns, _ in times.values()) / 1e6, sum(ns for ns, _ in base.values()) / 1e6
    print(f"{total:.2f} ms in {sum(n for _, n in times.values())} kernel calls, "
          f"{was:.2f} ms before ({total - was:+.2f} ms)")
    print(f"{'ms':>9} {'before':>9} {'change':>9}  kernel")
    ranked = sorted(times, key=lambda name: -times[name][0])
    gone = sorted((name for name in base if name not in times), key=lambda name: -base[name][0])
    shown = ranked[:top] + gone
    for name in shown:
        now, then = ms(times, name), ms(base, name)
        print(f"{now:9.2f} {then:9.2f} {now - then:+9.2f}  {name}{'' if name in times else '  (gone)'}")
    rest = ranked[top:]
    if rest:
        now, then = sum(ms(times, n) for n in rest), sum(ms(base, n) for n in rest)
        print(f"{now:9.2f} {then:9.2f} {now - then:+9.2f}  {len(rest)} others")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--top", type=int, default=25, help="kernels to list (the rest are summed in one line)")
    p.add_argument("--base", help="an earlier run's ncu summary to set beside this one")
    p.add_argument("ncu_csv")
    args = p.parse_args()
    times = read_times(args.ncu_csv)
    if args.base:
        print_against(times, read_times(args.base), args.top)
    else:
        print_ranked(times, args.top)


if __name__ == "__main__":
    main()
