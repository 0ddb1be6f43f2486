"""Turn a pytest-benchmark JSON into a Markdown ratio table and a latency plot.

    python bench/report.py bench/results/cpu-2026-01-01.json
    -> bench/results/cpu-2026-01-01.md, bench/results/cpu-2026-01-01.png

Each benchmark's provider (gpu_sampler, hf, hf_static, naive, ...) comes from its params,
its extra_info, or a dash/underscore-separated part of its parametrize id. Benchmarks that
differ only in the provider form one case (keyed by group + test function + the id without the
provider part); the table shows each provider's median and the ratio other/gpu_sampler (> 1:
gpu_sampler is faster). The plot shows median latency against batch x vocab, one line per
provider and variant, log-log.
"""
import json
import re
import sys
from collections import OrderedDict
from pathlib import Path

REFERENCE = "gpu_sampler"
KNOWN_PROVIDERS = ("gpu_sampler", "hf_static", "hf", "naive", "torch", "triton", "flashinfer",
                   "vllm")
_SIZE_KEYS = {"batch": "B", "b": "B", "B": "B", "batch_size": "B",
              "vocab": "V", "v": "V", "V": "V", "vocab_size": "V"}


def _split_name(name):
    """'test_x[a-b-c]' -> ('test_x', 'a-b-c')."""
    m = re.match(r"^([^\[]+)(?:\[(.*)\])?$", name)
    return (m.group(1), m.group(2) or "") if m else (name, "")


def _provider(bench):
    for src in (bench.get("params") or {}, bench.get("extra_info") or {}):
        if isinstance(src.get("provider"), str):
            return src["provider"]
    _, pid = _split_name(bench.get("name", ""))
    parts = pid.split("-")
    for known in KNOWN_PROVIDERS:  # longest names first where one prefixes another
        if known in parts:
            return known
    return "?"


def _without_provider(pid, provider):
    parts = [p for p in pid.split("-") if p != provider]
    return "-".join(parts)


def _size(bench):
    """(B, V) from params / extra_info / the id, or None."""
    found = {}
    for src in (bench.get("extra_info") or {}, bench.get("params") or {}):
        for k, v in src.items():
            if k in _SIZE_KEYS and isinstance(v, (int, float)) and _SIZE_KEYS[k] not in found:
                found[_SIZE_KEYS[k]] = int(v)
            if k == "shape" and "B" not in found:
                nums = [int(x) for x in re.findall(r"\d+", str(v))]
                if len(nums) >= 2:
                    found["B"], found["V"] = nums[0], nums[-1]
    if "B" in found and "V" in found:
        return found["B"], found["V"]
    _, pid = _split_name(bench.get("name", ""))
    m = re.search(r"(\d+)\s*[x,]\s*(\d+)", pid)
    if m:
        return int(m.group(1)), int(m.group(2))
    b = re.search(r"(?:^|[-_])b(\d+)(?:$|[-_])", pid)
    v = re.search(r"(?:^|[-_])v(\d+)(?:$|[-_])", pid)
    if b and v:
        return int(b.group(1)), int(v.group(1))
    return None


def _variant(case_id, size):
    """The case id without its size parts: what distinguishes lines at the same size."""
    parts = [p for p in case_id.split("-") if p]
    if size is not None:
        nums = {str(size[0]), str(size[1])}
        parts = [p for p in parts if not (re.fullmatch(r"[bBvV]?\d+", p) and
                                          re.sub(r"\D", "", p) in nums)
                 and not re.fullmatch(r"\d+x\d+", p)]
    return "-".join(parts)


def load_cases(data):
    """Group benchmarks into cases.

    Args:
        data: the parsed pytest-benchmark JSON (dict with "benchmarks").

    Returns:
        OrderedDict case name -> {"providers": {provider: median seconds},
        "size": (B, V) or None, "func": test function, "variant": str, "extra": {provider:
        extra_info}}, in the file's order.
    """
    cases = OrderedDict()
    for b in data.get("benchmarks", []):
        stats = b.get("stats") or {}
        if "median" not in stats:
            continue
        prov = _provider(b)
        func, pid = _split_name(b.get("name", "?"))
        case_id = _without_provider(pid, prov)
        group = b.get("group")
        key = func + (f"[{case_id}]" if case_id else "")
        size = _size(b)
        c = cases.setdefault(key, {"providers": {}, "size": size, "func": func, "group": group,
                                   "variant": _variant(case_id, size), "extra": {}})
        c["providers"][prov] = float(stats["median"])
        c["extra"][prov] = b.get("extra_info") or {}
    # A group that holds exactly one case (suites that set group = case) is the shorter name;
    # a group shared by several cases only prefixes them.
    per_group = {}
    for key, c in cases.items():
        per_group.setdefault(c["group"], []).append(key)
    named = OrderedDict()
    for key, c in cases.items():
        g = c["group"]
        if g and len(per_group[g]) == 1 and g not in named:
            named[g] = c
        else:
            named[f"{g}: {key}" if g else key] = c
    return named


def _fmt_time(s):
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def providers_of(cases):
    seen = []
    for c in cases.values():
        for p in c["providers"]:
            if p not in seen:
                seen.append(p)
    # gpu_sampler first, then the others in first-seen order
    return sorted(seen, key=lambda p: (p != REFERENCE, seen.index(p)))


def markdown(data, cases):
    """The report as Markdown text."""
    provs = providers_of(cases)
    others = [p for p in provs if p != REFERENCE]
    mi = data.get("machine_info") or {}
    ci = data.get("commit_info") or {}
    cpu = (mi.get("cpu") or {}).get("brand_raw") or mi.get("processor") or "?"
    lines = ["# Benchmark report", ""]
    lines.append(f"- date: {data.get('datetime', '?')}")
    lines.append(f"- machine: {mi.get('node', '?')}, {cpu}, python {mi.get('python_version', '?')}")
    if ci.get("id"):
        lines.append(f"- commit: {ci['id'][:12]}{' (dirty)' if ci.get('dirty') else ''}")
    devices = sorted({str(e.get("device")) for c in cases.values() for e in c["extra"].values()
                      if e.get("device")})
    if devices:
        lines.append(f"- device: {', '.join(devices)}")
    lines += ["- medians; ratio = other provider's median / gpu_sampler's (> 1: gpu_sampler is "
              "faster)", ""]
    head = ["case"] + [f"{p} median" for p in provs] + [f"{p}/{REFERENCE}" for p in others]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|")
    for name, c in cases.items():
        row = [name.replace("|", "/")]
        for p in provs:
            row.append(_fmt_time(c["providers"][p]) if p in c["providers"] else "–")
        ref = c["providers"].get(REFERENCE)
        for p in others:
            v = c["providers"].get(p)
            row.append(f"{v / ref:.2f}x" if v is not None and ref else "–")
        lines.append("| " + " | ".join(row) + " |")
    tps = [(n, p, e["tokens_per_s"]) for n, c in cases.items() for p, e in c["extra"].items()
           if isinstance(e.get("tokens_per_s"), (int, float))]
    if tps:
        lines += ["", "tokens/s (from extra_info):", "",
                  "| case | " + " | ".join(provs) + " |",
                  "|" + "|".join(["---"] + ["---:"] * len(provs)) + "|"]
        by_case = OrderedDict()
        for n, p, v in tps:
            by_case.setdefault(n, {})[p] = v
        for n, d in by_case.items():
            lines.append("| " + n + " | " + " | ".join(
                f"{d[p]:.0f}" if p in d else "–" for p in provs) + " |")
    return "\n".join(lines) + "\n"


def plot(cases, path, title="median latency vs batch x vocab"):
    """Log-log PNG: one panel per test function, one line per provider (and variant)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    funcs = []
    for c in cases.values():
        if c["size"] is not None and c["func"] not in funcs:
            funcs.append(c["func"])
    fig, axes = plt.subplots(1, max(1, len(funcs)), figsize=(6.4 * max(1, len(funcs)), 4.4),
                             squeeze=False)
    for ax, func in zip(axes[0], funcs):
        series = OrderedDict()
        for c in cases.values():
            if c["func"] != func or c["size"] is None:
                continue
            x = c["size"][0] * c["size"][1]
            for p, s in c["providers"].items():
                label = p + (f" ({c['variant']})" if c["variant"] else "")
                series.setdefault(label, []).append((x, s * 1e3))
        for label, pts in series.items():
            pts.sort()
            style = "s-" if label.startswith(REFERENCE) else "o--"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label, markersize=4)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("batch x vocab")
        ax.set_ylabel("median ms")
        ax.set_title(func)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    if not funcs:
        axes[0][0].text(0.5, 0.5, "no (batch, vocab) found in the benchmark params",
                        ha="center", va="center")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def write_report(json_path):
    """Write ``<stem>.md`` and ``<stem>.png`` beside ``json_path``; return their Paths."""
    json_path = Path(json_path)
    data = json.loads(json_path.read_text())
    cases = load_cases(data)
    md = json_path.with_suffix(".md")
    png = json_path.with_suffix(".png")
    md.write_text(markdown(data, cases))
    plot(cases, png, title=f"{json_path.stem}: median latency vs batch x vocab")
    return md, png


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print("usage: python bench/report.py RESULTS.json", file=sys.stderr)
        return 2
    p = Path(argv[0])
    if not p.is_file():
        print(f"report.py: error: no such file: {p}", file=sys.stderr)
        return 2
    try:
        md, png = write_report(p)
    except (ValueError, KeyError) as e:
        print(f"report.py: error: {p} is not a pytest-benchmark JSON ({e})", file=sys.stderr)
        return 2
    print(md.read_text())
    print(f"wrote {md} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
