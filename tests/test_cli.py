"""The gpu-sampler command, the demo's pieces, the embedded tiny model and bench/report.py.

The full demo and `bench` runs take minutes, so their pieces are tested here at tiny sizes;
errors must be one line on stderr with exit status 2 and no traceback.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpu_sampler import cli, demo, tiny
from gpu_sampler.hf import generate

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny.ensure_default_model(tmp_path_factory.mktemp("cache"))


def _run_main(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err
    return e.value.code, err


def _one_line_error(err, *needles):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert "Traceback" not in err
    assert lines[0].startswith("gpu-sampler: error:"), lines[0]
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"


# -- the embedded default model ------------------------------------------------------------

def test_default_model_builds_once_and_loads_with_auto_classes(model_dir, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert model_dir.name == "tiny-llama"
    stamp = (model_dir / "config.json").stat().st_mtime_ns
    assert tiny.ensure_default_model(model_dir.parent) == model_dir  # cached: not rebuilt
    assert (model_dir / "config.json").stat().st_mtime_ns == stamp
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.vocab_size >= len(tok)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert tok.padding_side == "left"
    text = "The quick brown fox jumps over the lazy dog."
    assert tok.decode(tok(text).input_ids) == text
    monkeypatch.setenv("GPU_SAMPLER_CACHE", str(model_dir.parent / "elsewhere"))
    assert tiny.default_cache_dir() == model_dir.parent / "elsewhere"


def test_build_model_is_deterministic():
    a, b = tiny.build_model(300, seed=1), tiny.build_model(300, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not torch.equal(next(a.parameters()), next(tiny.build_model(300, seed=2).parameters()))


# -- demo pieces -------------------------------------------------------------------------

def test_compare_generate_greedy_identical(model_dir):
    model, tok = demo.load_model(model_dir)
    res = demo.compare_generate(model, tok, demo.PROMPTS[:2], max_new_tokens=5, repeats=1)
    assert res["identical"] is True
    assert res["greedy"]["hf"] == res["greedy"]["gpu_sampler"]
    assert len(res["sample"]["gpu_sampler"]) == 2
    assert res["greedy"]["gs_tok_s"] > 0 and res["sample"]["hf_tok_s"] > 0


def test_sampling_check_catches_a_wider_draw(model_dir):
    # the demo's sampling tokens/s is quoted only when every drawn token lies in transformers'
    # kept set for SAMPLING; a draw from top-k 300 instead of 50 must fail that check
    model, tok = demo.load_model(model_dir)
    batch = tok(list(demo.PROMPTS[:2]), return_tensors="pt", padding=True)
    kw = dict(do_sample=True, max_new_tokens=4, min_new_tokens=4, **demo.SAMPLING)
    out = generate(model, **batch, **kw, seed=3)
    assert demo.sampled_in_support(model, batch, out, kw, 3)
    wide = dict(kw, top_k=300, top_p=1.0, temperature=1.5)
    out = generate(model, **batch, **wide, seed=3)
    assert not demo.sampled_in_support(model, batch, out, wide, 3)
    assert not demo.sampled_in_support(model, batch, out, kw, 3)  # other tokens than the rerun


def test_demo_quotes_no_speed_for_unchecked_output(model_dir, tmp_path, monkeypatch):
    real = demo.compare_generate

    def differing(*a, **k):
        res = real(*a, **k)
        res["identical"] = res["beam_identical"] = False
        return res
    monkeypatch.setattr(demo, "compare_generate", differing)
    lines = []
    demo.run_demo(model_dir, out_dir=tmp_path, sizes=[(2, 500)], max_new_tokens=3, repeats=1,
                  echo=lines.append)
    text = "\n".join(lines)
    assert "identical: NO" in text and "tokens/s: HF" not in text.split("sampling (")[0]
    assert "beam search (4 beams): identical NO, tokens/s not reported" in text


def test_sampler_table_and_plot(tmp_path):
    rows = demo.sampler_table([(1, 300), (3, 1000)], repeats=1)
    assert [(r["B"], r["V"]) for r in rows] == [(1, 300), (3, 1000)]
    assert all(r["hf_ms"] > 0 and r["gs_ms"] > 0 and r["ratio"] > 0 for r in rows)
    table = demo.format_table(rows)
    assert "(3, 1000)" in table and "ratio" in table
    png = demo.plot_latency(rows, tmp_path / "sub" / "p.png")
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_hf_chain_draws_inside_the_support():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 200, generator=g) * 3
    ids = torch.randint(0, 200, (4, 16), generator=g)
    import gpu_sampler
    dist = gpu_sampler.sampling_distribution(logits, input_ids=ids, **demo.SAMPLING)
    tok = demo.hf_chain(logits, ids, **demo.SAMPLING)
    assert (dist.gather(1, tok[:, None]) > 0).all()


def test_run_demo_small(model_dir, tmp_path):
    lines = []
    res = demo.run_demo(model_dir, out_dir=tmp_path, sizes=[(2, 500)], max_new_tokens=3,
                        repeats=1, echo=lines.append)
    text = "\n".join(lines)
    assert "identical: yes" in text and "(2, 500)" in text
    assert res["plot"].read_bytes()[:8] == PNG_MAGIC
    assert str(res["plot"].resolve()) in text


# -- generate command --------------------------------------------------------------------

def test_generate_streams_greedy_text(model_dir, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    assert cli.main(["generate", "--model", str(model_dir), "--prompt", "The quick brown fox",
                     "--max-new-tokens", "6", "--greedy"]) == 0
    out = capsys.readouterr().out
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok("The quick brown fox", return_tensors="pt").input_ids
    ref = tok.decode(model.generate(ids, max_new_tokens=6, do_sample=False)[0],
                     skip_special_tokens=True)
    assert out.strip() == ref.strip()


def test_generate_sampling_seeded_is_reproducible(model_dir, capsys):
    argv = ["generate", "--model", str(model_dir), "--prompt", "Once upon a time",
            "--max-new-tokens", "8", "--seed", "3", "--temperature", "0.9", "--top-k", "20",
            "--top-p", "0.95", "--min-p", "0.01", "--repetition-penalty", "1.1"]
    cli.main(argv)
    first = capsys.readouterr().out
    cli.main(argv)
    assert capsys.readouterr().out == first
    assert first.startswith("Once upon a time")


def _hf_text(model_dir, prompt, **kw):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok(prompt, return_tensors="pt").input_ids
    return tok.decode(model.generate(ids, **kw)[0], skip_special_tokens=True)


def test_generate_greedy_keeps_the_repetition_penalty(model_dir, capsys):
    # transformers applies repetition_penalty when greedy; the command must not drop it.
    # The random model's greedy text repeats only with the penalty far from 1: an extreme
    # penalty on every seen token changes the text (asserted, so the test is not vacuous).
    prompt = "The quick brown fox"
    ref = _hf_text(model_dir, prompt, max_new_tokens=12, do_sample=False,
                   repetition_penalty=1e-3)
    assert ref != _hf_text(model_dir, prompt, max_new_tokens=12, do_sample=False)
    cli.main(["generate", "--model", str(model_dir), "--prompt", prompt, "--max-new-tokens",
              "12", "--greedy", "--repetition-penalty", "1e-3"])
    assert capsys.readouterr().out.strip() == ref.strip()


def test_generate_greedy_still_validates_values(model_dir, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "--model", str(model_dir), "--prompt", "hi", "--greedy",
                  "--repetition-penalty", "-3"])
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("gpu-sampler: error: repetition_penalty")


def test_generate_honours_the_folders_generation_config(model_dir, tmp_path, capsys):
    # A folder whose generation_config samples at a tiny temperature with 5 new tokens:
    # `model.generate(ids)` draws the argmax (T 1e-4, top-k 1) and stops after 5 tokens, and
    # so must the command when no flag overrides it.
    import shutil
    import json
    folder = tmp_path / "m"
    shutil.copytree(model_dir, folder)
    cfg = json.loads((folder / "generation_config.json").read_text())
    cfg.update(do_sample=True, temperature=1e-4, top_k=1, top_p=0.5, max_new_tokens=5)
    (folder / "generation_config.json").write_text(json.dumps(cfg))
    prompt = "The quick brown fox"
    ref = _hf_text(folder, prompt)
    assert ref == _hf_text(folder, prompt, do_sample=False, max_new_tokens=5)
    cli.main(["generate", "--model", str(folder), "--prompt", prompt])
    assert capsys.readouterr().out.strip() == ref.strip()
    # a flag given still wins over the folder
    cli.main(["generate", "--model", str(folder), "--prompt", prompt, "--max-new-tokens", "7",
              "--greedy"])
    assert capsys.readouterr().out.strip() == _hf_text(folder, prompt, do_sample=False,
                                                       max_new_tokens=7).strip()


def test_generate_never_trusts_remote_code_unless_asked(model_dir, monkeypatch, capsys):
    import transformers
    seen = []
    orig = transformers.AutoModelForCausalLM.from_pretrained

    def spy(path, **kw):
        seen.append(kw.get("trust_remote_code"))
        return orig(path, **kw)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    base = ["generate", "--model", str(model_dir), "--prompt", "Hi", "--max-new-tokens", "1",
            "--greedy"]
    cli.main(base)
    cli.main(base + ["--trust-remote-code"])
    capsys.readouterr()
    assert seen == [False, True]


@pytest.mark.parametrize("extra,needles", [
    (["--temperature", "-1"], ["temperature", "-1"]),
    (["--top-p", "1.5"], ["top_p", "1.5"]),
    (["--top-k", "-3"], ["top_k", "-3"]),
    (["--min-p", "2"], ["min_p"]),
    (["--repetition-penalty", "0"], ["repetition_penalty"]),
])
def test_generate_bad_values_one_line(model_dir, capsys, extra, needles):
    code, err = _run_main(["generate", "--model", str(model_dir), "--prompt", "x", *extra], capsys)
    assert code == 2
    _one_line_error(err, *needles)


@pytest.mark.parametrize("argv,needle", [
    (["generate", "--model", "m", "--prompt", "x", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["generate", "--model", "m"], "--prompt"),
    (["frobnicate"], "invalid choice"),
])
def test_usage_errors_one_line(capsys, argv, needle):
    code, err = _run_main(argv, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and needle in lines[0] and "error:" in lines[0]


def test_generate_bad_model_folders(tmp_path, capsys):
    code, err = _run_main(["generate", "--model", str(tmp_path / "nope"), "--prompt", "x"], capsys)
    assert code == 2
    _one_line_error(err, "model folder not found", "nope")

    empty = tmp_path / "empty"
    empty.mkdir()
    code, err = _run_main(["generate", "--model", str(empty), "--prompt", "x"], capsys)
    assert code == 2
    _one_line_error(err, "not a transformers model")

    bogus = tmp_path / "bogus"
    bogus.mkdir()
    (bogus / "config.json").write_text(json.dumps({"model_type": "not-a-model"}))
    code, err = _run_main(["generate", "--model", str(bogus), "--prompt", "x"], capsys)
    assert code == 2
    _one_line_error(err, "could not load", "bogus")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
@pytest.mark.parametrize("cmd", [["demo"], ["bench"], ["generate", "--prompt", "x"]])
def test_cuda_without_cuda(model_dir, capsys, cmd):
    argv = cmd + ["--device", "cuda"] + (["--model", str(model_dir)] if "generate" in cmd else [])
    code, err = _run_main(argv, capsys)
    assert code == 2
    _one_line_error(err, "CUDA is not available")


def test_console_script_error_in_subprocess(tmp_path):
    exe = Path(sys.executable).parent / "gpu-sampler"
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "gpu_sampler.cli"]
    p = subprocess.run(argv + ["generate", "--model", str(tmp_path / "missing"), "--prompt", "x"],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 2
    _one_line_error(p.stderr, "model folder not found")
    assert p.stdout == ""


# -- bench command and bench/report.py ------------------------------------------------------

def test_bench_command_line_and_environment(tmp_path):
    suites, json_path = cli._bench_paths(str(tmp_path), "cpu")
    assert json_path.parent == tmp_path and json_path.name.startswith("cpu-")
    assert json_path.suffix == ".json"
    argv, env = cli.bench_command("cpu", True, json_path, suites)
    assert argv[1:3] == ["-m", "pytest"]
    assert f"--benchmark-json={json_path}" in argv
    assert any(a.endswith("test_sampler_bench.py") for a in argv)
    assert any(a.endswith("test_generate_bench.py") for a in argv)
    assert env["GPU_SAMPLER_BENCH_QUICK"] == "1" and env["CUDA_VISIBLE_DEVICES"] == ""
    assert str(ROOT) in env["PYTHONPATH"].split(os.pathsep)
    _, env = cli.bench_command("cuda", False, json_path, suites)
    assert "GPU_SAMPLER_BENCH_QUICK" not in env and env["GPU_SAMPLER_BENCH_DEVICE"] == "cuda"


def _synthetic_benchmark_json(path):
    benches = []
    medians = {"gpu_sampler": 1.0, "hf": 8.0, "naive": 3.0}
    for B, V in [(1, 32000), (8, 32000), (64, 128256)]:
        for prov, m in medians.items():
            scale = B * V / 32000 * 1e-4
            benches.append({
                "group": None, "name": f"test_sampler_latency[b{B}-v{V}-{prov}]",
                "params": {"shape": f"{B}x{V}", "provider": prov},
                "extra_info": {"device": "cpu"},
                "stats": {"median": m * scale, "min": m * scale, "max": m * scale}})
    # A second suite whose provider and size live only in the id and extra_info.
    # A group shared by two cases, and one that is exactly one case.
    for mode in ("greedy", "sample"):
        for prov, m in (("gpu_sampler", 2.0), ("hf_static", 5.0)):
            benches.append({"group": "generate", "name": f"test_gen[llama-v1000-b4-{mode}-{prov}]",
                            "params": {}, "extra_info": {"tokens_per_s": 64 / m},
                            "stats": {"median": m}})
    for prov, m in (("gpu_sampler", 1.0), ("hf", 4.0)):
        benches.append({"group": "2x500 fast", "name": f"test_one[2x500-{prov}]", "params": {},
                        "extra_info": {}, "stats": {"median": m}})
    data = {"machine_info": {"node": "box", "cpu": {"brand_raw": "Test CPU"},
                             "python_version": "3.11"},
            "commit_info": {"id": "abcdef1234567890", "dirty": True},
            "datetime": "2026-01-01T00:00:00", "benchmarks": benches}
    path.write_text(json.dumps(data))
    return path


def test_report_table_and_plot(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import report
    finally:
        sys.path.remove(str(ROOT / "bench"))
    src = _synthetic_benchmark_json(tmp_path / "cpu-2026-01-01.json")
    md, png = report.write_report(src)
    assert md == tmp_path / "cpu-2026-01-01.md" and png.read_bytes()[:8] == PNG_MAGIC
    text = md.read_text()
    assert "hf/gpu_sampler" in text and "naive/gpu_sampler" in text
    rows = [ln for ln in text.splitlines() if ln.startswith("| test_sampler_latency")]
    assert len(rows) == 3 and all("8.00x" in r and "3.00x" in r for r in rows)
    assert "gpu_sampler" not in rows[0].split("|")[1]  # provider removed from the case name
    gen = [ln for ln in text.splitlines() if ln.startswith("| generate: test_gen[llama-v1000-b4-")]
    gen = [ln for ln in gen if ln.endswith("x |")]  # the ratio table, not the tokens/s one
    assert len(gen) == 2 and all("2.50x" in r for r in gen)  # hf_static / gpu_sampler
    one = [ln for ln in text.splitlines() if ln.startswith("| 2x500 fast |")]
    assert len(one) == 1 and "4.00x" in one[0]
    cases = report.load_cases(json.loads(src.read_text()))
    assert {c["size"] for c in cases.values()} == {(1, 32000), (8, 32000), (64, 128256),
                                                   (4, 1000), (2, 500)}


def test_report_cli_errors(tmp_path):
    script = str(ROOT / "bench" / "report.py")
    p = subprocess.run([sys.executable, script, str(tmp_path / "missing.json")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no such file" in p.stderr
    ok = _synthetic_benchmark_json(tmp_path / "r.json")
    p = subprocess.run([sys.executable, script, str(ok)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "r.md").is_file() and (tmp_path / "r.png").is_file()


# -- the trained default model (a few steps on a small corpus: the recipe, not the quality) ---

def test_training_recipe_saves_a_stamped_loadable_model(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    lines = []
    path = tiny.ensure_default_model(tmp_path, train_steps=3, echo=lines.append,
                                     max_chars=20_000, vocab_size=600, batch_size=4,
                                     seq_len=32)
    stamp = tiny.read_stamp(path)
    assert stamp["steps"] == 3 and len(stamp["losses"]) == 3 and stamp["recipe"] == tiny.RECIPE
    assert stamp["losses"][0] > 5.0  # about ln(vocab) from a fresh init: it really trained
    assert any(line.startswith("corpus: docstrings of") for line in lines)
    assert tiny.is_built(path, 3) and not tiny.is_built(path, 0)
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert model.config.vocab_size == len(tok) <= 600
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    ids = tok(demo.PROMPTS[:1], return_tensors="pt")
    assert model.generate(**ids, max_new_tokens=3, do_sample=False).shape[1] == \
        ids.input_ids.shape[1] + 3


def test_stdlib_corpus_is_prose_in_a_fixed_order():
    paras = tiny.stdlib_corpus(["textwrap", "json"], max_chars=50_000)
    assert paras == tiny.stdlib_corpus(["textwrap", "json"], max_chars=50_000)
    assert "wrap" in paras[0] and any("JSON" in p for p in paras)
    assert len(set(paras)) == len(paras)
    assert not any(">>>" in p or "\n" in p for p in paras)


@pytest.mark.parametrize("raw", ["-1", "many"])
def test_steps_variable_is_validated(monkeypatch, raw):
    monkeypatch.setenv(tiny.STEPS_ENV, raw)
    with pytest.raises(ValueError, match=tiny.STEPS_ENV):
        tiny.default_steps()
