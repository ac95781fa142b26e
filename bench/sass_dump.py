#!/usr/bin/env python3
"""Writes the SASS of every shipped kernel, one normalized text file each.

For a change that must leave the generated machine code alone (a template
restructured, a comment edited), dump before and after and compare:

  python3 bench/sass_dump.py /tmp/sass-before     # at the old commit
  python3 bench/sass_dump.py /tmp/sass-after      # at the new one
  diff -r /tmp/sass-before /tmp/sass-after

Each kernel is built by `flexjit compile --emit-cubin` exactly as the runtime
builds it (NVRTC with flexjit's options, the spill fallback included) into a
scratch cache, then disassembled by `cuobjdump -sass`. A file holds the
resource usage (`cuobjdump -res-usage`: registers, shared memory, stack,
the module's global variables)
and every instruction with its encoding (scheduling bits included), one a
line, without the addresses in front (an inserted instruction then shows as
one line, not as a shift of everything after it).

The set: sm_90a with the sm90 template for every example spec of
bench/sass_check.py at head dims 64, 128 and 256, bf16 and fp16; the same
with FLEXJIT_PERSISTENT=0 or =1 where that is not the default; the two-
consumer D=64 kernel that block masks of 128-row blocks take
(FLEXJIT_CONSUMERS=2); the sm80 template at sm_80, sm_86 (the shapes of
parts with about 100 KiB of shared memory) and sm_90a, D=64 and 128;
and a few builds of non-default switches that ship or that tools use (the
spill fallback FJ_INTRA_WG_OVERLAP=0, FJ_TRACE=1). The block-mask builder's
kernels are not reachable from `flexjit compile` and are not dumped.

cuobjdump and nvdisasm: as bench/sass_check.py finds them. Usage:
python3 bench/sass_dump.py OUT_DIR [--jobs N] [--only SUBSTRING] [--cuobjdump
PATH] [--nvdisasm PATH]
"""
import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sass_check import REPO, SPECS, find_tool  # noqa: E402

ADDR = re.compile(r"^\s*/\*[0-9a-f]{4,6}\*/\s*(.*?)\s*/\*\s*(0x[0-9a-f]{16})\s*\*/\s*$")
ENC = re.compile(r"^\s*/\*\s*(0x[0-9a-f]{16})\s*\*/\s*$")


def kernels():
    """(file name, spec, [flexjit compile args], {environment})."""
    out = []
    for spec in SPECS:
        for dt in ("bf16", "fp16"):
            for d in (64, 128, 256):
                base = ["--arch", "sm_90a", "--head-dim", str(d), "--dtype", dt]
                out.append(("sm90_%s_d%d_%s" % (spec, d, dt), spec, base, {}))
                # D=128 is persistent by default, the others are not.
                other = "0" if d == 128 else "1"
                out.append(("sm90_%s_d%d_%s_persistent%s" % (spec, d, dt, other), spec,
                            base, {"FLEXJIT_PERSISTENT": other}))
            out.append(("sm90_%s_d64_%s_two_consumers" % (spec, dt), spec,
                        ["--arch", "sm_90a", "--head-dim", "64", "--dtype", dt],
                        {"FLEXJIT_CONSUMERS": "2"}))
            for arch in ("sm_80", "sm_86", "sm_90a"):
                for d in (64, 128):
                    out.append(("sm80_%s_d%d_%s_%s" % (spec, d, dt, arch), spec,
                                ["--arch", arch, "--head-dim", str(d), "--dtype", dt],
                                {"FLEXJIT_TEMPLATE": "sm80"}))
    # Non-default values of switches that ship (the spill fallback) or that
    # tools build (bench/trace.py's FJ_TRACE).
    for spec in ("causal", "document"):
        for d, env in ((64, {}), (128, {}), (128, {"FLEXJIT_PERSISTENT": "0"}),
                       (64, {"FLEXJIT_CONSUMERS": "2"})):
            tag = "".join("_" + k.split("_")[1].lower() + v for k, v in env.items())
            base = ["--arch", "sm_90a", "--head-dim", str(d)]
            out.append(("sm90x_%s_d%d%s_nooverlap" % (spec, d, tag), spec, base,
                        dict(env, FLEXJIT_KERNEL_DEFINES="FJ_INTRA_WG_OVERLAP=0")))
            if d == 128 or env:
                out.append(("sm90x_%s_d%d%s_trace" % (spec, d, tag), spec, base,
                            dict(env, FLEXJIT_KERNEL_DEFINES="FJ_TRACE=1")))
    return out


def normalize(sass_text, res_text):
    lines = []
    for line in res_text.splitlines():
        if "REG:" in line or "GLOBAL:" in line or line.strip().startswith("Function"):
            lines.append(line.strip())
    pending = None
    for line in sass_text.splitlines():
        m = ADDR.match(line)
        if m:
            pending = "%s ; %s" % (m.group(1).rstrip(" ;"), m.group(2))
            continue
        m = ENC.match(line)
        if m and pending is not None:
            lines.append("%s %s" % (pending, m.group(1)))
            pending = None
            continue
        s = line.strip()
        if s.startswith("Function") or s.startswith(".headerflags") or \
                s.startswith("code for") or s.startswith(".target"):
            lines.append(s)
    return "\n".join(lines) + "\n"


def dump_one(k, a, tools, tmp):
    name, spec, args, env_over = k
    cuobjdump, nvdisasm = tools
    env = {key: v for key, v in os.environ.items() if not key.startswith("FLEXJIT_")}
    env.update(env_over)
    env["PATH"] = os.path.dirname(nvdisasm) + os.pathsep + env.get("PATH", "")
    work = os.path.join(tmp, name)
    os.makedirs(work)
    cubin = os.path.join(work, "k.cubin")
    r = subprocess.run([a.flexjit, "compile", os.path.join(a.examples, spec + ".lua")] +
                       args + ["--cache-dir", os.path.join(work, "cache"),
                               "--emit-cubin", cubin],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return name, "flexjit compile: " + (r.stderr or r.stdout).strip()[-300:]
    kname = re.search(r"^kernel\s+(\S+)", r.stdout, re.M)
    s = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True,
                       env=env)
    u = subprocess.run([cuobjdump, "-res-usage", cubin], capture_output=True, text=True,
                       env=env)
    if s.returncode != 0 or u.returncode != 0:
        return name, "cuobjdump: " + (s.stderr + u.stderr).strip()[:300]
    text = normalize(s.stdout, u.stdout)
    if text.count(" ; 0x") == 0:
        return name, "cuobjdump printed no instructions"
    with open(os.path.join(a.out, name + ".sass"), "w") as f:
        f.write("kernel %s\n" % (kname.group(1) if kname else "?"))
        f.write(text)
    return name, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="directory for the .sass files (created)")
    ap.add_argument("--flexjit", default=os.path.join(REPO, "build", "flexjit"))
    ap.add_argument("--examples", default=os.path.join(REPO, "examples"))
    ap.add_argument("--cuobjdump", default=None, help="default: $CUOBJDUMP, PATH")
    ap.add_argument("--nvdisasm", default=None, help="default: $NVDISASM, PATH")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default="", help="kernels whose file name contains this")
    a = ap.parse_args()
    cuobjdump = find_tool("cuobjdump", a.cuobjdump, "CUOBJDUMP")
    nvdisasm = find_tool("nvdisasm", a.nvdisasm, "NVDISASM")
    if cuobjdump is None or nvdisasm is None:
        print("sass_dump: no cuobjdump or nvdisasm (see --help)", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    todo = [k for k in kernels() if a.only in k[0]]
    failed = 0
    with tempfile.TemporaryDirectory(prefix="flexjit-sass-dump-") as tmp, \
            concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        for name, err in pool.map(lambda k: dump_one(k, a, (cuobjdump, nvdisasm), tmp),
                                  todo):
            if err:
                print("FAIL %s: %s" % (name, err))
                failed += 1
    print("sass_dump: %d kernel(s) written to %s%s" %
          (len(todo) - failed, a.out, ", %d failed" % failed if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
