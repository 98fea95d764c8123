#!/usr/bin/env python3
"""Turns bench/run's raw per-round CSV into the side-by-side report (issue 5).

For every scenario in the raw CSV it appends to bench/results/<date>-<scenario>.md (a section:
machine, medians per broker, the kaas/Kafka ratio with min-median-max across rounds and a
verdict against the target, then every round) and to bench/results/<date>-<scenario>.csv (the
raw rows), prints the markdown, and with --chart draws one PNG per run: throughput and p99 per
scenario x broker. Standard library only, except matplotlib for --chart.

The targets are goals the harness measures; a "not met" verdict is information, not a failure.
"""

import argparse
import csv
import math
import os
import statistics
import sys
import textwrap

TITLES = {
    "S1": "kafka-producer-perf-test, 1 KB records, acks=all, idempotent, 6 partitions",
    "S2": "kafka-producer-perf-test, 100-byte records, acks=all, idempotent, 6 partitions",
    "S3": "kafka-producer-perf-test --transactional-id, --transaction-duration-ms 100 and 10, 1 KB, 6 partitions",
    "S4": "many small transactions: bench/txnload (franz-go), 16 and 64 producers, 1-record transactions, 100-byte records",
    "S5": "perf-test produce (1 KB, 6 partitions), then kafka-consumer-perf-test read_uncommitted / read_committed",
    "S6": "EndToEndLatency, 1 KB, acks=all, 1 partition, one message in flight",
    "S7": "1, 2, 4 concurrent perf-test producers (one 6-partition topic each), 1 KB, acks=all, vs the disk's fsync'd bandwidth",
    "S4c": "cluster mode: S4 (bench/txnload --remote-leaders, 16 and 64 producers, 1-record transactions) on a 3-broker cluster vs the single broker, each producer's partition led by another broker than its coordinator; then kill -9 of a transaction coordinator",
    "S9": "compaction: the cleaner's MB/s on a 1-partition topic of K keys x M versions (1 KiB random values, cleanup.policy switched from delete to compact), and the p99 of a fixed-rate acks=all produce load on another topic without cleaning, over the whole load while cleaning, and for the records due during the clean",
    "S8": "cluster mode: S1's perf-test on a 3-broker cluster (etcd + 3 kaas, one data dir) vs the single broker; failover after kill -9 / SIGTERM of a leader",
}

# (scenario, variant or None for all variants, metric, op, target). Ratios are kaas / kafka
# (the default-durability Kafka) medians-of-rounds; ">=" metrics are better higher.
RATIO_TARGETS = [
    ("S1", None, "records_per_s", ">=", 1.5),
    ("S1", None, "p99_ms", "<=", 0.5),
    ("S3", None, "records_per_s", ">=", 1.5),
    ("S4", None, "records_per_s", ">=", 2.0),
    ("S5", "read_uncommitted", "records_per_s", ">=", 1.0),
    ("S5", "read_committed", "records_per_s", ">=", 1.0),
    ("S6", None, "p99_ms", "<=", 0.5),
]
# Every scenario: broker CPU seconds per GB moved <= 0.4x Kafka, peak RSS <= 0.2x Kafka.
GLOBAL_TARGETS = [("cpu_s_per_gb", "<=", 0.4), ("peak_rss_mb", "<=", 0.2)]

METRIC_LABEL = {
    "records_per_s": "records/s",
    "mb_per_s": "MB/s",
    "p99_ms": "p99 ms",
    "cpu_s_per_gb": "CPU s/GB",
    "peak_rss_mb": "peak RSS MB",
}


def num(s):
    try:
        v = float(s)
        return v if math.isfinite(v) else None
    except (TypeError, ValueError):
        return None


def fmt(v, digits=None):
    if v is None:
        return "-"
    if digits is None:
        digits = 0 if abs(v) >= 1000 else (1 if abs(v) >= 10 else 2)
    return f"{v:,.{digits}f}".replace(",", " ") if abs(v) >= 10000 else f"{v:.{digits}f}"


def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def derived(row):
    """Adds cpu_s_per_gb to a raw row (numbers parsed)."""
    out = {k: row[k] for k in row}
    for k in ("records_per_s", "mb_per_s", "avg_ms", "p50_ms", "p99_ms", "max_ms", "p999_ms",
              "cpu_s", "peak_rss_mb", "bytes", "records"):
        out[k] = num(row.get(k))
    b, c = out["bytes"], out["cpu_s"]
    out["cpu_s_per_gb"] = c / (b / 1e9) if b and c is not None and b > 0 else None
    out["failed"] = row.get("extra") == "failed"
    return out


def ratio_stats(rows, variant, metric, num_b="kaas", den_b="kafka"):
    """min, median, max across rounds of rows[num_b][r] / rows[den_b][r], pairing rounds."""
    a = {r["round"]: r[metric] for r in rows if r["variant"] == variant and r["broker"] == num_b}
    b = {r["round"]: r[metric] for r in rows if r["variant"] == variant and r["broker"] == den_b}
    rs = [a[k] / b[k] for k in a if k in b and a[k] is not None and b[k] not in (None, 0)]
    if not rs:
        return None
    return min(rs), statistics.median(rs), max(rs)


def verdict(value, op, target):
    if value is None:
        return "n/a"
    ok = value >= target if op == ">=" else value <= target
    return "met" if ok else "not met"


def scenario_md(sc, rows, args, variants, brokers):
    if sc in ("S8", "S4c"):
        # S8 and S4c compare kaas with itself (single broker, cluster); no Kafka rows exist.
        brokers = [b for b in brokers if any(r["broker"] == b for r in rows)]
    L = []
    L.append(f"## {rows[0]['run_id']} — {sc}: {TITLES.get(sc, sc)}")
    L.append("")
    L.append(f"- mode: {args.mode}, rounds: {args.rounds}, brokers (alternating within each round): {', '.join(brokers)}")
    L.append(f"- machine: {args.machine}")
    L.append(f"- load average (1/5/15 min): {args.load}")
    L.append("- durability: kaas fsyncs before every acknowledgement; `kafka` (Apache Kafka 4.1.1 on"
             " defaults) acknowledges from the page cache; `kafka-fsync` is Kafka with"
             " log.flush.interval.messages=1 (equal durability).")
    L.append("")
    L.append("Medians across rounds:")
    L.append("")
    L.append("| variant | broker | records/s | MB/s | avg ms | p50 ms | p99 ms | max ms | p99.9 ms | broker CPU s | CPU s/GB | peak RSS MB | rounds ok |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for v in variants:
        for b in brokers:
            rs = [r for r in rows if r["variant"] == v and r["broker"] == b]
            ok = [r for r in rs if not r["failed"]]
            cells = [fmt(med([r[m] for r in ok])) for m in
                     ("records_per_s", "mb_per_s", "avg_ms", "p50_ms", "p99_ms", "max_ms", "p999_ms",
                      "cpu_s", "cpu_s_per_gb", "peak_rss_mb")]
            L.append(f"| {v} | {b} | " + " | ".join(cells) + f" | {len(ok)}/{len(rs)} |")
    L.append("")
    if sc not in ("S8", "S4c"):
        L.append("kaas / Kafka ratios (per round, paired by round; min – median – max), verdict on the median:")
        L.append("")
        L.append("| variant | metric | kaas/kafka min – median – max | kaas/kafka-fsync median | target | verdict |")
        L.append("|---|---|---|---|---|---|")
    for v in (variants if sc not in ("S8", "S4c") else []):
        checks = [(m, op, t) for (s, vv, m, op, t) in RATIO_TARGETS if s == sc and vv in (None, v)]
        checks += GLOBAL_TARGETS
        if sc in ("S2", "S7") or (sc == "S5" and v == "produce"):
            checks = [("records_per_s", "", None)] + checks
        if sc in ("S3", "S4", "S7") and not any(m == "p99_ms" for m, _, _ in checks):
            checks.append(("p99_ms", "", None))
        if sc == "S9":
            # Quoted, not targeted (issue 12): the cleaner's MB/s, and what it does to produce p99.
            # The clean row has no CPU figure and the window row no byte count.
            checks = [("mb_per_s", "", None)] if v == "clean" else [("p99_ms", "", None)]
            if v in ("produce-idle", "produce-cleaning"):
                checks += GLOBAL_TARGETS
        for m, op, t in checks:
            st = ratio_stats(rows, v, m)
            stf = ratio_stats(rows, v, m, den_b="kafka-fsync")
            rng = "-" if st is None else f"{st[0]:.2f} – **{st[1]:.2f}** – {st[2]:.2f}"
            fs = "-" if stf is None else f"{stf[1]:.2f}"
            tgt = "informational" if t is None else f"{op} {t}x"
            vd = "" if t is None else verdict(st[1] if st else None, op, t)
            L.append(f"| {v} | {METRIC_LABEL.get(m, m)} | {rng} | {fs} | {tgt} | {vd} |")
    # Absolute targets.
    extra = []
    if sc == "S4":
        v64 = med([r["records_per_s"] for r in rows if r["variant"] == "64producers" and r["broker"] == "kaas" and not r["failed"]])
        if v64 is not None or any(r["variant"] == "64producers" for r in rows):
            extra.append(f"| 64producers | kaas commits/s | {fmt(v64)} | >= 5000 | {verdict(v64, '>=', 5000)} |")
    if sc == "S8":
        # The cluster against the single broker on the same machine (3 brokers + etcd share the
        # same cores and disk, so this is the cost of cluster mode, not its scaling).
        for m in ("records_per_s", "p99_ms"):
            st = ratio_stats(rows, "produce-1024B", m, num_b="kaas-cluster", den_b="kaas")
            extra.append(f"| produce-1024B | kaas-cluster / kaas {METRIC_LABEL[m]} | "
                         f"{'-' if st is None else f'{st[0]:.2f} – {st[1]:.2f} – {st[2]:.2f}'} | informational | |")
        for v in ("failover-KILL", "failover-TERM"):
            ms = [r["max_ms"] for r in rows if r["variant"] == v and r["broker"] == "kaas-cluster" and not r["failed"]]
            if ms or any(r["variant"] == v for r in rows):
                m, worst = med(ms), (max(ms) if ms else None)
                extra.append(f"| {v} | failover ms, median (worst {fmt(worst)}) | {fmt(m)} | <= 5000 (test session settings) | {verdict(worst, '<=', 5000)} |")
    if sc == "S4c":
        # Issue 10's goals: the cluster keeps >= 0.8x the single broker's commits/s and at most
        # 2x its EndTxn p99 (the same cores and disk: the cost of crossing brokers).
        for v in ("16producers", "64producers"):
            for m, op, t in (("records_per_s", ">=", 0.8), ("p99_ms", "<=", 2.0)):
                st = ratio_stats(rows, v, m, num_b="kaas-cluster", den_b="kaas")
                label = "commits/s" if m == "records_per_s" else "EndTxn p99"
                extra.append(f"| {v} | kaas-cluster / kaas {label} (min – median – max) | "
                             f"{'-' if st is None else f'{st[0]:.2f} – **{st[1]:.2f}** – {st[2]:.2f}'} | {op} {t}x | "
                             f"{verdict(st[1] if st else None, op, t)} |")
        ms = [r["max_ms"] for r in rows if r["variant"] == "coord-failover-KILL" and not r["failed"]]
        if ms or any(r["variant"] == "coord-failover-KILL" for r in rows):
            extra.append(f"| coord-failover-KILL | kill → first commit ms, median (worst {fmt(max(ms) if ms else None)}) | "
                         f"{fmt(med(ms))} | informational (session + reassignment + slot load + client retry) | |")
    if sc == "S9":
        # Each broker against itself: produce p99 while cleaning / without cleaning.
        for b in brokers:
            idle = med([r["p99_ms"] for r in rows if r["variant"] == "produce-idle" and r["broker"] == b and not r["failed"]])
            for v in ("produce-cleaning", "produce-in-clean-window"):
                m = med([r["p99_ms"] for r in rows if r["variant"] == v and r["broker"] == b and not r["failed"]])
                if idle and m is not None:
                    extra.append(f"| {v} | {b} produce p99 / its produce-idle p99 | {m / idle:.2f} | informational | |")
    if sc == "S7" and args.disk_mbps:
        disk = float(args.disk_mbps)
        for v in variants:
            for b in brokers:
                m = med([r["mb_per_s"] for r in rows if r["variant"] == v and r["broker"] == b and not r["failed"]])
                if m is None:
                    continue
                frac = m / disk
                if b == "kaas":
                    extra.append(f"| {v} | kaas MB/s / disk {disk:.0f} MB/s | {frac:.0%} | >= 60 % | {verdict(frac, '>=', 0.6)} |")
                else:
                    extra.append(f"| {v} | {b} MB/s / disk {disk:.0f} MB/s | {frac:.0%} | informational | |")
    if extra:
        L.append("")
        L.append("| variant | absolute metric | value (median) | target | verdict |")
        L.append("|---|---|---|---|---|")
        L.extend(extra)
    L.append("")
    L.append("Every round:")
    L.append("")
    L.append("| round | variant | broker | records | records/s | MB/s | avg ms | p50 ms | p99 ms | max ms | p99.9 ms | CPU s | peak RSS MB | load1 | notes |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        L.append("| " + " | ".join([r["round"], r["variant"], r["broker"], fmt(r["records"], 0)] +
                                    [fmt(r[m]) for m in ("records_per_s", "mb_per_s", "avg_ms", "p50_ms", "p99_ms", "max_ms", "p999_ms", "cpu_s", "peak_rss_mb")] +
                                    [r["load1"], r["extra"].replace("|", "/")]) + " |")
    L.append("")
    return "\n".join(L)


def chart(path, data, brokers, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Scenarios in order, variants in the order they ran.
    # Failover rows (S8, S4c) have no throughput or p99: they get a panel of their own below.
    groups = sorted(dict.fromkeys((r["scenario"], r["variant"]) for r in data if "failover" not in r["variant"]), key=lambda g: g[0])
    fo_groups = sorted(dict.fromkeys((r["scenario"], r["variant"]) for r in data if "failover" in r["variant"]), key=lambda g: g[0])
    colors = {"kaas": "#2b7bba", "kafka": "#e07b39", "kafka-fsync": "#9a9a9a", "kaas-cluster": "#5aa469"}
    # Only the brokers that have rows (S4c and S8 runs name kaas-cluster next to absent Kafkas).
    brokers = [b for b in brokers if any(r["broker"] == b for r in data)]
    n_panels = 3 if fo_groups else 2
    fig, axes = plt.subplots(n_panels, 1, figsize=(max(8, 1.25 * len(groups) + 3), 4.5 * n_panels))
    width = 0.8 / max(1, len(brokers))
    for ax, metric, label in ((axes[0], "records_per_s", "throughput, records/s (S4, S4c: commits/s; S6: round trips/s) — log scale"),
                              (axes[1], "p99_ms", "p99 latency, ms (S4, S4c: EndTxn; S7: worst producer) — log scale")):
        for i, b in enumerate(brokers):
            xs, ys = [], []
            for gi, (sc, v) in enumerate(groups):
                m = med([r[metric] for r in data if r["scenario"] == sc and r["variant"] == v and r["broker"] == b and not r["failed"]])
                if m is None or m <= 0:
                    continue
                xs.append(gi + (i - (len(brokers) - 1) / 2) * width)
                ys.append(m)
            ax.bar(xs, ys, width, label=b, color=colors.get(b))
            for x, y in zip(xs, ys):
                ax.text(x, y, fmt(y), ha="center", va="bottom", fontsize=7, rotation=90)
        ax.set_yscale("log")
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f"{sc}\n{v}" for sc, v in groups], fontsize=8)
        ax.set_title(label, fontsize=10)
        ax.grid(axis="y", alpha=0.3, which="both")
        ax.set_xlim(-0.6, len(groups) - 0.4)
        ax.margins(y=0.25)
    if fo_groups:
        failover_panel(axes[2], data, fo_groups)
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    width_chars = int(fig.get_size_inches()[0] * 14)
    fig.suptitle("\n".join(textwrap.fill(line, width_chars) for line in title.split("\n")), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# The phases of a coordinator failover (bench/failover txn), each a mark measured from the kill.
FAILOVER_PHASES = [("lease_gone_ms", "lease expiry (session)", "#c9c9c9"),
                   ("reassigned_ms", "controller reassignment", "#e07b39"),
                   ("serving_ms", "slot load", "#5aa469"),
                   (None, "client retry + commit", "#2b7bba")]


def extra_num(r, key):
    for kv in r.get("extra", "").split(";"):
        k, _, v = kv.partition("=")
        if k == key:
            return num(v)
    return None


def failover_panel(ax, data, fo_groups):
    """One bar per failover variant (median of kill → first ack/commit, ms, linear scale), split
    into its phases where the rows carry the marks (S4c), and every run's figure as a dot."""
    for gi, (sc, v) in enumerate(fo_groups):
        rs = [r for r in data if r["scenario"] == sc and r["variant"] == v and not r["failed"] and r["max_ms"] is not None]
        if not rs:
            continue
        total = med([r["max_ms"] for r in rs])
        marks = [med([extra_num(r, k) for r in rs]) if k else total for k, _, _ in FAILOVER_PHASES]
        if all(m is not None for m in marks):
            prev = 0
            for (k, label, color), m in zip(FAILOVER_PHASES, marks):
                ax.bar(gi, max(m - prev, 0), 0.5, bottom=prev, color=color, label=label)
                prev = max(m, prev)
        else:
            ax.bar(gi, total, 0.5, color=FAILOVER_PHASES[-1][2])
        ax.scatter([gi] * len(rs), [r["max_ms"] for r in rs], color="black", s=10, zorder=3)
        ax.text(gi + 0.27, total, f"median {fmt(total)} ms", ha="left", va="center", fontsize=8)
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    if uniq:
        ax.legend(uniq.values(), uniq.keys(), loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.set_xticks(range(len(fo_groups)))
    ax.set_xticklabels([f"{sc}\n{v}" for sc, v in fo_groups], fontsize=8)
    ax.set_xlim(-0.6, max(len(fo_groups), 2) - 0.4)
    ax.set_title("failover ms, median (S8: signal → first ack; S4c: kill -9 → first commit, by phase); dots: every run", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.margins(y=0.15)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--machine", default="")
    ap.add_argument("--load", default="")
    ap.add_argument("--disk-mbps", default="")
    ap.add_argument("--brokers", default="kaas kafka kafka-fsync")
    ap.add_argument("--rounds", default="")
    ap.add_argument("--mode", default="full")
    ap.add_argument("--chart", action="store_true")
    args = ap.parse_args()

    with open(args.raw, newline="") as f:
        raw = list(csv.DictReader(f))
    if not raw:
        print("report.py: no rows", file=sys.stderr)
        return 1
    fields = list(raw[0].keys())
    data = [derived(r) for r in raw]
    brokers = args.brokers.split()
    run_id = raw[0]["run_id"]
    date = run_id[:10]
    os.makedirs(args.out_dir, exist_ok=True)
    scenarios = sorted({r["scenario"] for r in data})
    for sc in scenarios:
        rows = [r for r in data if r["scenario"] == sc]
        variants = list(dict.fromkeys(r["variant"] for r in rows))
        md = scenario_md(sc, rows, args, variants, brokers)
        base = os.path.join(args.out_dir, f"{date}-{sc}")
        new_md = not os.path.exists(base + ".md")
        with open(base + ".md", "a") as f:
            if new_md:
                f.write(f"# {date} {sc} — kaas vs Apache Kafka (bench/run; see bench/README.md)\n\n")
            else:
                f.write("\n")
            f.write(md)
        new_csv = not os.path.exists(base + ".csv")
        with open(base + ".csv", "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            if new_csv:
                w.writeheader()
            for r in raw:
                if r["scenario"] == sc:
                    w.writerow(r)
        print(md)
        print(f"(appended to {base}.md and {base}.csv)\n")
    if args.chart:
        png = os.path.join(args.out_dir, f"{date}-{run_id[11:15]}-{'-'.join(scenarios)}.png")
        who = "kaas vs Apache Kafka 4.1.1" if any(r["broker"].startswith("kafka") for r in data) else "kaas: single broker vs 3-broker cluster"
        chart(png, data, brokers, f"{who}, run {run_id} ({args.mode}, {args.rounds} round(s)), medians across rounds\n"
                                  f"{args.machine.split('; java')[0]}\nload {args.load}")
        print(f"chart: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
