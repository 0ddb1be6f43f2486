"""Compile the sampling kernels for a CUDA target on a machine without a GPU.

The Triton interpreter (how the kernel is tested on CPU) does not type-check like the compiler:
this runs the real pipeline (TTIR -> TTGIR -> LLVM -> PTX -> cubin with the ptxas that ships in
the triton wheel) for sm_90 and reports registers and spills. No driver is needed.

    python -m gpu_sampler.kernels.aot            # prints one line per variant
Must run without TRITON_INTERPRET=1 (the interpreter replaces @triton.jit functions).
"""
import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile

PTR = {"logits_ptr": "*fp32", "ids_ptr": "*i64", "plen_ptr": "*i64", "temp_ptr": "*fp32",
       "topk_ptr": "*i64", "topp_ptr": "*fp32", "minp_ptr": "*fp32", "rep_ptr": "*fp32",
       "pres_ptr": "*fp32", "freq_ptr": "*fp32", "seed_ptr": "*i64", "off_ptr": "*i64",
       "tok_ptr": "*i64", "logp_ptr": "*fp32", "probs_ptr": "*fp32", "edits_ptr": "*i32",
       "bnd_ptr": "*i32", "wf_ptr": "*fp32", "wi_ptr": "*i32", "cand_ptr": "*i64",
       "sf_ptr": "*fp32", "si_ptr": "*i32", "xs_ptr": "*fp32",
       "is_ptr": "*i32", "am_ptr": "*fp32", "la_ptr": "*fp32", "beta_ptr": "*fp32",
       "wc_ptr": "*fp32", "rf_ptr": "*fp32", "qf_ptr": "*fp32",
       "qi_ptr": "*i32", "x_ptr": "*i32", "bf_ptr": "*fp32", "bi_ptr": "*i32",
       "hb_ptr": "*i16", "ft_ptr": "*fp32", "boff_ptr": "*i32", "gf_ptr": "*fp32",
       "tab_ptr": "*i64", "gi_ptr": "*i32", "topw_ptr": "*i64", "rs_ptr": "*fp32",
       "lp_ptr": "*fp32", "sx_ptr": "*fp32", "sp_ptr": "*fp32", "spi_ptr": "*i64",
       "nl_ptr": "*i64", "q_ptr": "*fp32", "d_ptr": "*i64",
       "pf_ptr": "*fp32", "pi_ptr": "*i32", "pd_ptr": "*fp32", "cnt_ptr": "*i32"}
I64 = {"plen_s", "topk_s", "seed_s", "off_s"}
F32 = {"temp_s", "topp_s", "minp_s", "rep_s", "pres_s", "freq_s", "la_s", "beta_s"}
PER_ROW = dict(TEMP_T=True, TOPK_T=True, TOPP_T=True, MINP_T=True, REP_T=True, PRES_T=True,
               FREQ_T=True, PLEN_T=True, SEED_T=True, OFF_T=True, LA_T=True, BETA_T=True)
# the geometry the launcher picks for V = 128256 on a GPU (kernels.sampling.plan)
GEOM = dict(TILE=1024, E_BLOCK=32, KT=64, CB=1024, NT_P2=128, NPIV=8, MAX_ROUNDS=64,
            NWIN=8, D0_EXP=-2, L_BLOCK=256, NB=256, INV_W=16.0, LB_BLOCK=256, DIRTY_MAX=8)


def _kernel(name):
    from . import band, history, merge, residual, second, stats, topn
    return {"top_n": topn._top_n_kernel, "band_gather": band._band_gather_kernel,
            "band_finish": band._band_finish_kernel,
            "history": history._bucket_history_kernel, "stats": stats._stats_kernel,
            "merge": merge._merge_kernel, "write_probs": merge._write_probs_kernel,
            "gather": second._gather_kernel, "finish": second._finish_kernel,
            "residual": residual._residual_kernel,
            "residual_finish": residual._residual_finish}[name]


def compile_variant(kernel="merge", arch=90, num_warps=8, logits_dtype="fp32", maxnreg=None,
                    **flags):
    """Compile one constexpr variant of one kernel; returns the CompiledKernel (asm has 'ptx'
    and 'cubin'). Flags default to scalar parameters, top-k + top-p + repetition penalty."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("unset TRITON_INTERPRET to compile (the interpreter is active)")
    import triton
    from triton.backends.compiler import GPUTarget

    from . import launch
    from triton.compiler import ASTSource

    fn = _kernel(kernel)
    consts = {n: False for n in PER_ROW}
    consts.update(HAS_TOPK=True, HAS_TOPP=True, HAS_MINP=False, HAS_REP=True, HAS_PF=False,
                  HAS_MASK=False, HAS_BIAS=False, WRITE_PROBS=False, CD=False, TOPN_KB=0,
                  TOPN_RAW=True, TOPN_REUSE=False, STATE=False, KEEP_LIST=False, HDIRECT=False,
                  GREEDY=False, **GEOM)
    consts.update(flags)
    # as the launcher: pure-temperature draw partials in stage 1 for sampling launches without CD
    consts.setdefault("PURE_OK", not consts["CD"] and not consts["WRITE_PROBS"])
    # as the launcher (sampling._greedy_reads): a per-row T's greedy rows read as greedy blocks
    # in a call asking only tokens and logprobs
    consts.setdefault("GREEDY_ROWS", consts["GREEDY"] or (
        consts["TEMP_T"] and not consts["CD"] and not consts["WRITE_PROBS"]
        and not consts["TOPN_KB"] and not consts["STATE"] and not consts["KEEP_LIST"]))
    # as the launcher: the second read when a row can have min-p and no top-k / top-p (the
    # band gather runs it only where a variant says so: SECOND=True; its screened draw too)
    if kernel == "band_gather":
        consts.setdefault("SECOND", False)
    if kernel in ("band_gather", "gather", "merge"):
        consts.setdefault("SCREEN", False)
    if kernel == "gather":  # as the launcher: its last program of a row finishes the row
        consts.setdefault("FINISH", not consts["HAS_PF"])
        consts.setdefault("S_TAU", 1)
    consts.setdefault("SECOND", consts["TOPK_T"] or not consts["HAS_TOPK"])
    # as the launcher: the band read when a row can have top-p without top-k
    consts.setdefault("BANDS", consts["HAS_TOPP"] and (consts["TOPK_T"] or not consts["HAS_TOPK"])
                      and not consts["CD"] and not consts["WRITE_PROBS"])
    # as the launcher: stage 1 resets the merge's counts of second-read rows when there can be any
    consts.setdefault("SHARE", consts["SECOND"] or consts["BANDS"])
    if "R" in fn.arg_names:  # the launcher's scan width: the program's threads, at most TILE
        consts.setdefault("R", min(consts["TILE"], 32 * num_warps))
    options = {"num_warps": num_warps}
    if maxnreg is not None:  # as the launcher caps them (kernels.sampling.STATS_REGS / MERGE_REGS)
        options["maxnreg"] = maxnreg
    options.update(launch.exact_fp())  # as every launcher: no contraction (launch.py)
    sig, constexprs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in PTR:
            sig[name] = PTR[name] if name != "logits_ptr" else "*" + logits_dtype
        elif name in I64:
            sig[name] = "i64"
        elif name in F32:
            sig[name] = "fp32"
        elif name in consts:
            sig[name] = "constexpr"
            constexprs[(i,)] = consts[name]
        else:
            sig[name] = "i32"
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


# ptxas as Triton 3.9 runs it for the cubin it builds (backends/nvidia/compiler.py make_cubin,
# without debug): its register allocation level and no fmad (launch.exact_fp). Run bare, ptxas
# allocated otherwise: merge:mask+bias reported 16 spilled bytes where the launched cubin
# has 28 (thirty-sixth session).
PTXAS_FLAGS = ("-lineinfo", "--fmad=false", "-v", "--regAllocOptLevel=2")


def compile_logged(kernel, **flags):
    """(compile_variant's CompiledKernel, (registers, spill bytes, True) from the -v log of the
    ptxas run that built its cubin, or None where the cubin came from Triton's cache)."""
    try:
        from triton import knobs
        nv = knobs.nvidia
        before = nv.dump_ptxas_log
    except (ImportError, AttributeError):  # a Triton without the knob: ptxas_usage's rerun
        return compile_variant(kernel, **flags), None
    buf = io.StringIO()
    nv.dump_ptxas_log = True  # Triton prints the log (make_cubin); not in its cache key
    try:
        with contextlib.redirect_stdout(buf):
            ck = compile_variant(kernel, **flags)
    finally:
        nv.dump_ptxas_log = before
    return ck, _usage(buf.getvalue(), True)


def _usage(log, same):
    m = re.search(r"Used (\d+) registers", log)
    s = re.search(r"(\d+) bytes spill stores", log)
    return (int(m.group(1)), int(s.group(1)) if s else 0, same) if m else None


def ptxas_usage(ptx, cubin=None, arch=90):
    """(registers, spill bytes, same) from ptxas -v with Triton's flags; same: whether the
    cubin ptxas wrote is the given one, byte for byte (None without one), so that the usage
    reported is the launched cubin's. None when no ptxas that reads this PTX exists."""
    got = run_ptxas(ptx, arch)
    if got is None:
        return None
    log, built = got
    return _usage(log, None if cubin is None else built == cubin)


def run_ptxas(ptx, arch=90):
    """(ptxas -v log, cubin bytes) of the wheel's ptxas with Triton's flags, or None."""
    import triton
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    for exe in ("ptxas-blackwell", "ptxas"):  # Triton's choice for sm_90 and above
        path = os.path.join(bindir, exe)
        if not os.path.exists(path):
            path = shutil.which(exe)
        if not path:
            continue
        with tempfile.TemporaryDirectory() as d:
            src, out = os.path.join(d, "k.ptx"), os.path.join(d, "k.o")
            open(src, "w").write(ptx)
            r = subprocess.run([path, *PTXAS_FLAGS, f"--gpu-name=sm_{arch}a", src, "-o", out],
                               capture_output=True, text=True)
            if _usage(r.stderr, None):
                return r.stderr, open(out, "rb").read()
    return None


def at_cap(ptx, maxnreg):
    """The same PTX under another register cap: Triton's PTX differs between caps only in its
    .maxnreg line (every merge at 128 and 168, compared in the thirty-sixth session), so a
    variant at another cap needs only ptxas, not Triton's ~15 s pipeline again."""
    return re.sub(r"^\.maxnreg \d+$", f".maxnreg {maxnreg}", ptx, count=1, flags=re.M)


# A row's list (candidates, band tokens) is stored by the lanes that compacted it and read back
# by the same program in other tiles, i.e. by other threads: a CTA barrier (bar.sync) must lie
# between. Without it an H200 read stale entries (bench/results/gpu-2026-11-26-h200), which
# the interpreter, running each op over the whole tile at once, cannot show.
LIST_PTRS = ("xs_ptr", "is_ptr", "sx_ptr", "si_ptr")
LIST_FILES = ("band.py", "merge.py")


def _list_lines(path, verb):
    with open(path) as f:
        return {i + 1 for i, ln in enumerate(f) if any(f"tl.{verb}({n} " in ln for n in LIST_PTRS)}


def unfenced_list_reads(ptx):
    """(file, line) of each ld.global of a list (LIST_PTRS) that follows, in the PTX's order, a
    st.global to a list with no bar.sync between. Text order stands in for program order: a
    list is filled by one loop and read by later ones."""
    # the source beside this module, not the PTX's path: Triton's cache keys on the source, so
    # a cached PTX may name another checkout's copy of the same file (since moved or removed)
    here = os.path.dirname(os.path.abspath(__file__))
    files = {i: os.path.join(here, os.path.basename(p))
             for i, p in re.findall(r'^\s*\.file\s+(\d+)\s+"([^"]+)"', ptx, re.M)
             if os.path.basename(p) in LIST_FILES}
    stores = {i: _list_lines(p, "store") for i, p in files.items()}
    loads = {i: _list_lines(p, "load") for i, p in files.items()}
    loc, pending, bad = None, False, []
    for ln in ptx.splitlines():
        m = re.match(r"\s*\.loc\s+(\d+)\s+(\d+)", ln)
        if m:
            loc = (m.group(1), int(m.group(2)))
        elif "bar.sync" in ln or "barrier.sync" in ln:
            pending = False
        elif loc and loc[0] in files and "st.global" in ln and loc[1] in stores[loc[0]]:
            pending = True
        elif pending and loc and loc[0] in files and "ld.global" in ln and loc[1] in loads[loc[0]]:
            bad.append((os.path.basename(files[loc[0]]), loc[1]))
    return sorted(set(bad))


def approx_divisions(ptx):
    """(file, line) of each approximate fp32 division in the PTX (div.full / div.approx):
    Triton's fp32 `/` compiles to div.full.f32 (within 2 ulps), so x = xp / T would not be
    the twin's correctly rounded quotient on a GPU (common._quotient); every division in the
    kernels is tl.math.div_rn (div.rn.f32) or a multiply by an exact constant."""
    files = dict(re.findall(r'^\s*\.file\s+(\d+)\s+"([^"]+)"', ptx, re.M))
    loc, bad = None, []
    for ln in ptx.splitlines():
        m = re.match(r"\s*\.loc\s+(\d+)\s+(\d+)", ln)
        if m:
            loc = (m.group(1), int(m.group(2)))
        elif re.search(r"\bdiv\.(full|approx)\.", ln):
            bad.append((os.path.basename(files.get(loc[0], "?")) if loc else "?",
                        loc[1] if loc else 0))
    return sorted(set(bad))


VARIANTS = {
    # name: (kernel, flags); the sampling path is history -> stats -> merge
    "history": ("history", dict(num_warps=8)),
    "history:long": ("history", dict(L_BLOCK=1024, num_warps=8)),  # L > 2048
    "stats:rep": ("stats", dict(num_warps=4, maxnreg=64)),
    # temperature alone (T 1.0): the pure draw loop and the candidates' loop
    "stats:pure": ("stats", dict(HAS_TOPK=False, HAS_TOPP=False, HAS_REP=False, num_warps=4,
                                 maxnreg=64)),
    # every row greedy (a scalar T = 0): each block's max and its first token as the block's
    # one candidate; no windows or slot scan (stats._block_greedy)
    "stats:greedy": ("stats", dict(GREEDY=True, PURE_OK=False, HAS_TOPK=False, HAS_TOPP=False,
                                   HAS_REP=False, num_warps=4, maxnreg=64)),
    "stats:greedy+per-row+pf+mask+bias": ("stats", dict(
        PER_ROW, TEMP_T=False, GREEDY=True, PURE_OK=False, HAS_PF=True, HAS_MASK=True,
        HAS_BIAS=True, num_warps=4, maxnreg=64)),
    # no history launch (sampling._direct_history): the blocks histogram the row's ids (L <= 256)
    "stats:rep direct": ("stats", dict(HDIRECT=True, E_BLOCK=256, num_warps=4, maxnreg=64)),
    "merge:topk+topp+rep direct": ("merge", dict(HDIRECT=True, E_BLOCK=256, maxnreg=192)),
    "stats:per-row+pf": ("stats", dict(PER_ROW, HAS_PF=True, num_warps=4, maxnreg=72)),
    # a request's token mask and logit bias, applied by the loader of every logits read
    "stats:mask+bias": ("stats", dict(PER_ROW, HAS_MASK=True, HAS_BIAS=True, num_warps=4,
                                      maxnreg=64)),
    "merge:mask+bias": ("merge", dict(PER_ROW, HAS_MASK=True, HAS_BIAS=True, maxnreg=128)),
    "stats:plain-bf16": ("stats", dict(HAS_REP=False, logits_dtype="bf16", num_warps=4,
                                       maxnreg=64)),
    "merge:topk+topp+rep": ("merge", dict(maxnreg=128)),
    "merge:per-row+minp+pf": ("merge", dict(PER_ROW, HAS_MINP=True, HAS_PF=True, maxnreg=128)),
    # with the second read's screen bound (the launcher's choice above SCREEN_PROGRAMS)
    "merge:per-row+minp+pf screened": ("merge", dict(PER_ROW, HAS_MINP=True, HAS_PF=True,
                                                     SCREEN=True, maxnreg=128)),
    "merge:plain-bf16": ("merge", dict(HAS_TOPK=False, HAS_TOPP=False, HAS_REP=False,
                                       logits_dtype="bf16", maxnreg=128)),
    "merge:distribution": ("merge", dict(WRITE_PROBS=True, HAS_MINP=True, maxnreg=128)),
    "write_probs": ("write_probs", dict(HAS_MINP=True, num_warps=4)),
    # the second read of rows the merge hands over (min-p alone, unproven pure temperature)
    "gather": ("gather", dict(PER_ROW, HAS_MINP=True, HAS_PF=True, S_ZF=2, NS=5,
                              num_warps=4, maxnreg=64)),
    # its screened draw (the launcher's choice above SCREEN_PROGRAMS programs: B >= 2 here)
    "gather:screened": ("gather", dict(PER_ROW, HAS_MINP=True, HAS_PF=True, S_ZF=2, NS=5,
                                       SCREEN=True, num_warps=4, maxnreg=64)),
    # per-row parameters without pres./freq.: the row's last program finishes it (FINISH)
    "gather:per-row+minp screened": ("gather", dict(PER_ROW, HAS_MINP=True, S_ZF=2, NS=5,
                                                    SCREEN=True, num_warps=4, maxnreg=64)),
    "gather:min-p screened": ("gather", dict(HAS_TOPK=False, HAS_TOPP=False, HAS_REP=False,
                                             HAS_MINP=True, S_ZF=2, NS=5, SCREEN=True,
                                             num_warps=4, maxnreg=64)),
    "finish": ("finish", dict(S_TAU=1, S_ZF=2, NS=5, num_warps=4, maxnreg=96)),
    "finish:distribution": ("finish", dict(S_TAU=1, S_ZF=2, NS=5, WRITE_PROBS=True,
                                           num_warps=4, maxnreg=96)),
    # the band read of top-p rows (no top-k) whose nucleus outgrew the candidates
    "stats:bands": ("stats", dict(HAS_TOPK=False, HAS_REP=False, num_warps=4, maxnreg=64)),
    "stats:bands+per-row+pf": ("stats", dict(PER_ROW, HAS_PF=True, HAS_MINP=True, num_warps=4,
                                             maxnreg=72)),
    "merge:bands": ("merge", dict(HAS_TOPK=False, HAS_REP=False, maxnreg=128)),
    # the gather as the launcher caps it (sampling._gather_regs): 64, 96 with pres./freq., 80
    # with the second read's gather; its draw screened (more programs than SMs: B >= 2 here)
    # but for the one-program-a-block launch of B = 1
    "band_gather:plain": ("band_gather", dict(HAS_TOPK=False, HAS_REP=False, SCREEN=True,
                                              num_warps=4, maxnreg=64)),
    "band_gather:plain unscreened": ("band_gather", dict(HAS_TOPK=False, HAS_REP=False,
                                                         num_warps=4, maxnreg=64)),
    "band_gather": ("band_gather", dict(PER_ROW, HAS_MINP=True, HAS_PF=True, SCREEN=True,
                                        num_warps=4, maxnreg=96)),
    # both hand-overs in one launch: the band gather runs the second read's gather too
    "band_gather:per-row+minp+second": ("band_gather", dict(PER_ROW, HAS_MINP=True,
                                                            HAS_REP=False, SECOND=True,
                                                            SCREEN=True,
                                                            num_warps=4, maxnreg=80)),
    "band_gather:per-row+minp+pf+second": ("band_gather", dict(PER_ROW, HAS_MINP=True,
                                                               HAS_PF=True, SECOND=True,
                                                               SCREEN=True,
                                                               num_warps=4, maxnreg=96)),
    "band_finish": ("band_finish", dict(PER_ROW, HAS_MINP=True, HAS_PF=True, CB=512,
                                        SB2=256, NPIV2=16, FP=16, SEG=64, SECOND=False,
                                        maxnreg=128)),
    # also the second read's finish (a call with both hand-overs: per-row parameters)
    "band_finish:second": ("band_finish", dict(PER_ROW, HAS_MINP=True, HAS_PF=True, CB=512,
                                               SB2=256, NPIV2=16, FP=16, SEG=64, SECOND=True,
                                               maxnreg=128)),
    # top-N logprobs from the one read (kernels/topn.py): raw (64 windowed candidates a
    # block), processed N = 20 (32 keys a block) and N = 64
    "stats:top-n raw": ("stats", dict(TOPN_KB=64, num_warps=4, maxnreg=128)),
    "stats:top-n raw+per-row+pf+mask+bias": ("stats", dict(PER_ROW, HAS_PF=True, HAS_MASK=True,
                                                           HAS_BIAS=True, TOPN_KB=64,
                                                           num_warps=4, maxnreg=128)),
    "stats:top-n processed+mask+bias": ("stats", dict(PER_ROW, HAS_MASK=True, HAS_BIAS=True,
                                                      TOPN_KB=32, TOPN_RAW=False, num_warps=4,
                                                      maxnreg=128)),
    "merge:state": ("merge", dict(PER_ROW, HAS_MINP=True, HAS_PF=True, STATE=True,
                                  maxnreg=192)),
    "merge:state+mask+bias": ("merge", dict(PER_ROW, HAS_MASK=True, HAS_BIAS=True, STATE=True,
                                            maxnreg=192)),
    "finish:state": ("finish", dict(S_TAU=1, S_ZF=2, NS=5, STATE=True, num_warps=4,
                                    maxnreg=96)),
    "stats:top-n raw reuse": ("stats", dict(HAS_REP=False, PURE_OK=False, TOPN_KB=64,
                                            TOPN_REUSE=True, num_warps=4, maxnreg=64)),
    "stats:top-n raw reuse+per-row": ("stats", dict(PER_ROW, HAS_REP=False, PURE_OK=False,
                                                    TOPN_KB=64, TOPN_REUSE=True, num_warps=4,
                                                    maxnreg=72)),
    "top_n:raw": ("top_n", dict(RAW=True, KB=64, NSEL=32, GB=32, CB=512, num_warps=8)),
    "top_n:processed 64": ("top_n", dict(PER_ROW, RAW=False, HAS_MINP=True, KB=64, NSEL=64,
                                         CB=512, GB=32, num_warps=8)),
    # contrastive decoding fused in (amateur logits, per-row cd_alpha / cd_beta)
    "stats:cd": ("stats", dict(CD=True, LA_T=True, BETA_T=True, num_warps=4, maxnreg=64)),
    "merge:cd": ("merge", dict(CD=True, LA_T=True, BETA_T=True, maxnreg=128)),
    "write_probs:cd": ("write_probs", dict(CD=True, HAS_MINP=True, num_warps=4)),
    # speculative verification against draft distributions (kernels/residual.py)
    "merge:residual": ("merge", dict(WRITE_PROBS=True, KEEP_LIST=True, maxnreg=128)),
    "residual:solo": ("residual", dict(SOLO=True, LB=256, num_warps=8, maxnreg=80)),
    "residual:per-row+minp+pf": ("residual", dict(PER_ROW, HAS_MINP=True, HAS_PF=True,
                                                  SOLO=False, LB=256, num_warps=8,
                                                  maxnreg=80)),
    "residual_finish": ("residual_finish", dict(num_warps=4)),
}

# The bytes ptxas spills in the cubin Triton builds (PTXAS_FLAGS), where not 0: the bound each
# variant may not pass (tests/test_aot_compile.py). Until the thirty-sixth session ptxas was
# run here without Triton's flags and reported only the first four merges (4-16 bytes); with
# its --regAllocOptLevel=2 seventeen variants spill. Where (nvdisasm -g: STL / LDL by line):
# row-uniform values held across a block loop and reloaded once a block (stats.py's block
# loop, band.py's, second.py's row share), not per token. The merges spill at their 128 cap
# only (two programs per SM: launched past one row an SM, sampling._merge_regs); at most one
# row an SM the launcher gives them MERGE_REGS_ONE, where they compile without a spill
# (" one per SM").
MERGE_SPILL_BOUND = {"merge:mask+bias": 28, "merge:topk+topp+rep": 8,
                     "merge:per-row+minp+pf": 12, "merge:per-row+minp+pf screened": 12,
                     "merge:distribution": 16, "merge:cd": 16, "merge:residual": 4}
SPILL_BOUND = dict(MERGE_SPILL_BOUND, **{
    "stats:mask+bias": 16, "stats:per-row+pf": 4, "stats:greedy+per-row+pf+mask+bias": 8,
    "stats:bands+per-row+pf": 4, "gather:screened": 8, "gather:min-p screened": 16,
    "band_gather": 8, "band_gather:per-row+minp+pf+second": 8, "band_finish:second": 8,
    "top_n:raw": 8})
ONE_PER_SM = " one per SM"  # main() takes such a variant's PTX from its base variant (at_cap)
VARIANTS.update({name + ONE_PER_SM: (VARIANTS[name][0], dict(VARIANTS[name][1], maxnreg=168))
                 for name in MERGE_SPILL_BOUND})  # 168: sampling.MERGE_REGS_ONE (tested)


def main(argv=None):
    names = (argv if argv is not None else sys.argv[1:]) or list(VARIANTS)
    ptx = {}
    for name in names:
        base = name[:-len(ONE_PER_SM)] if name.endswith(ONE_PER_SM) else None
        if base in ptx:  # the base variant's PTX at MERGE_REGS_ONE: ptxas alone
            text = at_cap(ptx[base], VARIANTS[name][1]["maxnreg"])
            log, cubin = run_ptxas(text)
            print(_report(name, text, len(cubin), _usage(log, True)))
            continue
        kernel, flags = VARIANTS[name]
        # the log of the compile itself (a cold cache, as CI's), else ptxas run again here
        ck, usage = compile_logged(kernel, **flags)
        usage = usage or ptxas_usage(ck.asm["ptx"], ck.asm["cubin"])
        ptx[name] = ck.asm["ptx"]
        print(_report(name, ck.asm["ptx"], len(ck.asm["cubin"]), usage))


def _report(name, ptx, cubin_bytes, usage):
    extra = "ptxas -v unavailable"
    if usage:
        built = "" if usage[2] else "; NOT THE BUILT CUBIN (ptxas flags differ)"
        extra = f"{usage[0]} registers, {usage[1]} bytes spilled{built}"
    racy = unfenced_list_reads(ptx)
    fence = "; list reads fenced" if not racy else f"; UNFENCED list reads at {racy}"
    approx = approx_divisions(ptx)
    div = "; divisions exact" if not approx else f"; APPROX divisions at {approx}"
    return f"{name}: sm_90 cubin {cubin_bytes} bytes; {extra}{fence}{div}"


if __name__ == "__main__":
    main()
