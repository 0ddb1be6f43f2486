"""Checks what kernels/aot.py assumes of its one-program-per-SM variants: Triton's PTX for a
merge at MERGE_REGS_ONE differs from its 128-register PTX in the .maxnreg line alone, and ptxas
on the derived text (aot.at_cap) writes the cubin a full compile builds, byte for byte.

    env -u TRITON_INTERPRET python bench/aot_derived.py     # ~4 min on a cold Triton cache

Run it after a Triton upgrade: aot.main() derives those variants instead of compiling them
(~15 s each through Triton's pipeline, ~1 s through ptxas).
"""
import sys

from gpu_sampler.kernels import aot


def main():
    bad = 0
    for base in aot.MERGE_SPILL_BOUND:
        kernel, flags = aot.VARIANTS[base]
        cap = aot.VARIANTS[base + aot.ONE_PER_SM][1]["maxnreg"]
        full = aot.compile_variant(kernel, **dict(flags, maxnreg=cap))
        text = aot.at_cap(aot.compile_variant(kernel, **flags).asm["ptx"], cap)
        same_ptx = text == full.asm["ptx"]
        same_cubin = aot.run_ptxas(text)[1] == full.asm["cubin"]
        bad += not (same_ptx and same_cubin)
        print(f"{base}: PTX same {same_ptx}, cubin same {same_cubin}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
