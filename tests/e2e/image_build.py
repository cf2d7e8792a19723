"""The image of Dockerfile for the e2e tier (issue 38): `scripts/image.sh build`, started in the
background as the session starts (tests/e2e/conftest.py), when test_image.py is among its tests.

A first build on a fresh machine is cold (podman and mmdebstrap from Debian's packages, a base made
from Debian's, the dependencies installed and compiled in the image: minutes, docs/benchmarks.md);
it runs while the tier's other tests do, which mostly wait on flow runs. Later builds are seconds
(the layer cache in scripts/image.sh's STATE, shared by every clone of the machine).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "image.sh"
#: Podman, wherever docker also answers: the node stand-in's options are podman's
#: (`--read-only-tmpfs=false`, tmpfs `notmpcopyup`), and CI's machines have no docker engine.
ENV = {**os.environ, "STORAGE_MIGRATOR_IMAGE_ENGINE": "podman"}


class ImageBuild:
    """One `scripts/image.sh build` in the background; `image()` waits for its name."""

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="storage-migrator-image-build-"))
        self.log = self._dir / "build.log"
        with self.log.open("wb") as err, (self._dir / "name").open("wb") as out:
            # A session of its own: a Ctrl-C in the terminal must not cut apt-get short mid-install.
            self._proc = subprocess.Popen(["bash", str(SCRIPT), "build"], cwd=REPO, stdout=out, stderr=err,
                                          stdin=subprocess.DEVNULL, env=ENV, start_new_session=True)  # fmt: skip

    def image(self, timeout: float) -> str:
        """The built image's name; an AssertionError with the build's last lines if it failed."""
        try:
            code = self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"scripts/image.sh build still running after {timeout:.0f} s:\n{self.tail()}"
            ) from None
        assert code == 0, f"scripts/image.sh build failed (exit {code}):\n{self.tail()}"
        lines = (self._dir / "name").read_text().splitlines()
        assert lines, f"scripts/image.sh build printed no name:\n{self.tail()}"
        return lines[-1]

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def close(self) -> None:
        """The build waited for if the session ends before it (an early failure): stopped in the middle
        it could leave dpkg half-done (apt-get) and the lock held; stopped only past a bound, as a
        whole. Then the logs removed."""
        if self._proc.poll() is None:
            try:
                self._proc.wait(timeout=900)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)


_build: ImageBuild | None = None


def start() -> None:
    global _build
    if _build is None:
        _build = ImageBuild()


def current() -> ImageBuild:
    """The session's build (started here if the collection hook did not: a test run by itself)."""
    start()
    assert _build is not None
    return _build


def stop() -> None:
    global _build
    if _build is not None:
        _build.close()
        _build = None


def engine(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`scripts/image.sh engine ARGS...`: podman (or docker) with the configuration builds use."""
    done = subprocess.run(["bash", str(SCRIPT), "engine", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env=ENV)  # fmt: skip
    if check:
        assert done.returncode == 0, f"scripts/image.sh engine {' '.join(args)}: {done.stderr[-2000:]}"
    return done


def run_argv(*args: str) -> list[str]:
    """The command line of `scripts/image.sh run ARGS...` (a container removed when it ends)."""
    return ["bash", str(SCRIPT), "run", *args]
