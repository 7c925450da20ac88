"""images/cuda-toolkit.sh verify against real toolkits on this machine (real nvcc, real ptxas).

The host's CUDA 13.0 install has nvcc but no curand headers: exactly the incident's
`curand.h: No such file` situation. Adding the headers from NVIDIA's nvidia-curand wheel (what the
image does when its base lacks them) makes the same real compiles pass for sm_120f and sm_103a.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "src" / "sglfleet" / "images" / "cuda-toolkit.sh"
HOST_CUDA = Path(os.environ.get("HOST_CUDA_ROOT", "/usr/local/cuda-13.0"))

pytestmark = [pytest.mark.nvcc, pytest.mark.skipif(not (HOST_CUDA / "bin" / "nvcc").is_file(),
                                reason=f"no CUDA toolkit at {HOST_CUDA} (set HOST_CUDA_ROOT)")]


def verify(cuda_root: Path, archs: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "CUDA_ROOT": str(cuda_root), "PROBE_ARCHS": archs, **env}
    return subprocess.run(["bash", str(SCRIPT), "verify"], capture_output=True, text=True, env=full,
                          timeout=300, check=False)


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if "ERROR" in ln]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_toolkit_without_curand_headers_fails_clearly() -> None:
    assert not (HOST_CUDA / "include" / "curand.h").exists(), "host toolkit gained curand.h; test premise gone"
    proc = verify(HOST_CUDA, "12.0f")
    assert proc.returncode == 1
    assert "curand.h is not in" in error_line(proc)


def test_nvcc_older_than_required_fails_clearly() -> None:
    # The real nvcc 13.0 against a raised floor exercises the same guard that rejects nvcc < 12.9.
    proc = verify(HOST_CUDA, "12.0f", MIN_NVCC="13.1")
    assert proc.returncode == 1
    assert "nvcc 13.0 is too old" in error_line(proc) and "need nvcc >= 13.1" in error_line(proc)


def test_base_without_toolkit_fails_clearly(tmp_path: Path) -> None:
    proc = verify(tmp_path, "12.0f")
    assert proc.returncode == 1
    assert "no nvcc at" in error_line(proc)


@pytest.fixture(scope="module")
def curand_headers(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """curand headers from NVIDIA's nvidia-curand wheel matching CUDA 13.0 (via cuda-toolkit[curand])."""
    d = tmp_path_factory.mktemp("curand")
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(d),
                           "cuda-toolkit[curand]==13.0.*"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    whl = next(d.glob("nvidia_curand-*.whl"))
    out = d / "x"
    with zipfile.ZipFile(whl) as zf:
        zf.extractall(out, [n for n in zf.namelist() if "/include/curand" in n])
    headers = sorted(out.rglob("curand*.h"))
    assert any(h.name == "curand_kernel.h" for h in headers)
    return headers


def test_curand_headers_from_wheel_make_blackwell_compiles_pass(tmp_path: Path, curand_headers: list[Path]) -> None:
    """Host toolkit + wheel headers linked into $CUDA_HOME/include (what setup does): real nvcc
    compiles a curand kernel for sm_120f and sm_103a and ptxas assembles both."""
    root = tmp_path / "cuda"
    root.mkdir()
    for entry in HOST_CUDA.iterdir():
        if entry.name != "include":
            (root / entry.name).symlink_to(entry)
    inc = root / "include"
    inc.mkdir()
    for entry in (HOST_CUDA / "include").iterdir():
        (inc / entry.name).symlink_to(entry)
    for h in curand_headers:
        (inc / h.name).symlink_to(h)
    proc = verify(root, "12.0f 10.3a")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sm_120f: curand kernel compiled, PTX assembled by ptxas" in proc.stderr
    assert "sm_103a: curand kernel compiled, PTX assembled by ptxas" in proc.stderr
