"""Fixtures for the container suite: the image (built here by container/build
unless SMX_IMAGE names one already in local storage), a 0755 directory with
the config the runtimes read, and podman rootful and rootless."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

import harness
from harness import IMAGE, Podman


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="session")
def share():
    if not shutil.which("podman"):
        pytest.skip("podman is not installed (bash .ci/run installs podman, buildah, runc, uidmap)")
    d = pathlib.Path(tempfile.mkdtemp(prefix="sandmux-ctr-"))
    d.chmod(0o755)
    (d / "containers.conf").write_text(harness.containers_conf())
    (d / "home").mkdir()
    (d / "run").mkdir(mode=0o700)
    shutil.copy(harness.SECCOMP, d / "seccomp.json")
    (d / "no-userns.json").write_text(json.dumps(harness.no_userns_profile()))
    for f in d.glob("*.*"):
        f.chmod(0o644)
    yield d
    _end_rootless_pause(d)
    shutil.rmtree(d, ignore_errors=True)


def _end_rootless_pause(d):
    """Rootless podman leaves a pause process holding its user namespace:
    ours, named by its pid file, is ended."""
    pid = d / "run" / "libpod" / "tmp" / "pause.pid"
    try:
        os.kill(int(pid.read_text()), signal.SIGTERM)
    except (OSError, ValueError):
        pass


@pytest.fixture(scope="session")
def image(share):
    """The image's tag, built once per session from SANDMUX_BIN unless
    SMX_IMAGE says it is already built."""
    rootful = Podman("rootful", share)
    if "SMX_IMAGE" not in os.environ:
        if os.getuid() != 0:
            pytest.skip("building the image needs root (container/build); set SMX_IMAGE to a built image")
        b = subprocess.run([str(harness.ROOT / "container" / "build"), "--tag", IMAGE, harness.BIN],
                           capture_output=True, text=True, timeout=600)
        assert b.returncode == 0, f"container/build failed:\n{b.stdout}\n{b.stderr}"
    p = rootful.run("image", "exists", IMAGE) if os.getuid() == 0 else None
    if p is not None:
        assert p.returncode == 0, f"{IMAGE} is not in local storage"
    return IMAGE


@pytest.fixture(scope="session")
def rootful(share, image):
    if os.getuid() != 0:
        pytest.skip(f"rootful podman needs root; this is uid {os.getuid()}")
    return Podman("rootful", share)


@pytest.fixture(scope="session")
def rootless(share, image):
    why = harness.rootless_unavailable()
    if why:
        pytest.skip(f"rootless podman as uid {harness.ROOTLESS_UID}: {why}")
    p = Podman("rootless", share)
    if os.getuid() == 0:
        for sub in ("home", "run"):
            os.chown(share / sub, harness.ROOTLESS_UID, harness.ROOTLESS_UID)
        archive = share / "image.tar"
        s = Podman("rootful", share).run("save", "--format", "oci-archive", "-o", str(archive), image)
        assert s.returncode == 0, s.stderr
        archive.chmod(0o644)
        ld = p.run("load", "-i", str(archive))
        archive.unlink()
        if ld.returncode != 0:
            pytest.fail(f"rootless podman load failed: {harness.first_line(ld.stderr)}")
    return p


@pytest.fixture(params=["rootful", "rootless"])
def podman(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="session")
def docker(share, image):
    """Debian's dockerd, started for this session with its own data root and
    socket (no bridge, no iptables; rlimits as in containers.conf), the image
    loaded from podman's storage; stopped at the end."""
    if os.getuid() != 0:
        pytest.skip(f"dockerd needs root; this is uid {os.getuid()}")
    if not shutil.which("dockerd"):
        pytest.skip("dockerd is not installed (Debian's docker.io; .ci/run installs it)")
    d = share / "docker"
    d.mkdir()
    sock = f"unix://{d}/docker.sock"
    ulimits = [a for u in harness.ulimits() for a in ("--default-ulimit", u)]
    log = open(d / "log", "w")
    proc = subprocess.Popen(["dockerd", "--data-root", str(d / "root"), "--exec-root", str(d / "exec"), "-H", sock,
                             "--pidfile", str(d / "pid"), "--bridge", "none", "--iptables=false", "--ip-masq=false",
                             *ulimits], stdout=log, stderr=log, start_new_session=True)
    rt = harness.Runtime("docker", "rootful", share, docker_host=sock)
    try:
        _wait_for(rt, proc, d / "log")
        save = subprocess.Popen(Podman("rootful", share).argv("save", "--format", "docker-archive", image),
                                stdout=subprocess.PIPE, env=rt.env)
        ld = subprocess.run(rt.argv("load"), stdin=save.stdout, capture_output=True, text=True, env=rt.env)
        assert save.wait() == 0 and ld.returncode == 0, ld.stderr
        yield rt
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        subprocess.run(["umount", "-R", str(d / "exec")], capture_output=True)
        subprocess.run(["umount", "-R", str(d / "root")], capture_output=True)


def _wait_for(rt, proc, log):
    """Until dockerd answers (at most 180 s: on a fresh machine its first start,
    containerd's included, has taken longer than 10 s); the tail of its log if
    it never does. A `docker version` that hangs is retried, not fatal."""
    end = time.monotonic() + 180
    while time.monotonic() < end and proc.poll() is None:
        try:
            if rt.run("version", timeout=30).returncode == 0:
                return
        except subprocess.TimeoutExpired:
            pass
        time.sleep(0.5)
    state = "exited" if proc.poll() is not None else "still not answering"
    tail = " | ".join(harness.first_line(l) for l in log.read_text().splitlines()[-5:])
    (pytest.fail if os.environ.get("CI") else pytest.skip)(f"dockerd {state} after 180 s: {tail}")


@pytest.fixture(params=["rootful", "rootless", "docker"])
def anyrt(request):
    """Each runtime that runs here: podman rootful and rootless, docker."""
    return request.getfixturevalue(request.param)
