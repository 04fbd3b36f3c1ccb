"""Real server processes for adapter tests: free ports, start, wait until healthy, stop."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

CCE = [sys.executable, "-m", "cce_duck.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"server exited with {proc.returncode}:\n{out}\n{err}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer within {timeout}s")


def stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.communicate()


@contextmanager
def cce_server(args: list[str], data_dir: Path, ready_path: str = "/health",
               env: dict[str, str] | None = None) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``cce serve ...`` in a subprocess on a free port; yields its base URL and the process."""
    port = free_port()
    full_env = {**os.environ, "CCE_DATA_DIR": str(data_dir), "CCE_EMBEDDER": "hash", **(env or {})}
    proc = subprocess.Popen([*CCE, "serve", *args, "--port", str(port)], env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base + ready_path, proc)
        yield base, proc
    finally:
        stop(proc)
