"""`lucebox pull` end to end against a local fake hub (tests/unit/fake_hub.py); never touches the internet.

Each test gets its own hub on 127.0.0.1 and its own HF_HOME; hub.py reads the environment at call time,
so the CLI runs in-process through Typer's runner (one test runs the installed script in a subprocess).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lucebox_cli import hub, registry
from lucebox_cli.cli.app import make_app
from lucebox_cli.errors import DownloadError, ModelNotFound

from fake_hub import FakeHub  # tests/unit is on sys.path under pytest

GGUF_REPO = "unsloth/Qwen3.5-27B-GGUF"
DRAFT_REPO = "z-lab/Qwen3.5-27B-DFlash"
SMALL_REPO = "Qwen/Qwen3.5-0.8B"
Q4 = "Qwen3.5-27B-Q4_K_M.gguf"


def _bytes(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def _populate(fake: FakeHub) -> dict[str, dict[str, bytes]]:
    repos = {
        GGUF_REPO: {
            Q4: _bytes(300_000, 1),
            "Qwen3.5-27B-Q8_0.gguf": _bytes(50_000, 2),
            # Decoys the Q4_K_M patterns must not pick up.
            "Qwen3.5-27B-UD-Q4_K_M.gguf": _bytes(1_000, 3),
            "mmproj-F16.gguf": _bytes(1_000, 4),
            # Quants over the hub's 50 GB limit come as shards in a folder.
            "BF16/Qwen3.5-27B-BF16-00001-of-00002.gguf": _bytes(2_000, 7),
            "BF16/Qwen3.5-27B-BF16-00002-of-00002.gguf": _bytes(1_500, 8),
            "README.md": b"# GGUF\n",
        },
        DRAFT_REPO: {
            "config.json": b'{"model_type": "dflash"}\n',
            "model.safetensors": _bytes(120_000, 5),
            "README.md": b"# draft\n",
        },
        SMALL_REPO: {
            "config.json": b'{"model_type": "qwen3_5"}\n',
            "model.safetensors": _bytes(80_000, 6),
            "tokenizer.json": b'{"model": {}}\n',
            "tokenizer_config.json": b"{}\n",
            "README.md": b"# small\n",
        },
    }
    for repo_id, files in repos.items():
        fake.add_repo(repo_id, files)
    return repos


@pytest.fixture
def fake(tmp_path, monkeypatch):
    import huggingface_hub.constants as hf_constants

    hub_server = FakeHub()
    _populate(hub_server)
    hub_server.start()
    monkeypatch.setenv("HF_ENDPOINT", hub_server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    for var in (
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_TOKEN_PATH",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "ALL_PROXY",
        "LUCEBOX_DEBUG",
    ):
        monkeypatch.delenv(var, raising=False)
    # huggingface_hub blocks every request when HF_HUB_OFFLINE was set at its import time.
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    yield hub_server
    hub_server.stop()


def _cache(tmp_path: Path) -> Path:
    return tmp_path / "hf" / "hub"


def _pull(*args: str):
    return CliRunner().invoke(make_app(), list(args))


def _pull_json(*args: str) -> dict:
    result = _pull(*args, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _cached_files(cache: Path) -> list[Path]:
    return [p for p in cache.rglob("*") if p.is_file()] if cache.exists() else []


def _leftovers(cache: Path) -> list[Path]:
    return [p for p in cache.rglob("*") if p.name.endswith(".incomplete")]


def test_full_download_lands_in_hf_cache_layout(fake, tmp_path):
    out = _pull_json("pull", "qwen3.5-27b")
    cache = _cache(tmp_path)
    gguf_commit = fake.repos[GGUF_REPO].commit
    assert out["name"] == "qwen3.5-27b" and out["revision"] == gguf_commit and not out["offline"]
    assert {(f["role"], f["path"]) for f in out["files"]} == {
        ("target", Q4),
        ("draft", "config.json"),
        ("draft", "model.safetensors"),
    }
    assert {r["repo_id"]: r["commit"] for r in out["repos"]} == {
        GGUF_REPO: gguf_commit,
        DRAFT_REPO: fake.repos[DRAFT_REPO].commit,
    }
    for f in out["files"]:
        local = Path(f["local_path"])
        data = fake.repos[f["repo_id"]].files[f["path"]]
        storage = cache / ("models--" + f["repo_id"].replace("/", "--"))
        assert local == storage / "snapshots" / fake.repos[f["repo_id"]].commit / f["path"]
        assert local.is_symlink() and local.read_bytes() == data and f["size"] == len(data)
        # LFS blobs are named by their sha256, as huggingface_hub names them.
        if f["path"].endswith((".gguf", ".safetensors")):
            assert local.resolve() == storage / "blobs" / hashlib.sha256(data).hexdigest()
            assert f["sha256"] == hashlib.sha256(data).hexdigest()
        assert (storage / "refs" / "main").read_text() == fake.repos[f["repo_id"]].commit
    assert out["total_size"] == sum(f["size"] for f in out["files"])
    assert _leftovers(cache) == []
    # Other HF tools find the same files.
    from huggingface_hub import try_to_load_from_cache

    snapshot = cache / f"models--{GGUF_REPO.replace('/', '--')}" / "snapshots" / gguf_commit
    assert try_to_load_from_cache(GGUF_REPO, Q4, cache_dir=cache) == str(snapshot / Q4)
    # No xet: the hub said nothing about it and every transfer was a plain GET.
    assert all("xet" not in p for _, p, _ in fake.requests)


def test_second_pull_downloads_nothing_and_human_output(fake, tmp_path):
    _pull_json("pull", "qwen3.5-27b")
    n_gets = len(fake.gets(".gguf")) + len([r for r in fake.requests if r[1].startswith("/cdn/")])
    result = _pull("pull", "qwen3.5-27b")
    assert result.exit_code == 0, result.stderr
    assert GGUF_REPO in result.stdout and DRAFT_REPO in result.stdout and "3 files" in result.stdout
    assert len(fake.gets(".gguf")) + len([r for r in fake.requests if r[1].startswith("/cdn/")]) == n_gets


def test_dry_run_lists_files_and_downloads_nothing(fake, tmp_path):
    out = _pull_json("pull", "qwen3.5-27b:Q8_0", "--dry-run")
    sizes = {f["path"]: f["size"] for f in out["files"]}
    assert sizes == {"Qwen3.5-27B-Q8_0.gguf": 50_000, "config.json": 25, "model.safetensors": 120_000}
    q8 = next(f for f in out["files"] if f["path"].endswith(".gguf"))
    data = fake.repos[GGUF_REPO].files["Qwen3.5-27B-Q8_0.gguf"]
    assert q8["sha256"] == hashlib.sha256(data).hexdigest() and not q8["cached"]
    assert out["download_size"] == out["total_size"] == sum(sizes.values())
    assert _cached_files(_cache(tmp_path)) == []
    assert not [r for r in fake.requests if "/resolve/" in r[1] or r[1].startswith("/cdn/")]
    human = _pull("pull", "qwen3.5-27b:Q8_0", "--dry-run")
    assert human.exit_code == 0 and "Qwen3.5-27B-Q8_0.gguf" in human.stdout and "dry run" in human.stdout


def test_include_restricts_files(fake, tmp_path):
    out = _pull_json("pull", "qwen3.5-0.8b", "--include", "*.json")
    assert {(f["role"], f["path"]) for f in out["files"]} == {
        ("target", "config.json"),
        ("tokenizer", "tokenizer.json"),
        ("tokenizer", "tokenizer_config.json"),
    }
    assert not list(_cache(tmp_path).rglob("model.safetensors"))
    none = _pull("pull", "qwen3.5-0.8b", "--include", "*.bin")
    assert none.exit_code != 0 and "--include" in none.stderr


def test_resume_after_cut_sends_range_and_completes(fake, tmp_path):
    data = fake.repos[GGUF_REPO].files[Q4]
    sha = hashlib.sha256(data).hexdigest()
    fake.cut[Q4] = 100_000
    out = _pull_json("pull", "qwen3.5-27b", "--include", "*.gguf")
    ranges = [h.get("Range") for h in fake.gets(f"/cdn/{sha}")]
    assert ranges == [None, "bytes=100000-"]
    assert Path(out["files"][0]["local_path"]).read_bytes() == data
    assert _leftovers(_cache(tmp_path)) == []
    # Only the GGUF repo was touched, and --offline --include finds it without the draft.
    assert [r["repo_id"] for r in out["repos"]] == [GGUF_REPO]
    offline = _pull_json("pull", "qwen3.5-27b", "--include", "*.gguf", "--offline")
    assert [f["path"] for f in offline["files"]] == [Q4]


def test_sharded_quant_needs_every_shard(fake, tmp_path):
    out = _pull_json("pull", "qwen3.5-27b:bf16")
    shards = sorted(f["path"] for f in out["files"] if f["role"] == "target")
    assert shards == ["BF16/Qwen3.5-27B-BF16-00001-of-00002.gguf", "BF16/Qwen3.5-27B-BF16-00002-of-00002.gguf"]
    spec = registry.resolve("qwen3.5-27b:BF16")
    assert len(hub.find_local(spec).paths("target")) == 2
    Path(next(f["local_path"] for f in out["files"] if f["path"] == shards[1])).unlink()
    with pytest.raises(ModelNotFound, match="00002-of-00002"):
        hub.find_local(spec)


def test_interrupted_pull_resumes_in_the_next_run(fake, tmp_path):
    data = fake.repos[GGUF_REPO].files[Q4]
    sha = hashlib.sha256(data).hexdigest()
    storage = _cache(tmp_path) / f"models--{GGUF_REPO.replace('/', '--')}"
    fake.cut[Q4] = 70_000
    fake.refuse_ranges = True
    first = _pull("pull", "qwen3.5-27b", "--include", "*.gguf")
    assert first.exit_code != 0 and "error:" in first.stderr and "Traceback" not in first.stderr
    # The partial download is kept, under a name that never looks complete.
    assert (storage / "blobs" / f"{sha}.incomplete").stat().st_size == 70_000
    assert not (storage / "blobs" / sha).exists()
    assert not [p for p in _cached_files(storage) if p.name == Q4]
    with pytest.raises(ModelNotFound):
        hub.find_local(registry.resolve("qwen3.5-27b"), include=["*.gguf"])

    fake.refuse_ranges = False
    fake.requests.clear()
    out = _pull_json("pull", "qwen3.5-27b", "--include", "*.gguf")
    assert [h.get("Range") for h in fake.gets(f"/cdn/{sha}")] == ["bytes=70000-"]
    assert Path(out["files"][0]["local_path"]).read_bytes() == data
    assert _leftovers(_cache(tmp_path)) == []


def test_transient_server_errors_are_retried(fake, tmp_path):
    data = fake.repos[DRAFT_REPO].files["model.safetensors"]
    fake.fail["model.safetensors"] = [503]
    out = _pull_json("pull", "qwen3.5-27b", "--include", "*.safetensors")
    assert Path(out["files"][0]["local_path"]).read_bytes() == data
    assert len(fake.gets(f"/cdn/{hashlib.sha256(data).hexdigest()}")) == 2


def test_checksum_mismatch_fails_and_leaves_nothing_complete(fake, tmp_path):
    data = fake.repos[GGUF_REPO].files[Q4]
    sha = hashlib.sha256(data).hexdigest()
    fake.corrupt.add(Q4)
    result = _pull("pull", "qwen3.5-27b")
    assert result.exit_code != 0
    assert "checksum mismatch" in result.stderr and Q4 in result.stderr and "Traceback" not in result.stderr
    storage = _cache(tmp_path) / f"models--{GGUF_REPO.replace('/', '--')}"
    assert not (storage / "blobs" / sha).exists()
    assert not list(storage.rglob(Q4))
    assert _leftovers(_cache(tmp_path)) == []
    with pytest.raises(ModelNotFound):
        hub.find_local(registry.resolve("qwen3.5-27b"))
    # A good server afterwards: the next pull succeeds from scratch.
    fake.corrupt.clear()
    out = _pull_json("pull", "qwen3.5-27b")
    assert Path(next(f["local_path"] for f in out["files"] if f["path"] == Q4)).read_bytes() == data


def test_offline_is_served_from_cache(fake, tmp_path, monkeypatch):
    online = _pull_json("pull", "qwen3.5-27b")
    fake.requests.clear()
    offline_flag = _pull_json("pull", "qwen3.5-27b", "--offline")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline_env = _pull_json("pull", "qwen3.5-27b")
    assert fake.requests == []
    for out in (offline_flag, offline_env):
        assert out["offline"] and out["revision"] == online["revision"]
        assert sorted((f["path"], f["local_path"], f["size"]) for f in out["files"]) == sorted(
            (f["path"], f["local_path"], f["size"]) for f in online["files"]
        )
    found = hub.find_local(registry.resolve("qwen3.5-27b"))
    assert found.paths("target")[0].name == Q4
    assert found.dir("draft") == Path(next(r["snapshot"] for r in online["repos"] if r["repo_id"] == DRAFT_REPO))
    dry = _pull_json("pull", "qwen3.5-27b", "--dry-run")
    assert all(f["cached"] for f in dry["files"]) and dry["download_size"] == 0


def test_offline_with_empty_cache_is_one_line_error(fake, tmp_path):
    result = _pull("pull", "qwen3.5-27b", "--offline")
    assert result.exit_code == 1 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith("error: qwen3.5-27b is not in the HF cache") and "offline" in lines[0]
    assert lines[1].startswith("hint:") and "`lucebox pull qwen3.5-27b`" in lines[1]


def test_offline_env_empty_cache_through_the_installed_script(tmp_path):
    script = Path(sys.executable).parent / "lucebox"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "LUCEBOX_DEBUG"))}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9", COLUMNS="80")
    proc = subprocess.run([str(script), "pull", "qwen3.5-27b"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2, proc.stderr
    assert "offline mode is on (HF_HUB_OFFLINE=1)" in lines[0]
    assert "lucebox pull qwen3.5-27b" in lines[1] and "HF_HUB_OFFLINE" in lines[1]


def test_fetch_is_the_same_command(fake, tmp_path):
    out = _pull_json("fetch", "qwen3.5-0.8b")
    paths = {f["path"] for f in out["files"]}
    assert paths == {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert out["repos"][0]["roles"] == ["target", "tokenizer"]
    assert "fetch" in _pull("--help").stdout


def test_unknown_repo_and_unreachable_hub_are_one_line_errors(fake, tmp_path, monkeypatch):
    missing = _pull("pull", "nobody/nothing")
    assert missing.exit_code == 1 and "not found" in missing.stderr and "Traceback" not in missing.stderr
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    down = _pull("pull", "qwen3.5-0.8b")
    assert down.exit_code == 1 and "network error" in down.stderr and "hint:" in down.stderr


def test_revision_pins_a_commit(fake, tmp_path):
    commit = fake.repos[SMALL_REPO].commit
    out = _pull_json("pull", "qwen3.5-0.8b", "--revision", commit, "--include", "config.json")
    assert out["revision"] == commit and out["repos"][0]["revision"] == commit
    bad = _pull("pull", "qwen3.5-0.8b", "--revision", "nope")
    assert bad.exit_code == 1 and "revision" in bad.stderr


def test_library_progress_reports_bytes_up_to_size(fake, tmp_path):
    seen: dict[str, list[int]] = {}
    spec = registry.resolve("qwen3.5-27b")
    result = hub.download(spec, progress=lambda f, done: seen.setdefault(f.path, []).append(done))
    sizes = {f.path: f.size for f in result.files}
    assert set(seen) == set(sizes)
    for path, values in seen.items():
        assert values == sorted(values) and values[-1] == sizes[path]
    planned = hub.plan(spec)
    assert all(f.cached for f in planned) and {f.path for f in planned} == set(sizes)


def test_local_path_needs_no_hub(fake, tmp_path):
    gguf = tmp_path / "mine.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    out = _pull_json("pull", str(gguf))
    assert [(f["local_path"], f["size"]) for f in out["files"]] == [(str(gguf), 64)]
    assert fake.requests == []


def test_download_dataset_then_offline(fake, tmp_path):
    from lucebox_cli import hub

    rows = b'{"problem": "1+1?"}\n{"problem": "2+2?"}\n'
    fake.add_repo("HuggingFaceH4/MATH-500", {"test.jsonl": rows})
    path = hub.download_dataset("HuggingFaceH4/MATH-500", "test.jsonl")
    assert path.read_bytes() == rows
    assert "datasets--HuggingFaceH4--MATH-500" in str(path)
    assert hub.download_dataset("HuggingFaceH4/MATH-500", "test.jsonl", offline=True) == path
    with pytest.raises(DownloadError, match="offline"):
        hub.download_dataset("HuggingFaceH4/MATH-500", "other.jsonl", offline=True)
