"""SASS instructions of one sm_90 kernel variant (kernels/aot.py's VARIANTS), by source line:
nvdisasm's line info (innermost file:line) of the cubin aot.compile_variant builds. A static
count (every instruction once, branches included), for where a kernel's code goes; the GPU
model (../shared/tools/gpu_model.py) weighs it by what runs.

    python bench/sass_lines.py band_gather:plain              # the top 40 lines
    python bench/sass_lines.py band_gather:plain --top 0 --sass /tmp/bg.sass
    python bench/sass_lines.py stats:bands --project /tmp/old_checkout
"""
import argparse
import collections
import importlib
import os
import re
import subprocess
import sys
import tempfile


def lines(project, variant):
    """(total instructions, Counter of (file, line) -> instructions, the nvdisasm text)."""
    os.environ.pop("TRITON_INTERPRET", None)
    if project:
        sys.path.insert(0, os.path.abspath(project))
        aot = importlib.import_module("kernels.aot")
    else:
        from gpu_sampler.kernels import aot
    import triton
    kernel, flags = aot.VARIANTS[variant]
    ck = aot.compile_variant(kernel, **flags)
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                            "nvdisasm")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        open(path, "wb").write(ck.asm["cubin"])
        text = subprocess.run([nvdisasm, "-g", "-c", path], capture_output=True, text=True,
                              check=True).stdout
    where, count, total = None, collections.Counter(), 0
    for ln in text.splitlines():
        m = re.search(r'//## File "([^"]+)", line (\d+)', ln)
        if m:
            where = (os.path.basename(m.group(1)), int(m.group(2)))
        elif re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+\S", ln):
            total += 1
            count[where] += 1
    return total, count, text


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("variant")
    ap.add_argument("--project", default=None, help="another checkout (its kernels/ folder)")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--sass", default=None, help="also write the nvdisasm text here")
    a = ap.parse_args(argv)
    total, count, text = lines(a.project, a.variant)
    if a.sass:
        open(a.sass, "w").write(text)
    print(f"{a.variant}: {total} SASS instructions")
    for (f, n), c in count.most_common(a.top or None):
        print(f"{c:6d}  {f}:{n}")


if __name__ == "__main__":
    main()
