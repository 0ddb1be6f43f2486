"""Where a modelled launch spends its instructions and its cycles, by source line: runs a copy of
../shared/tools/gpu_model.py patched to print each launch's kept straight-line trace (the
instructions the model times, inlined loops repeated) counted by source line, innermost first,
and, for the same trace's cold pass, the cycles warp 0 waited before issuing each instruction
(its issue time minus the previous one's), summed by the waiting instruction's line: where a
latency-bound program (the merge, one program per row) stalls. A reading aid for the model's
figures, not another model (docs/notes.md, twenty-seventh and twenty-eighth sessions).

    python bench/model_lines.py --project . --callable bench.model_call:sample_plan \
        --case '64,128256,0,{"plan_batch": 64, "row_kind": "sigma3", "top_p": 0.95}'

Every argument goes to gpu_model.py; the per-line tables (45 lines a launch each) go to stderr
after the model's own report: "PERLINE <instructions> <file:line<caller...>" and
"PERCYC <cycles> <instructions> <file:line<caller...>".
"""
import os
import shutil
import subprocess
import sys
import tempfile

HOOK = "    return dict(P=P, res=res, occ=kern.ctas_per_sm(), cycles=cycles, by=by, cost=cost,"
PRINT = """    _tr = trace(None)
    _lines = collections.Counter(short(d["st"]) if d["st"] else "-" for d in _tr)
    print("PERLINE launch", file=sys.stderr)
    for _k, _v in _lines.most_common(45):
        print(f"PERLINE {_v:6d} {_k}", file=sys.stderr)
    S._SIM.clear()
    S.REC = []
    S.simulate(_tr, 1, nw, kern.warps)
    _cyc, _prev = collections.Counter(), 0
    for _pc, _t in S.REC:
        _cyc[short(_tr[_pc]["st"]) if _tr[_pc]["st"] else "-"] += _t - _prev
        _prev = _t
    S.REC = None
    print(f"PERCYC launch (warp 0 issues its last instruction at cycle {_prev:.0f})", file=sys.stderr)
    for _k, _v in _cyc.most_common(45):
        print(f"PERCYC {_v:6.0f} {_lines[_k]:6d} {_k}", file=sys.stderr)
"""
# warp 0's issue times in a cold pass (simulate's one-issue bookkeeping line)
SIM_HOOK = '                w["t"], w["pc"], issued, last[s] = t + max(1, d["stall"]), w["pc"] + 1, True, i'
SIM_REC = ('                if REC is not None and i == 0 and iters == 1:\n'
           '                    REC.append((w["pc"] % n, st))\n')


def _patch(path, old, new):
    src = open(path).read()
    if old not in src:
        sys.exit(f"model_lines: {os.path.basename(path)} changed; a patched line was not found")
    open(path, "w").write(src.replace(old, new, 1))


def main(argv):
    tools = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "tools")
    with tempfile.TemporaryDirectory() as d:
        for f in os.listdir(tools):
            if f.startswith("gpu_model") and f.endswith(".py"):
                shutil.copy(os.path.join(tools, f), d)
        _patch(os.path.join(d, "gpu_model.py"), HOOK, PRINT + HOOK)
        sim = os.path.join(d, "gpu_model_sass.py")
        _patch(sim, SIM_HOOK, SIM_REC + SIM_HOOK)
        _patch(sim, "def simulate(", "REC = None\n\n\ndef simulate(")
        return subprocess.call([sys.executable, os.path.join(d, "gpu_model.py")] + argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
