"""bench/h200x2_call's compile cache: packed into OUT within the size a device call returns, unpacked
into the shared cache directories that every child is pointed at."""

from __future__ import annotations

from pathlib import Path

from bench.h200x2_call import save_compile_cache, use_compile_cache


def test_the_cache_round_trips_and_an_oversized_one_is_not_returned(tmp_path: Path) -> None:
    cache = tmp_path / "work" / "compile-cache"
    env = use_compile_cache(None, cache)
    assert env == {"TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "TRITON_CACHE_DIR": str(cache / "triton")}
    out = tmp_path / "out"
    out.mkdir()
    assert "empty" in save_compile_cache(cache, out / "compile-cache.tar.gz")
    files = {"inductor/fxgraph/ab/entry": b"graph" * 100, "triton/K1/kernel.cubin": bytes(range(256)) * 40}
    for name, data in files.items():
        (cache / name).parent.mkdir(parents=True, exist_ok=True)
        (cache / name).write_bytes(data)
    said = save_compile_cache(cache, out / "compile-cache.tar.gz")
    assert "--compile-cache" in said and (out / "compile-cache.tar.gz").is_file()
    again = tmp_path / "next" / "compile-cache"
    use_compile_cache(out / "compile-cache.tar.gz", again)
    assert {str(p.relative_to(again)): p.read_bytes() for p in again.rglob("*") if p.is_file()} == files
    big = out / "big.tar.gz"
    said = save_compile_cache(cache, big, limit=100)
    assert "over the" in said and not big.exists() and not list(out.glob("*.part"))
    # and it says what filled it, largest first (the next session learns what to leave out)
    assert said.endswith("by kind: triton .cubin 0.0, inductor (none) 0.0")
