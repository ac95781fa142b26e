#!/usr/bin/env python3
"""Where a kernel's warps wait, from Nsight Compute's warp-state samples per
SASS instruction.

Input: the source page of a report that has the SourceCounters section, as
CSV (bench/profile.sh with PROFILE_SOURCE=1 writes it):

    ncu --section SourceCounters --section WarpStateStats -o REPORT ...
    ncu -i REPORT.ncu-rep --page source --csv --print-source sass > FILE.csv
    python3 bench/ncu_stalls.py FILE.csv [--range 0x1700:0x7c00] [--top 30]

Prints the samples by stall reason, then the code in segments, each begun
by a landmark (a wgmma group, a wait for one, a named barrier, an mbarrier
wait, a proxy fence), with each segment's share of the samples and its two
main reasons, then the instructions with the most samples. Addresses are
offsets from the kernel's first instruction. --range keeps the instructions
in [lo, hi) (one role's code: the sampled warps of every role are summed
otherwise). A kernel's phases are read off the segments: the sm90
backward's source counters in bench/RESULTS.md (session 21) were grouped
this way.

--self-test checks the parser and the grouping on a small built-in page.
"""
import argparse
import collections
import csv
import io
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
LANDMARK = re.compile(r"\b(HGMMA|WARPGROUP\.DEPBAR|BAR\.SYNC|SYNCS\.PHASECHK|"
                      r"FENCE\.VIEW\.ASYNC|UTMALDG|UTMAREDG|UTMASTG|EXIT)\b")


def number(x):
    try:
        return float(x)
    except ValueError:
        return 0.0


def read_page(text):
    """(instructions, reasons): each instruction a dict with offset, source,
    samples and per-reason samples; reasons the stall columns."""
    rows = list(csv.reader(io.StringIO(text)))
    head = next((i for i, r in enumerate(rows) if "Address" in r and "Source" in r), None)
    if head is None:
        raise ValueError("no header row with Address and Source: not ncu's source page "
                         "(--page source --csv --print-source sass)")
    hdr = rows[head]
    if SAMPLES not in hdr:
        raise ValueError("no '%s' column: profile with --section SourceCounters" % SAMPLES)
    col = {h: i for i, h in enumerate(hdr)}
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    out, base = [], None
    for r in rows[head + 1:]:
        if len(r) != len(hdr):
            continue
        try:
            addr = int(r[col["Address"]], 16)
        except ValueError:
            continue
        base = addr if base is None else base
        out.append({"offset": addr - base, "source": r[col["Source"]].strip(),
                    "samples": number(r[col[SAMPLES]]),
                    "by": {h: number(r[col[h]]) for h in reasons}})
    if not out:
        raise ValueError("no instructions on the page")
    return out, reasons


def landmark(src):
    m = LANDMARK.search(src)
    return m.group(1) if m else None


def segments(instrs):
    """Runs of instructions, a new one at each landmark; a wgmma instruction
    after another (the rest of its group, with the descriptor arithmetic
    between) stays in its run."""
    segs, cur = [], None
    for ins in instrs:
        lm = landmark(ins["source"])
        if cur is None or (lm is not None and not (lm == "HGMMA" and cur["last"] == "HGMMA")):
            cur = {"start": ins["offset"], "end": ins["offset"], "first": ins["source"],
                   "count": 0, "samples": 0.0, "by": collections.Counter(), "last": None}
            segs.append(cur)
        cur["end"] = ins["offset"]
        cur["count"] += 1
        cur["samples"] += ins["samples"]
        cur["by"].update(ins["by"])
        cur["last"] = lm or cur["last"]
    return segs


def top_reasons(by, total, n=2):
    return " ".join("%s %.1f%%" % (h[len("stall_"):], 100 * v / total)
                    for h, v in by.most_common(n) if v > 0)


def report(instrs, top, min_share, out):
    total = sum(i["samples"] for i in instrs)
    if total == 0:
        raise ValueError("no samples in the range")
    by = collections.Counter()
    for i in instrs:
        by.update(i["by"])
    print("%d instructions, %d samples" % (len(instrs), total), file=out)
    print("\nby reason:", file=out)
    for h, v in by.most_common():
        if v > 0:
            print("  %-22s %5.1f%%" % (h[len("stall_"):], 100 * v / total), file=out)
    print("\nsegments with at least %.1f%% of the samples (offset range, "
          "instructions, share, main reasons, first instruction):" % min_share, file=out)
    for s in segments(instrs):
        share = 100 * s["samples"] / total
        if share >= min_share:
            print("  %6x-%-6x %4d %5.1f%%  %-34s %s" % (
                s["start"], s["end"], s["count"], share, top_reasons(s["by"], total),
                s["first"][:60]), file=out)
    print("\ninstructions with the most samples:", file=out)
    for i in sorted(instrs, key=lambda i: -i["samples"])[:top]:
        print("  %6x %5.1f%%  %-34s %s" % (
            i["offset"], 100 * i["samples"] / total,
            top_reasons(collections.Counter(i["by"]), total), i["source"][:60]), file=out)
    return total


SELF_TEST_PAGE = '''"Kernel Name","k",
"Address","Source","Warp Stall Sampling (All Samples)","stall_wait","stall_barrier","stall_long_sb","stall_wait (Not Issued)"
"0x1000","IMAD R1, R2, R3, RZ","2","2","0","0","1"
"0x1010","HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT","1","1","0","0","0"
"0x1020","HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24, gsb0","1","1","0","0","0"
"0x1030","FFMA R4, R24, UR5, -R6","0","0","0","0","0"
"0x1040","WARPGROUP.DEPBAR.LE gsb0, 0x0","10","0","10","0","0"
"0x1050","STS.64 [R3], R160","2","2","0","0","0"
"0x1060","FENCE.VIEW.ASYNC.S","4","0","0","4","0"
"0x1070","SYNCS.ARRIVE.TRANS64.A1T0 RZ, [R5+0x38], RZ","0","0","0","0","0"
'''


def self_test():
    instrs, reasons = read_page(SELF_TEST_PAGE)
    assert reasons == ["stall_wait", "stall_barrier", "stall_long_sb"], reasons
    assert [i["offset"] for i in instrs][:3] == [0, 0x10, 0x20]
    segs = segments(instrs)
    # The two wgmma instructions and the FFMA after them are one segment;
    # the wait, and the stores, then the fence with the arrive, are others.
    assert [(s["start"], s["count"], s["samples"]) for s in segs] == [
        (0, 1, 2.0), (0x10, 3, 2.0), (0x40, 2, 12.0), (0x60, 2, 4.0)], segs
    buf = io.StringIO()
    total = report(instrs, 3, 0.0, buf)
    text = buf.getvalue()
    assert total == 20 and "barrier                 50.0%" in text, text
    assert re.search(r"\n\s+40-50\s+2\s+60\.0%\s+barrier 50\.0% wait 10\.0%", text), text
    try:
        read_page("a,b\n1,2\n")
        raise AssertionError("a page without a header was accepted")
    except ValueError:
        pass
    print("ncu_stalls self-test: ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", nargs="?", help="ncu --page source --csv --print-source sass")
    ap.add_argument("--range", help="LO:HI offsets (hex) of the instructions to keep")
    ap.add_argument("--top", type=int, default=25, help="instructions listed (default 25)")
    ap.add_argument("--min-share", type=float, default=0.5,
                    help="segments listed from this share, in percent (default 0.5)")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        self_test()
        return 0
    if not a.csv:
        ap.error("a CSV file is needed (or --self-test)")
    try:
        with open(a.csv, newline="") as f:
            instrs, _ = read_page(f.read())
        if a.range:
            lo, hi = (int(x, 16) for x in a.range.split(":"))
            instrs = [i for i in instrs if lo <= i["offset"] < hi]
        report(instrs, a.top, a.min_share, sys.stdout)
    except (OSError, ValueError) as e:
        print("ncu_stalls: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
