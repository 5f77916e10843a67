"""Freed memory kept for reuse (:mod:`pyrogp_models.inference.memory`), which the command line
asks for: glibc then holds a freed 64 MiB tensor in its heap instead of returning it to the
system (whose next use would fault on every page)."""

import ctypes
import subprocess
import sys
import textwrap

import pytest
from pyrogp_models.inference import cli

PROBE = textwrap.dedent("""
    import ctypes, sys, torch
    from pyrogp_models.inference.memory import keep_freed_memory

    class MallocInfo(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost")]

    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = MallocInfo
    if sys.argv[1] == "keep":
        assert keep_freed_memory()
    torch.ones(8 << 20, dtype=torch.float64)  # 64 MiB, freed at once
    print(mallinfo2().fordblks)  # free bytes glibc holds
""")


def _has_mallinfo2() -> bool:
    try:
        return sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "mallinfo2")
    except OSError:
        return False


@pytest.mark.skipif(not _has_mallinfo2(), reason="glibc ≥ 2.33 on Linux")
def test_a_freed_large_tensor_stays_in_the_heap_for_reuse():
    def held_after_free(mode: str) -> int:
        done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True,
                              text=True, check=True)
        return int(done.stdout.split()[-1])

    size = 64 << 20
    assert held_after_free("default") < size  # returned to the system
    assert held_after_free("keep") >= size


def test_the_command_line_keeps_freed_memory(monkeypatch, tmp_path, capsys):
    calls = []
    monkeypatch.setattr(cli, "keep_freed_memory", lambda: calls.append(True))
    assert cli.main(["info", str(tmp_path / "missing.safetensors")]) == 2
    assert calls == [True]
