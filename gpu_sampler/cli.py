"""The ``gpu-sampler`` command: ``demo``, ``generate`` and ``bench``.

    gpu-sampler demo [--model DIR] [--device cpu|cuda] [--out DIR]
    gpu-sampler generate --model DIR --prompt TEXT [--max-new-tokens N] [--temperature T]
                         [--top-k K] [--top-p P] [--min-p M] [--repetition-penalty R]
                         [--seed S] [--greedy] [--device D] [--trust-remote-code]
    gpu-sampler bench [--device cpu|cuda] [--quick] [--out DIR]

Generation numbers not given on the command line come from the model folder's
generation_config.json when it sets them (as ``model.generate`` reads it), else from the defaults
shown in ``--help``.

User errors (missing or invalid model folder, CUDA asked for but absent, bad parameter values)
print one line ``gpu-sampler: error: ...`` to stderr and exit with status 2.
"""
import argparse
import datetime
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

EXIT_USAGE = 2
REPO = Path(__file__).resolve().parents[1]


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


def _fail(msg):
    print(f"gpu-sampler: error: {' '.join(str(msg).split())}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors, like every other user error of this command."""

    def error(self, message):
        print(f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)",
              file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _positive_int(name):
    def parse(s):
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {s!r}") from None
        if v < 1:
            raise argparse.ArgumentTypeError(f"{name} must be >= 1, got {v}")
        return v
    return parse


def _parser():
    ap = _Parser(prog="gpu-sampler",
                 description="Fused LLM token sampling: demo, generate, bench.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="{demo,generate,bench}")

    d = sub.add_parser("demo", help="greedy/sampling generate comparison, sampler table, plot")
    d.add_argument("--model", metavar="DIR", help="model folder (default: embedded tiny Llama)")
    d.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    d.add_argument("--out", metavar="DIR", default="gpu-sampler-demo",
                   help="folder for the plot (default: ./gpu-sampler-demo)")

    g = sub.add_parser("generate", help="stream text from a model with gpu_sampler.generate")
    g.add_argument("--model", metavar="DIR", required=True, help="model folder")
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-new-tokens", type=_positive_int("--max-new-tokens"), default=None,
                   help="default: the model's generation_config, else 64")
    g.add_argument("--temperature", type=float, default=None,
                   help="0 means greedy (default: the model's generation_config, else 0.7)")
    g.add_argument("--top-k", type=int, default=None,
                   help="0 = off (default: the model's generation_config, else 50)")
    g.add_argument("--top-p", type=float, default=None,
                   help="1.0 = off (default: the model's generation_config, else 0.9)")
    g.add_argument("--min-p", type=float, default=None,
                   help="0 = off (default: the model's generation_config, else 0)")
    g.add_argument("--repetition-penalty", type=float, default=None,
                   help="applies to greedy decoding too, as in transformers (default: the "
                        "model's generation_config, else 1.0)")
    g.add_argument("--seed", type=int, default=None,
                   help="per-row seeded draws (reproducible on any device)")
    g.add_argument("--greedy", action="store_true", help="argmax decoding")
    g.add_argument("--device", default="cpu")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="allow the model folder's own Python code to run")

    b = sub.add_parser("bench", help="run the pytest-benchmark suites in bench/ and report")
    b.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    b.add_argument("--quick", action="store_true", help="small sizes (GPU_SAMPLER_BENCH_QUICK=1)")
    b.add_argument("--out", metavar="DIR", default=None,
                   help="results folder (default: bench/results in the source tree)")
    return ap


def _cmd_demo(args):
    from . import demo
    demo.run_demo(args.model, device=args.device, out_dir=args.out)


# The command's own defaults, used for what neither the command line nor the model's
# generation_config.json sets (a value the folder sets wins, as in transformers).
CLI_DEFAULTS = dict(max_new_tokens=64, temperature=0.7, top_k=50, top_p=0.9, min_p=0.0,
                    repetition_penalty=1.0)
_SAMPLING = ("temperature", "top_k", "top_p", "min_p")


def _given(args):
    """The generation numbers given on the command line (None = not given)."""
    return {n: getattr(args, n) for n in CLI_DEFAULTS if getattr(args, n) is not None}


def _sampling_kwargs(args, generation_config=None):
    """generate() keyword arguments, merged as transformers merges them: a flag given on the
    command line wins, then what the model folder's generation_config sets (left to generate(),
    which reads it as model.generate does), then CLI_DEFAULTS. Sampling unless --greedy or
    --temperature 0; --repetition-penalty applies to greedy decoding too."""
    given = _given(args)
    set_by_model = set() if generation_config is None else set(generation_config.to_diff_dict())

    def pick(name, kw):
        if name in given:
            kw[name] = given[name]
        elif name not in set_by_model:
            kw[name] = CLI_DEFAULTS[name]

    kw = {}
    if "max_new_tokens" in given or not set_by_model & {"max_new_tokens", "max_length"}:
        kw["max_new_tokens"] = given.get("max_new_tokens", CLI_DEFAULTS["max_new_tokens"])
    if "repetition_penalty" in given:  # transformers applies it when greedy too
        kw["repetition_penalty"] = given["repetition_penalty"]
    if args.greedy or given.get("temperature") == 0:
        kw["do_sample"] = False
        return kw
    kw["do_sample"] = True
    for name in _SAMPLING + ("repetition_penalty",):
        pick(name, kw)
    if kw.get("min_p") == 0 and "min_p" not in set_by_model:
        del kw["min_p"]
    if args.seed is not None:
        kw["seed"] = args.seed
    return kw


def _check_sampling(kw):
    """Validate the numbers with the library's own rules (its ValueError names the
    parameter); called with the flags given before a model is loaded, and with the merged
    arguments after."""
    import torch

    from .sampler import sample
    names = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed")
    sample(torch.zeros(1, 2), **{n: kw[n] for n in names if kw.get(n) is not None})


def _cmd_generate(args):
    import torch
    from transformers import TextStreamer

    from . import demo
    from .hf import generate

    _check_sampling(dict(_given(args), seed=args.seed))  # before the model loads
    demo.check_device(args.device)
    demo.quiet_transformers()
    model, tok = demo.load_model(args.model, args.device,
                                 trust_remote_code=args.trust_remote_code)
    kw = _sampling_kwargs(args, model.generation_config)
    _check_sampling(kw)
    enc = tok(args.prompt, return_tensors="pt").to(model.device)
    streamer = TextStreamer(tok, skip_special_tokens=True)
    with torch.no_grad():
        generate(model, **enc, streamer=streamer, **kw)


def _bench_paths(out, device):
    bench_dir = REPO / "bench"
    suites = [bench_dir / "test_sampler_bench.py", bench_dir / "test_generate_bench.py"]
    missing = [str(s) for s in suites if not s.is_file()]
    if missing:
        raise CLIError(f"benchmark suite not found: {', '.join(missing)}. `gpu-sampler bench` "
                       "runs the pytest-benchmark suites of a source checkout, which the "
                       "installed package does not ship: clone gpu-sampler, `pip install -e "
                       "'.[test]'` there and run the command from that checkout")
    out_dir = Path(out) if out else bench_dir / "results"
    json_path = out_dir / f"{device}-{datetime.date.today().isoformat()}.json"
    return suites, json_path


def bench_command(device, quick, json_path, suites):
    """The pytest command line and environment for one benchmark run (no side effects).

    Returns:
        (argv list, env dict)
    """
    argv = [sys.executable, "-m", "pytest", *map(str, suites), "-q", "-p", "no:cacheprovider",
            "--benchmark-only", f"--benchmark-json={json_path}", "--benchmark-columns=median,iqr"]
    env = dict(os.environ)
    env["GPU_SAMPLER_BENCH_DEVICE"] = device
    if device == "cpu":
        # Both suites pick CUDA when they see it; hiding it makes "--device cpu" mean CPU.
        env["CUDA_VISIBLE_DEVICES"] = ""
    if quick:
        env["GPU_SAMPLER_BENCH_QUICK"] = "1"
    else:
        env.pop("GPU_SAMPLER_BENCH_QUICK", None)
    # The suites import `tests.models`: the repository root must be importable.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return argv, env


def _checkout_report():
    """bench/report.py of the checkout, loaded from its path (sys.path stays as it is)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_sampler_bench_report",
                                                  REPO / "bench" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cmd_bench(args):
    from .demo import check_device

    device = check_device(args.device).type
    suites, json_path = _bench_paths(args.out, device)  # first: a wheel has no suites
    try:
        import pytest_benchmark  # noqa: F401
    except ImportError:
        raise CLIError("bench needs pytest-benchmark (pip install pytest-benchmark); on a GPU "
                       "box without it, run `bash bench/gpu_check.sh`") from None
    json_path.parent.mkdir(parents=True, exist_ok=True)
    argv, env = bench_command(device, args.quick, json_path, suites)
    print(f"running: python {' '.join(argv[1:])}", flush=True)
    rc = subprocess.call(argv, cwd=REPO, env=env)
    if not json_path.is_file():
        raise CLIError(f"the benchmark run failed (pytest exit status {rc}) and wrote no JSON")
    md, png = _checkout_report().write_report(json_path)
    print()
    print(md.read_text())
    print(f"results: {json_path}\ntable:   {md}\nplot:    {png}")
    if rc != 0:
        raise CLIError(f"some benchmarks failed (pytest exit status {rc}); "
                       f"the report covers those that ran")


def main(argv=None):
    """Entry point of the ``gpu-sampler`` console script.

    Returns 0; a user error prints one line on stderr and raises SystemExit(2).

    Example:
        >>> import contextlib, sys
        >>> with contextlib.redirect_stderr(sys.stdout):  # the error line goes to stderr
        ...     try:
        ...         main(["generate", "--model", "/nonexistent", "--prompt", "hi"])
        ...     except SystemExit as e:
        ...         print("exit status", e.code)
        gpu-sampler: error: model folder not found: /nonexistent
        exit status 2
    """
    args = _parser().parse_args(argv)
    commands = {"demo": _cmd_demo, "generate": _cmd_generate, "bench": _cmd_bench}
    try:
        commands[args.command](args)
    except (CLIError, ValueError) as e:
        _fail(e)
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        raise SystemExit(130) from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
