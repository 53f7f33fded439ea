"""`lucebox bench speed MODEL --baseline-llama-bench PATH`: llama-bench's rows beside ours.

A fake llama-bench (a Python script written into tmp_path) checks the argv it gets (the same -p/-n/-r/-d
as ours, tg at depth = our prompt, -o json) and prints JSON records in llama-bench's own format (field
names as its json printer writes them); its samples are derived from the argv, so a wrong mapping shows
up in the values. Failures (missing binary, non-executable, bad exit, garbage, timeout, non-GGUF model)
must give one error line and exit 1 (2 for the model) while our own rows are still printed.
"""

from __future__ import annotations

import json
import stat
import sys

import pytest
from dflash_tiny import make_tiny_q4km
from tiny_models import make_tiny_checkpoint
from typer.testing import CliRunner

from lucebox_cli.bench import llama_bench
from lucebox_cli.bench.runner import bytes_per_token
from lucebox_cli.cli.app import make_app
from lucebox_cli.config import get_profile

MODEL_SIZE, N_PARAMS = 7_340_032, 9_437_184  # what the fake reports; not the tiny model's, on purpose

# A llama-bench stand-in. Validates its argv like llama-bench's parser would be fed by us, then prints one
# record per (pp | tg x depth) test in the `-o json` layout; samples_ts[i] = base + i, base set per test.
FAKE = r'''#!{python}
import json, sys, time, os
argv = sys.argv[1:]
open(os.environ["FAKE_LOG"], "a").write(json.dumps(argv) + "\n")
mode = os.environ.get("FAKE_MODE", "ok")
if mode == "sleep":
    time.sleep(60)
if mode == "fail":
    sys.stderr.write("llama_model_load: error loading model\nmain: error: failed to load model 'x'\n")
    sys.exit(1)
if mode == "garbage":
    print("| model | size | params | backend | ngl | test | t/s |")
    sys.exit(0)
def opt(name, default=None):
    return argv[argv.index(name) + 1] if name in argv else default
assert opt("-o") == "json", argv
assert os.path.isfile(opt("-m")), argv
p, n, r = int(opt("-p")), int(opt("-n")), int(opt("-r"))
depths = [int(d) for d in opt("-d", "0").split(",")]
if mode == "fail_tg" and n > 0:
    sys.exit(2)
recs = []
for d in depths:
    for (tp, tn) in ([(p, 0)] if p else []) + ([(0, n)] if n else []):
        base = 1000.0 + tp + 10 * tn + d
        ts = [base + i for i in range(r)]
        ns = [int(1e9 * (tp + tn) / t) for t in ts]
        mean = sum(ts) / r
        sd = (sum((t - mean) ** 2 for t in ts) / (r - 1)) ** 0.5 if r > 1 else 0.0
        recs.append({{
            "build_commit": "8cf427ff", "build_number": 5163, "cpu_info": "AMD EPYC 9654 96-Core Processor",
            "gpu_info": "NVIDIA H200", "backends": "CUDA", "model_filename": opt("-m"),
            "model_type": "qwen35 0.8B Q4_K - Medium", "model_size": {size}, "model_n_params": {params},
            "n_batch": 2048, "n_ubatch": 512, "n_threads": 16, "cpu_mask": "0x0", "cpu_strict": False,
            "poll": 50, "type_k": "f16", "type_v": "f16", "n_gpu_layers": 99, "split_mode": "layer",
            "main_gpu": 0, "no_kv_offload": False, "flash_attn": -1, "tensor_split": "0.00",
            "use_mmap": True, "embeddings": False, "n_prompt": tp, "n_gen": tn, "n_depth": d,
            "test_time": "2025-04-24T11:58:50Z", "avg_ns": int(sum(ns) / r), "stddev_ns": 0,
            "avg_ts": mean, "stddev_ts": sd, "samples_ns": ns, "samples_ts": ts,
        }})
print(json.dumps(recs, indent=2))
'''


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    return make_tiny_q4km(tmp_path_factory.mktemp("llb") / "m", n_layers=2, hv_ratio=1)


class Fake:
    """The fake binary (str() is its path) and the argv of each of its runs."""

    def __init__(self, path, log):
        self.path, self.log = path, log

    def __str__(self) -> str:
        return str(self.path)

    def calls(self) -> list[list[str]]:
        return [json.loads(ln) for ln in self.log.read_text().splitlines()] if self.log.exists() else []


@pytest.fixture
def fake(tmp_path, monkeypatch):
    path = tmp_path / "llama-bench"
    path.write_text(FAKE.format(python=sys.executable, size=MODEL_SIZE, params=N_PARAMS))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "argv.log"))
    return Fake(path, tmp_path / "argv.log")


def _bench(model, *extra):
    res = CliRunner().invoke(make_app(), ["bench", "speed", str(model), "--engine", "cpu", "-p", "5", "-n", "3",
                                          "-r", "2", "--warmup", "0", *map(str, extra)])
    return res


def _err_line(res) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.output + res.stderr
    return lines[0]


def test_rows_merged_and_values_parsed(gguf, fake):
    res = _bench(gguf, "-d", "7", "--json", "--baseline-llama-bench", fake)
    assert res.exit_code == 0, res.output + res.stderr
    rows = json.loads(res.stdout)
    ours = {r["test"]: r for r in rows if r["engine"] == "cpu"}
    llama = {r["test"]: r for r in rows if r["engine"] == "llama.cpp"}
    assert set(ours) == set(llama) == {"pp5", "tg3", "tg3@d7"}
    # our tg3 follows the 5-token prompt: llama-bench's runs at depth 5; pp alone at depth 0; --warmup 0
    # maps to --no-warmup
    calls = fake.calls()
    g = str(gguf)
    assert calls == [["-m", g, "-r", "2", "-o", "json", "--no-warmup", "-p", "5", "-n", "0"],
                     ["-m", g, "-r", "2", "-o", "json", "--no-warmup", "-p", "0", "-n", "3", "-d", "5,7"]]
    assert llama["tg3"]["llama_bench_test"] == "tg3 @ d5" and llama["tg3@d7"]["llama_bench_test"] == "tg3 @ d7"
    assert llama["pp5"]["llama_bench_test"] == "pp5"
    from lucebox_cli import api

    cfg = api.load_model(gguf).cfg
    for test, (tp, tn, d) in {"pp5": (5, 0, 0), "tg3": (0, 3, 5), "tg3@d7": (0, 3, 7)}.items():
        r = llama[test]
        base = 1000.0 + tp + 10 * tn + d
        assert r["samples"] == [base, base + 1] and r["reps"] == 2 and r["warmup"] == 0
        assert r["tok_s"] == pytest.approx(base + 0.5) and r["median"] == pytest.approx(base + 0.5)
        assert r["sd"] == pytest.approx(0.5 ** 0.5)
        assert r["size_gib"] == pytest.approx(MODEL_SIZE / 2**30) and r["params_m"] == pytest.approx(N_PARAMS / 1e6)
        assert r["gpu"] == "NVIDIA H200" and r["commit"] == "8cf427ff" and r["backends"] == "CUDA"
        assert r["model"] == ours[test]["model"] == gguf.name and r["tok_per_j"] is None
        assert r["llama_bench"]["model_filename"] == g and r["pct_bw"] is None  # CPU engine: no profile
        if tn:
            assert r["tflops"] is None
            assert r["gbps"] == pytest.approx(r["tok_s"] * bytes_per_token(cfg, MODEL_SIZE, d + tn / 2) / 1e9)
        else:
            assert r["gbps"] is None and r["tflops"] == pytest.approx(2 * N_PARAMS * r["tok_s"] / 1e12)


def test_md_and_csv_one_table(gguf, fake):
    res = _bench(gguf, "--baseline-llama-bench", fake)
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("| ")]
    assert len(lines) == 1 + 4  # header + pp5/tg3 of ours and of llama.cpp, one table
    assert sum("| llama.cpp | tg3 |" in ln for ln in lines) == 1
    assert "1,035.50 ± 0.71" in res.stdout  # tg3 @ d5: 1000 + 10·3 + 5, + 0.5 (mean of two samples)
    res = _bench(gguf, "--csv", "--baseline-llama-bench", fake)
    assert res.exit_code == 0, res.output
    assert [ln.split(",")[4] for ln in res.stdout.splitlines()[1:]] == ["cpu", "cpu", "llama.cpp", "llama.cpp"]


def test_warmup_and_no_prompt_map_to_plain_runs(gguf, fake):
    res = _bench(gguf, "-p", "0", "--warmup", "1", "--json", "--baseline-llama-bench", fake)
    assert res.exit_code == 0, res.output
    # -p 0: no pp run; tg at depth 0 needs no -d at all (older llama-bench builds lack it)
    assert fake.calls() == [["-m", str(gguf), "-r", "2", "-o", "json", "-p", "0", "-n", "3"]]
    assert [r["test"] for r in json.loads(res.stdout) if r["engine"] == "llama.cpp"] == ["tg3"]


def _ours_still_printed(res):
    rows = json.loads(res.stdout)
    assert {r["test"] for r in rows if r["engine"] == "cpu"} == {"pp5", "tg3"}
    return rows


@pytest.mark.parametrize("mode,needle", [("fail", "exited with status 1: main: error: failed to load model"),
                                         ("garbage", "not its -o json rows: not JSON")])
def test_bad_exit_and_garbage(gguf, fake, monkeypatch, mode, needle):
    monkeypatch.setenv("FAKE_MODE", mode)
    res = _bench(gguf, "--json", "--baseline-llama-bench", fake)
    assert res.exit_code == 1
    assert needle in _err_line(res)
    rows = _ours_still_printed(res)
    assert all(r["engine"] == "cpu" for r in rows)


def test_partial_failure_keeps_finished_rows(gguf, fake, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "fail_tg")
    res = _bench(gguf, "--json", "--baseline-llama-bench", fake)
    assert res.exit_code == 1 and "status 2" in _err_line(res)
    rows = _ours_still_printed(res)
    assert [r["test"] for r in rows if r["engine"] == "llama.cpp"] == ["pp5"]


def test_timeout(gguf, fake, monkeypatch):
    import time

    monkeypatch.setenv("FAKE_MODE", "sleep")
    t0 = time.perf_counter()
    res = _bench(gguf, "--json", "--baseline-llama-bench", fake, "--baseline-timeout", "1")
    assert time.perf_counter() - t0 < 30  # killed, not waited for
    assert res.exit_code == 1 and "did not finish within 1 s" in _err_line(res)
    _ours_still_printed(res)


def test_missing_and_not_executable(gguf, tmp_path):
    res = _bench(gguf, "--json", "--baseline-llama-bench", tmp_path / "nope" / "llama-bench")
    assert res.exit_code == 1 and "llama-bench not found" in _err_line(res)
    _ours_still_printed(res)
    plain = tmp_path / "llama-bench.txt"
    plain.write_text("not a program\n")
    res = _bench(gguf, "--json", "--baseline-llama-bench", plain)
    assert res.exit_code == 1 and "not an executable file" in _err_line(res)
    _ours_still_printed(res)


def test_non_gguf_model_refused_before_measuring(tmp_path, fake):
    folder = make_tiny_checkpoint(tmp_path / "hf", n_layers=2, hidden=64)
    res = _bench(folder, "--json", "--baseline-llama-bench", fake)
    assert res.exit_code == 2
    assert "needs a GGUF model" in _err_line(res) and "hint:" in res.stderr
    assert res.stdout == "" and fake.calls() == []


def test_parse_json_rejects_incomplete_records():
    good = {"n_prompt": 0, "n_gen": 4, "n_depth": 0, "avg_ts": 10.0, "stddev_ts": 0.0, "samples_ts": [10.0]}
    assert llama_bench.parse_json(json.dumps([good])) == [good]
    for bad in ([{k: v for k, v in good.items() if k != "avg_ts"}], [dict(good, samples_ts=[])],
                [dict(good, samples_ts=["x"])], {"n_prompt": 1}, [dict(good, n_gen="4")]):
        with pytest.raises(ValueError):
            llama_bench.parse_json(json.dumps(bad))
    with pytest.raises(ValueError, match="not JSON"):
        llama_bench.parse_json("[\n  {\n")  # what a llama-bench killed mid-run leaves


def test_pct_bw_uses_the_profile_bandwidth():
    hw = get_profile("h200-sm90").hardware
    rec = {"n_prompt": 0, "n_gen": 8, "n_depth": 16, "avg_ts": 100.0, "stddev_ts": 1.0, "samples_ts": [99.0, 101.0],
           "model_size": 2**30, "model_n_params": 10**9}
    class Cfg:  # the fields bytes_per_token reads: 2 layers, one attention
        n_layers, hv, dk, dv, n_kv_heads, head_dim = 2, 4, 8, 8, 2, 16

        @staticmethod
        def is_attention(i):
            return i == 1

    (row,) = llama_bench.to_rows([rec], n_prompt=16, warmup=1, cfg=Cfg, hardware=hw)
    assert row["test"] == "tg8"
    want = 100.0 * bytes_per_token(Cfg, 2**30, 16 + 4) / 1e9
    assert row["gbps"] == pytest.approx(want) and row["pct_bw"] == pytest.approx(100 * want / hw.bandwidth_gbps)


def test_help_states_the_failure_contract():
    res = CliRunner().invoke(make_app(), ["bench", "speed", "--help"], terminal_width=200)
    text = " ".join(res.stdout.split())
    assert "--baseline-llama-bench" in text and "exit status 1" in text
