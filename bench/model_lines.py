"""Where a modelled launch spends its instructions, by source line: runs a copy of
../shared/tools/gpu_model.py patched to print each launch's kept straight-line trace (the
instructions the model times, inlined loops repeated) counted by source line, innermost first.
A reading aid for the model's figures, not another model (docs/notes.md, twenty-seventh session).

    python bench/model_lines.py --project . --callable bench.model_call:sample_plan \
        --case '64,128256,0,{"plan_batch": 64, "row_kind": "sigma3", "top_p": 0.95}'

Every argument goes to gpu_model.py; the per-line table (45 lines a launch) goes to stderr
after the model's own report, each line "PERLINE <instructions> <file:line<caller...>".
"""
import os
import shutil
import subprocess
import sys
import tempfile

HOOK = "    return dict(P=P, res=res, occ=kern.ctas_per_sm(), cycles=cycles, by=by, cost=cost,"
PRINT = """    _lines = collections.Counter(short(d["st"]) if d["st"] else "-" for d in trace(None))
    print("PERLINE launch", file=sys.stderr)
    for _k, _v in _lines.most_common(45):
        print(f"PERLINE {_v:6d} {_k}", file=sys.stderr)
"""


def main(argv):
    tools = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "tools")
    with tempfile.TemporaryDirectory() as d:
        for f in os.listdir(tools):
            if f.startswith("gpu_model") and f.endswith(".py"):
                shutil.copy(os.path.join(tools, f), d)
        path = os.path.join(d, "gpu_model.py")
        src = open(path).read()
        if HOOK not in src:
            sys.exit("model_lines: gpu_model.py changed; its return line was not found")
        open(path, "w").write(src.replace(HOOK, PRINT + HOOK, 1))
        return subprocess.call([sys.executable, path] + argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
