#!/usr/bin/env python3
"""Checks the SASS of the shipped sm90 kernels without a GPU.

For each example spec and head dim, `flexjit compile --arch sm_90a
--emit-cubin` builds the kernel exactly as the runtime does (NVRTC, flexjit's
options) into a scratch cache and writes its cubin, which `cuobjdump -sass`
disassembles. Checked, per kernel:

  wait   in the steady-state loop, every MUFU.EX2 (the softmax's exponentials)
         comes before the wait for P V (WARPGROUP.DEPBAR.LE gsb0, 0x0): the
         softmax of tile j+1 overlaps P V of tile j (ptxas once scheduled the
         wait above them; docs/architecture.md). A kernel without the overlap
         (no wait for S alone, gsb0 0x1: the runtime's spill fallback,
         FJ_INTRA_WG_OVERLAP=0, which some masked D=256 kernels take) has no
         such loop; it is reported, not failed
  local  no local memory (STL / LDL: spills or a stack array)
  store  O leaves in 16-byte stores (STG.E.128)

and then every kernel kind of a few specs (`flexjit precompile`: forward,
backward, decode, the block-mask builder, their varlen variants, the
backward's deterministic variant, the forward's long-row variant; D 64 and
128), per kernel:

  cas    no compare-and-swap on shared memory (ATOMS.CAS, ATOMS.CAST): a float
         atomicAdd on shared memory compiles to such a loop on these GPUs, and
         with warps contending for the same words it cost the decode kernel
         about 30 us a CTA (bench/RESULTS-archive.md, session 18)
  select in the sm90 backward's main kernel with 64-row query tiles (D=128,
         and the _m64 variants), no MUFU.EX2 whose innermost BSSY .. BSYNC
         region is a short one (BRANCH_REGION bytes at most): P^T's
         exponentials are computed and selected, not each branched over
         (FJHB_SELECT_P; branched, they made the backward 1.5-20% slower on
         masks and softcap, bench/RESULTS.md, session 28). A region around a
         whole work item's products (the one-tile kernel's test whether the
         item runs on the consumer's rows, some 800 instructions) is not such
         a branch
  wait, local and store as above, in the forward's long-row variant (its
         readable name has _n176: kv tiles of 176 rows, at D=128)

cuobjdump (with nvdisasm beside it) comes with the CUDA toolkit or PyPI's
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm (13.0 series). Without it the
check is skipped (exit 77). Usage: python3 bench/sass_check.py [--cuobjdump PATH]
[--nvdisasm PATH] [--specs causal,...] [--head-dims 64,...]; --self-test checks
the select rule's reading of regions on a few built-in listings.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECS = ["causal", "full", "sliding_window", "document", "prefix_lm", "alibi",
         "softcap"]
HEAD_DIMS = [64, 128, 256]
LINE = re.compile(r"^\s*/\*([0-9a-f]{4,6})\*/\s*(.*?)\s*;")
BRANCH = re.compile(r"BRA (?:\S+ )?0x([0-9a-f]+)")


def find_tool(name, given, env):
    """given (a path), then $env, PATH, the CUDA toolkit's bin."""
    cuda_bin = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin")
    for c in [given, os.environ.get(env), shutil.which(name), os.path.join(cuda_bin, name)]:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def sass(cuobjdump, nvdisasm, cubin):
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(nvdisasm) + os.pathsep + env.get("PATH", "")
    r = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True,
                       env=env)
    if r.returncode != 0 or "does not contain" in r.stdout + r.stderr:
        raise RuntimeError("cuobjdump failed: " + (r.stderr or r.stdout).strip()[:200])
    rows = []
    for line in r.stdout.splitlines():
        m = LINE.match(line)
        if m:
            rows.append((int(m.group(1), 16), m.group(2)))
    if not rows:
        raise RuntimeError("cuobjdump printed no instructions (nvdisasm: %s)" % nvdisasm)
    return rows


def steady_loop(rows):
    """The smallest loop (a backward branch's body) holding both waits of
    the steady state: for S (gsb0, 0x1) and for P V (gsb0, 0x0)."""
    best = None
    for addr, ins in rows:
        m = BRANCH.search(ins)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target >= addr:
            continue
        body = [x for x in rows if target <= x[0] <= addr]
        if (any("DEPBAR.LE gsb0, 0x1" in i for _, i in body) and
                any("DEPBAR.LE gsb0, 0x0" in i for _, i in body) and
                (best is None or len(body) < len(best))):
            best = body
    return best


def check(rows, notes):
    problems = []
    loop = steady_loop(rows)
    if loop is None and not any("DEPBAR.LE gsb0, 0x1" in i for _, i in rows):
        notes.append("no overlap of S and P V (the spill fallback): wait not checked")
    elif loop is None:
        problems.append("wait: no steady-state loop found")
    else:
        exps, late = 0, 0
        waited = False
        for _, ins in loop:
            if "DEPBAR.LE gsb0, 0x0" in ins:
                waited = True
            elif "MUFU.EX2" in ins:
                exps += 1
                late += waited
        if exps == 0:
            problems.append("wait: no MUFU.EX2 in the loop")
        elif late:
            problems.append("wait: %d of %d exponentials after the P V wait" % (late, exps))
    local = sum(1 for _, i in rows if re.search(r"\b(STL|LDL)\b", i))
    if local:
        problems.append("local: %d local-memory instructions" % local)
    if not any("STG.E.128" in i for _, i in rows):
        problems.append("store: no 16-byte global store")
    return problems


ALL_KINDS_SPECS = ["causal", "document", "alibi", "sliding_window"]
ALL_KINDS_PASSES = ["forward", "backward", "decode", "blockmask", "forward_varlen",
                    "backward_varlen", "backward_deterministic", "forward_long"]
CAS = re.compile(r"\bATOMS\.CAS")
BSSY = re.compile(r"\bBSSY\b[^,]*, 0x([0-9a-f]+)")


def bwd_rows64(name):
    """An sm90 backward kernel with 64-row query tiles (its readable name)."""
    return (name.startswith("fj_bwd_") and "_sm90_" in name and
            ("_d128_" in name or "_m64" in name))


# The longest BSSY .. BSYNC region (bytes of code, 16 an instruction) that
# counts as a branch around exponentials: 128 instructions.
BRANCH_REGION = 0x800


def branched_exps(rows):
    """MUFU.EX2 instructions whose innermost BSSY .. BSYNC region (from a
    BSSY to the address it names) is at most BRANCH_REGION bytes long, over
    every function of the cubin (addresses start again at each; the
    backward's pre and post kernels have none)."""
    regions, n, last = [], 0, -1
    for addr, ins in rows:
        if addr < last:
            regions = []
        last = addr
        regions = [r for r in regions if r[1] > addr]
        m = BSSY.search(ins)
        if m:
            regions.append((addr, int(m.group(1), 16)))
        elif "MUFU.EX2" in ins and regions:
            start, end = regions[-1]
            n += end - start <= BRANCH_REGION
    return n


def check_all_kinds(a, cuobjdump, nvdisasm, tmp):
    """The cas rule over every kernel `flexjit precompile` builds for
    ALL_KINDS_SPECS; returns the number of kernels that fail it."""
    manifest = os.path.join(tmp, "all_kinds.lua")
    with open(manifest, "w") as f:
        f.write("return { specs = {%s}, head_dims = {64, 128}, dtypes = {\"bf16\"},\n"
                "  archs = {\"sm_90a\"}, passes = {%s} }\n" % (
                    ", ".join('"%s"' % os.path.join(a.examples, s + ".lua")
                              for s in ALL_KINDS_SPECS),
                    ", ".join('"%s"' % p for p in ALL_KINDS_PASSES)))
    out = os.path.join(tmp, "all_kinds")
    r = subprocess.run([a.flexjit, "precompile", manifest, "--out", out, "-j",
                        str(os.cpu_count() or 1)], capture_output=True, text=True)
    if r.returncode != 0:
        print("FAIL all kinds: flexjit precompile: %s" % (r.stderr or r.stdout).strip()[-300:])
        return 1
    # The entries' keys (their file names), read back by `flexjit cache
    # export`, which checks each and strips its header.
    entries = sorted(f[:-len(".cubin")] for _, _, fs in os.walk(out) for f in fs
                     if f.endswith(".cubin"))
    failed, long_rows = 0, 0
    raw_cubin = os.path.join(tmp, "entry.cubin")
    for key in entries:
        try:
            r = subprocess.run([a.flexjit, "cache", "export", key, "--out", raw_cubin,
                                "--dir", out], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError("flexjit cache export: %s" % r.stderr.strip()[-300:])
            # "wrote N bytes of cubin (ARCH, NAME) to FILE"
            m = re.search(r"\([^,]+, (.*)\) to ", r.stdout)
            name = m.group(1) if m else key
            rows = sass(cuobjdump, nvdisasm, raw_cubin)
            n = sum(1 for _, i in rows if CAS.search(i))
            problems = ["cas: %d shared-memory compare-and-swap instruction(s)" % n] if n else []
            b = branched_exps(rows) if bwd_rows64(name) else 0
            if b:
                problems.append("select: %d exponential(s) inside a branch region" % b)
            if "_n176_" in name:
                long_rows += 1
                problems += check(rows, [])
        except RuntimeError as e:
            name, problems = key, [str(e)]
        if problems:
            print("FAIL %s: %s" % (name, "; ".join(problems)))
            failed += 1
    print("all kinds: %d kernel(s), %d pass cas (and select, and for the %d long-row "
          "ones wait, local and store)" % (len(entries), len(entries) - failed, long_rows))
    # The specs without a score_mod have a long-row kernel at D=128.
    return failed + (0 if entries and long_rows else 1)


def self_test():
    """branched_exps on listings of (address, instruction): an exponential
    in a short region counts, one in a long region or after a short one has
    closed does not, and a function's addresses start again at 0."""
    short = [(0x100, "BSSY B0, 0x180"), (0x110, "@P0 MUFU.EX2 R1, R2"),
             (0x170, "BSYNC B0"), (0x180, "MUFU.EX2 R3, R4")]
    assert branched_exps(short) == 1, short
    long_ = [(0x100, "BSSY B0, 0x3000"), (0x200, "MUFU.EX2 R1, R2")]
    assert branched_exps(long_) == 0, long_
    nested = long_ + [(0x300, "BSSY B1, 0x400"), (0x310, "MUFU.EX2 R5, R6"),
                      (0x400, "MUFU.EX2 R7, R8")]
    assert branched_exps(nested) == 1, nested
    assert branched_exps(short + [(0x0, "MUFU.EX2 R1, R2")]) == 1
    print("sass_check self-test: ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flexjit", default=os.path.join(REPO, "build", "flexjit"))
    ap.add_argument("--examples", default=os.path.join(REPO, "examples"))
    ap.add_argument("--cuobjdump", default=None, help="default: $CUOBJDUMP, PATH")
    ap.add_argument("--nvdisasm", default=None,
                    help="the nvdisasm cuobjdump runs (default: $NVDISASM, PATH)")
    ap.add_argument("--specs", default=",".join(SPECS))
    ap.add_argument("--head-dims", default=",".join(map(str, HEAD_DIMS)))
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        self_test()
        return 0
    cuobjdump = find_tool("cuobjdump", a.cuobjdump, "CUOBJDUMP")
    nvdisasm = find_tool("nvdisasm", a.nvdisasm, "NVDISASM")
    if cuobjdump is None or nvdisasm is None:
        print("sass_check: skipped (no %s: the CUDA toolkit's bin, PATH, $%s or --%s)" %
              (("cuobjdump", "CUOBJDUMP", "cuobjdump") if cuobjdump is None
               else ("nvdisasm", "NVDISASM", "nvdisasm")))
        return 77
    failed = 0
    with tempfile.TemporaryDirectory(prefix="flexjit-sass-") as tmp:
        for spec in a.specs.split(","):
            for d in a.head_dims.split(","):
                name = "%s D=%s" % (spec, d)
                cubin = os.path.join(tmp, "k.cubin")
                r = subprocess.run(
                    [a.flexjit, "compile", os.path.join(a.examples, spec + ".lua"),
                     "--arch", "sm_90a", "--head-dim", d, "--cache-dir",
                     os.path.join(tmp, "cache"), "--emit-cubin", cubin],
                    capture_output=True, text=True)
                if r.returncode != 0:
                    print("FAIL %s: flexjit compile: %s" % (name, (r.stderr or r.stdout)
                                                           .strip()[-200:]))
                    failed += 1
                    continue
                notes = []
                try:
                    problems = check(sass(cuobjdump, nvdisasm, cubin), notes)
                except RuntimeError as e:
                    problems = [str(e)]
                print("%s %s%s%s" % ("FAIL" if problems else "ok  ", name,
                                     ": " + "; ".join(problems) if problems else "",
                                     " (" + "; ".join(notes) + ")" if notes else ""))
                failed += bool(problems)
        failed += check_all_kinds(a, cuobjdump, nvdisasm, tmp)
    print("sass_check: %d kernel(s) failed" % failed if failed else
          "sass_check: all kernels pass")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
