"""Precompiling kernels for deployment, through the package's `flexjit` command
(the wheel ships it beside the library: flexjit/bin/flexjit)."""
import os
import shutil
import subprocess
import tempfile
from typing import Iterable, Optional, Sequence, Union

from ._runtime import FlexjitError
from .spec import Spec


def cli_path() -> str:
    """The `flexjit` command: $FLEXJIT_CLI, else the package's, else PATH's."""
    env = os.environ.get("FLEXJIT_CLI")
    if env:
        return env
    own = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "flexjit")
    if os.path.exists(own):
        return own
    found = shutil.which("flexjit")
    if not found:
        raise FlexjitError("the flexjit command was not found (not in the package, "
                           "$FLEXJIT_CLI or PATH)")
    return found


def _lua_list(items):
    return "{" + ", ".join(repr(x) if isinstance(x, int) else '"%s"' % x for x in items) + "}"


def precompile(manifest: Union[str, os.PathLike, Sequence[Union[Spec, str]]],
               out: Union[str, os.PathLike], *, jobs: Optional[int] = None,
               head_dims: Iterable[int] = (64, 128), dtypes: Iterable[str] = ("bf16",),
               archs: Iterable[str] = ("sm_80", "sm_90a"),
               passes: Iterable[str] = ("forward",), verbose: bool = False) -> str:
    """Compiles every kernel a deployment needs into `out`: a .fjpack file
    (one file, mounted with flexjit.mount_pack or $FLEXJIT_PACKS; no NVRTC
    needed where it runs) or a cache directory (ship it as
    $FLEXJIT_CACHE_DIR). Needs no GPU.

    `manifest` is a manifest file (`flexjit precompile --help`,
    examples/manifest.lua), or a list of Specs and spec paths, for which one
    is written from head_dims x dtypes x archs x passes (passes: "forward",
    "forward_blockmask", "forward_varlen" (the serving layouts' variant),
    "blockmask", "backward", "backward_deterministic", "backward_varlen"
    (packed batches), "decode": what launches of 1 to 16 query tokens run).
    Returns `out`; a failure raises FlexjitError with the command's
    messages."""
    out = os.fspath(out)
    with tempfile.TemporaryDirectory(prefix="flexjit-manifest-") as tmp:
        if isinstance(manifest, (str, os.PathLike)):
            path = os.fspath(manifest)
        else:
            names = []
            for i, s in enumerate(manifest):
                if not isinstance(s, Spec):
                    s = Spec(s)
                name = f"spec{i}.lua"
                with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
                    f.write(s.source)
                names.append(name)
            path = os.path.join(tmp, "manifest.lua")
            with open(path, "w", encoding="utf-8") as f:
                f.write("return {\n  specs = %s,\n  head_dims = %s,\n  dtypes = %s,\n"
                        "  archs = %s,\n  passes = %s,\n}\n" % (
                            _lua_list(names), _lua_list(list(head_dims)),
                            _lua_list(list(dtypes)), _lua_list(list(archs)),
                            _lua_list(list(passes))))
        cmd = [cli_path(), "precompile", path, "--out", out]
        if jobs:
            cmd += ["-j", str(int(jobs))]
        if verbose:
            cmd.append("--verbose")
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise FlexjitError((r.stderr or r.stdout).strip() or
                               f"flexjit precompile exited with {r.returncode}")
        if verbose and r.stdout:
            print(r.stdout, end="")
    return out
