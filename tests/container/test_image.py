"""The image container/build makes: reproducible, within its size budget,
root by default, serve on the audit volume, what a pane needs inside, and a
shipped seccomp profile that loosens exactly what docs/container.md says."""

import json
import re
import subprocess

import pytest

import harness
from harness import IMAGE, Podman

DOC = harness.ROOT / "docs" / "container.md"


def inspect(podman, ref):
    p = podman.run("image", "inspect", ref)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)[0]


def in_image(podman, script):
    p = podman.run("run", "--rm", "--network", "none", "--entrypoint", "/usr/bin/bash", IMAGE, "-c", script)
    assert p.returncode == 0, f"{script}: {p.stderr}"
    return p.stdout


def test_two_builds_give_the_same_layer_and_image(rootful, share):
    """A second build of the same binary (the image fixture's SANDMUX_BIN)
    and package versions: the same layer digest and image id."""
    tag = "localhost/sandmux:repro-test"
    b = subprocess.run([str(harness.ROOT / "container" / "build"), "--tag", tag, harness.BIN],
                       capture_output=True, text=True, timeout=600)
    assert b.returncode == 0, b.stderr
    try:
        one, two = inspect(rootful, IMAGE), inspect(rootful, tag)
        assert one["RootFS"]["Layers"] == two["RootFS"]["Layers"]
        assert len(one["RootFS"]["Layers"]) == 1
        assert one["Id"] == two["Id"]
    finally:
        rootful.run("rmi", tag)


def test_size_is_within_the_documented_budget(rootful):
    m = re.search(r"[Ss]ize\s+budget:\s+\*\*(\d+) MiB\*\*", DOC.read_text())
    assert m, f"{DOC} states no 'Size budget: **N MiB**'"
    size = inspect(rootful, IMAGE)["Size"]
    assert size <= int(m.group(1)) * 1024 * 1024, f"image is {size / 2**20:.1f} MiB, budget {m.group(1)} MiB"


def test_config_root_sandmux_serve_and_the_audit_volume(rootful):
    c = inspect(rootful, IMAGE)["Config"]
    assert c["Entrypoint"] == ["/usr/bin/sandmux"]
    assert c["Cmd"] == ["serve", "--profile", "container"]
    assert c.get("User") in ("0:0", "0", "root")
    assert "/var/lib/sandmux/audit" in c["Volumes"]
    assert "LANG=C.UTF-8" in c["Env"] and "XDG_STATE_HOME=/var/lib" in c["Env"]
    assert c["WorkingDir"] == "/workspace"


def test_tmux_locale_terminfo_and_etc_inside(rootful):
    out = in_image(rootful, "tmux -V; locale -a; sandmux --version; ls /usr/share/terminfo/t/tmux-256color "
                   "/lib/terminfo/t/tmux-256color 2>/dev/null; stat -c '%a %U %G' /etc/shadow /var/lib/sandmux/audit; "
                   "cut -d: -f1,3 /etc/passwd; readlink /bin; ls /usr/share/man 2>&1 | head -1")
    tmux = re.search(r"tmux (\d+)\.(\d+)", out)
    assert tmux and (int(tmux.group(1)), int(tmux.group(2))) >= (3, 3), out
    assert "C.utf8" in out and "sandmux " in out and "tmux-256color" in out, out
    assert "640 root shadow" in out and "700 root root" in out, out
    assert "root:0" in out and "nobody:65534" in out and "usr/bin" in out, out
    assert "No such file" in out, "manuals are pruned"


def _rules(path):
    """name -> the sorted rules (action, args, includes, excludes) naming it."""
    out = {}
    for s in json.loads(path.read_text())["syscalls"]:
        key = json.dumps([s["action"], s.get("args") or [], s.get("includes") or {}, s.get("excludes") or {},
                          s.get("errnoRet")], sort_keys=True)
        for n in s["names"]:
            out.setdefault(n, []).append(key)
    return {n: sorted(r) for n, r in out.items()}


@pytest.mark.skipif(not harness.PODMAN_SECCOMP.exists(), reason=f"{harness.PODMAN_SECCOMP} is not installed")
def test_the_shipped_seccomp_profile_loosens_only_the_hostname_calls():
    """container/seccomp.json is podman's default (containers-common) with
    sethostname and setdomainname allowed without CAP_SYS_ADMIN, and nothing
    else changed (docs/container.md: what each flag loosens)."""
    ours, theirs = _rules(harness.SECCOMP), _rules(harness.PODMAN_SECCOMP)
    changed = {n for n in ours.keys() | theirs.keys() if ours.get(n) != theirs.get(n)}
    assert changed == {"sethostname", "setdomainname"}, changed
    for n in changed:
        assert ours[n] == [json.dumps(["SCMP_ACT_ALLOW", [], {}, {}, None], sort_keys=True)], ours[n]
    a, b = json.loads(harness.SECCOMP.read_text()), json.loads(harness.PODMAN_SECCOMP.read_text())
    assert {k: v for k, v in a.items() if k != "syscalls"} == {k: v for k, v in b.items() if k != "syscalls"}
