"""Host toolchains lent to the sandbox (issue 26): `--toolchain NAME` finds
them where their installers put them, binds them read-only, puts their bin
first on PATH and their caches in the sandbox's home; credentials and the
host's caches stay out; `sandbox_status` lists them. A toolchain the
sandbox's uid cannot read, or one not found, stops start-up with a clear
error (as uid 65534 the rust toolchain under /root is that refusal). A
profile path that is a symlink is resolved, never a dangling link inside."""

import os
import pathlib
import subprocess

import pytest

from conftest import BIN, call, connect

pytestmark = pytest.mark.anyio


def installed(var, default):
    """The install the installer's variable names, else its default place
    under $HOME, else root's (this machine's rustup and pyenv are root's;
    as uid 65534 HOME is /nonexistent and /root cannot be searched)."""
    if os.environ.get(var):
        return pathlib.Path(os.environ[var])
    for home in [os.environ.get("HOME") or "/nonexistent", "/root"]:
        p = pathlib.Path(home) / default
        try:
            if p.exists():
                return p
        except PermissionError:
            return p
    if not os.access("/root", os.X_OK):
        return pathlib.Path("/root") / default
    pytest.skip(f"no {default} on this machine")


def readable(p):
    """Whether this uid can reach `p` (what the sandbox needs too)."""
    try:
        return os.access(p, os.R_OK | os.X_OK) and p.exists()
    except PermissionError:
        return False


def serve(ws, *extra, env=None):
    """`serve` that is expected to refuse: (exit status, stderr)."""
    work, host = ws
    e = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
    e.update(env or {})
    p = subprocess.run([BIN, "serve", "-w", str(work), "--audit-log", str(host / "a.jsonl"), *extra],
                       env=e, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    return p.returncode, p.stderr


def fake_tree(root, exe, body="echo fake"):
    """`root/bin/exe`, a shell script running `body`."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / exe).write_text(f"#!/bin/sh\n{body}\n")
    (root / "bin" / exe).chmod(0o755)
    return root


async def run(c, command, timeout=120):
    r = await call(c, "run_command", {"command": command, "timeout": timeout})
    assert r["status"] == "completed", r
    return r


async def test_rust_builds_inside_read_only_and_cargo_home_stays_out(ws, tmp_path):
    rustup = installed("RUSTUP_HOME", ".rustup")
    # A CARGO_HOME of the host's with credentials and a registry cache: it
    # is never lent; cargo's home inside is the sandbox's own.
    cargo = tmp_path / "cargo-home"
    (cargo / "registry").mkdir(parents=True)
    (cargo / "credentials.toml").write_text('[registry]\ntoken = "canary-token"\n')
    env = {"RUSTUP_HOME": str(rustup), "CARGO_HOME": str(cargo)}
    if not readable(rustup):
        # As uid 65534: /root is 0700. The refusal names the path, the uid and the fix.
        code, err = serve(ws, "--toolchain", "rust", env=env)
        assert code == 2, err
        uid = os.geteuid()
        assert f"toolchain 'rust': {rustup} cannot be read by uid {uid}" in err, err
        assert "/root is mode 0700" in err and "set RUSTUP_HOME" in err, err
        return
    before = sorted(p.name for p in cargo.rglob("*"))
    async with connect(ws, "--toolchain", "rust", env=env) as c:
        r = await run(c, "rustc --version")
        assert r["output"].startswith("rustc "), r
        r = await run(c, "echo $CARGO_HOME; command -v cargo")
        home, where = r["output"].split("\n")
        assert home == "/home/sandmux/.cargo" and where.startswith(str(rustup.resolve())), r
        r = await run(c, "cargo new -q x && cd x && cargo build --offline -q && ./target/debug/x; cd ..")
        assert r["output"].endswith("Hello, world!") and r["exit_status"] == 0, r
        # The host's cargo home is not in the view; the toolchain is read-only.
        r = await run(c, f"cat {cargo}/credentials.toml; ls {cargo}/registry; touch \"$(rustc --print sysroot)/x\"")
        assert "canary-token" not in r["output"] and r["output"].count("No such file or directory") == 2, r
        assert "Read-only file system" in r["output"], r
        st = await call(c, "sandbox_status")
        [lent] = st["toolchains"]
        assert lent["name"] == "rust" and "rustup" in lent["found"], lent
        assert lent["paths"] and all(str(p).startswith(str(rustup.resolve())) for p in lent["paths"]), lent
        assert lent["env"]["CARGO_HOME"] == "/home/sandmux/.cargo", lent
    assert (ws[0] / "x" / "target" / "debug" / "x").exists(), "the build lands in the workspace"
    assert sorted(p.name for p in cargo.rglob("*")) == before, "the host's cargo home was not written"


async def test_python_from_pyenv_and_node_from_the_view(ws):
    pyenv = installed("PYENV_ROOT", ".pyenv")
    env = {"PYENV_ROOT": str(pyenv)}
    if not readable(pyenv):
        code, err = serve(ws, "--toolchain", "python", env=env)
        assert code == 2 and f"cannot be read by uid {os.geteuid()}" in err and "set PYENV_ROOT" in err, err
        return
    async with connect(ws, "--toolchain", "python", "--toolchain", "node", env=env) as c:
        r = await run(c, "python3 -c 'import sys; print(sys.prefix)'")
        assert r["output"].startswith(str((pyenv / "versions").resolve())), r
        st = await call(c, "sandbox_status")
        lent = {t["name"]: t for t in st["toolchains"]}
        assert set(lent) == {"python", "node"}, lent
        assert "pyenv" in lent["python"]["found"], lent
        # node 20 of this machine is in /usr/bin: in the view already.
        assert lent["node"]["paths"] or lent["node"]["visible"], lent


async def test_a_fake_goroot_is_lent_with_its_caches_in_home(ws, tmp_path):
    root = fake_tree(tmp_path / "go-sdk", "go", 'echo "fake go $GOROOT $GOPATH $GOCACHE $GOMODCACHE $GOTOOLCHAIN"')
    link = tmp_path / "go-link"
    link.symlink_to(root)
    async with connect(ws, "--toolchain", "go", env={"GOROOT": str(link)}) as c:
        r = await run(c, "go")
        assert r["output"] == f"fake go {root} /home/sandmux/go /home/sandmux/.cache/go-build /home/sandmux/go/pkg/mod local", r
        [lent] = (await call(c, "sandbox_status"))["toolchains"]
        assert lent["paths"] == [str(root)] and "→" in lent["found"], lent


def test_unknown_missing_and_unreadable_toolchains_stop_start_up(ws, tmp_path):
    code, err = serve(ws, "--toolchain", "ruby")
    assert code == 2 and "unknown toolchain \"ruby\": sandmux lends rust, python, node, go" in err, err
    code, err = serve(ws, "--toolchain", "go", env={"GOROOT": str(tmp_path / "none"), "PATH": "/nonexistent"})
    assert code == 2 and "toolchain 'go' not found" in err and f"GOROOT={tmp_path}/none" in err and "set GOROOT" in err, err
    # A Go root below a directory nobody may search (mode 0): refused, for
    # root too (processes inside have no capabilities), naming uid and mode.
    locked = tmp_path / "locked"
    (locked / "go" / "bin").mkdir(parents=True)
    (locked / "go" / "bin" / "go").write_text("#!/bin/sh\n")
    locked.chmod(0)
    try:
        code, err = serve(ws, "--toolchain", "go", env={"GOROOT": str(locked / "go")})
    finally:
        locked.chmod(0o755)
    assert code == 2 and f"uid {os.geteuid()}" in err and f"{locked} is mode 0000" in err, err


PROFILE = """version = 1
description = "symlinked read-only path"
[filesystem]
read_only = ["/usr", "/etc", "?/bin", "?/lib", "?/lib64", "?/sbin", "{ro}"]
read_write = ["{{workspace}}", "{rw}"]
tmpfs = ["/tmp", "{{home}}"]
[enforcement]
best_effort = ["cgroup"]
"""


async def test_a_symlinked_profile_path_is_resolved_not_dangling(ws, tmp_path):
    sdk = fake_tree(tmp_path / "sdk-1.2", "tool", "echo tool-ran")
    link = tmp_path / "sdk"
    link.symlink_to(sdk)
    prof = tmp_path / "p.toml"
    prof.write_text(PROFILE.format(ro=link, rw="?/nonexistent"))
    async with connect(ws, "-p", str(prof)) as c:
        r = await run(c, f"{link}/bin/tool; readlink {link}")
        assert r["output"] == f"tool-ran\n{sdk}", r
        st = await call(c, "sandbox_status")
        assert f"{link} → {sdk} (the target is bound read-only for it)" in st["symlinks_resolved"], st["symlinks_resolved"]
    # A read-write path that is a symlink is refused, naming the target.
    prof.write_text(PROFILE.format(ro="?/opt", rw=link))
    code, err = serve(ws, "-p", str(prof))
    assert code == 2 and f"{link} is a symlink to {sdk}; a read-write entry is never followed" in err, err
    # A dangling one is refused too, unless optional.
    sdk.rename(tmp_path / "gone")
    prof.write_text(PROFILE.format(ro=link, rw="?/nonexistent"))
    code, err = serve(ws, "-p", str(prof))
    assert code == 2 and "target cannot be resolved" in err, err


async def test_what_the_agent_or_a_runtime_directory_could_choose_is_never_lent(ws, tmp_path):
    """From the attack review: a PATH entry in the workspace (an activated
    `.venv/bin`) whose python3 links to a file in any host directory does
    not choose what is lent (only a python3 under /usr or /opt is taken
    from PATH); a RUSTUP_HOME in the workspace is refused (its
    settings.toml would choose); a toolchain name that leaves its directory
    finds nothing; a version prefix holding npm's global config is not
    lent; a profile path that links to /run is refused."""
    work, _ = ws
    chosen = tmp_path / "chosen"
    (chosen / "x").mkdir(parents=True)
    (chosen / "x" / "y").write_text("any file\n")
    (work / ".venv" / "bin").mkdir(parents=True)
    (work / ".venv" / "bin" / "python3").symlink_to(chosen / "x" / "y")
    env = {"PATH": f"{work}/.venv/bin:/usr/bin:/bin", "PYENV_ROOT": "/nonexistent", "UV_PYTHON_INSTALL_DIR": "/nonexistent"}
    async with connect(ws, "--toolchain", "python", env=env) as c:
        [lent] = (await call(c, "sandbox_status"))["toolchains"]
        assert lent["found"].startswith("python3 on PATH: /usr/bin/python3") and lent["paths"] == [], lent
        r = await call(c, "run_command", {"command": f"ls {chosen}/x"})
        assert "No such file" in r["output"], r
    # RUSTUP_HOME in the workspace: its settings would choose the directory.
    (work / ".rustup" / "toolchains").mkdir(parents=True)
    (work / ".rustup" / "settings.toml").write_text(f'default_toolchain = "{chosen}"\n')
    code, err = serve(ws, "--toolchain", "rust", env={"RUSTUP_HOME": str(work / ".rustup")})
    assert code == 2 and "RUSTUP_HOME lies in the workspace" in err, err
    # Outside the workspace, a default that leaves toolchains/ finds nothing.
    rh = tmp_path / "rustup"
    (rh / "toolchains").mkdir(parents=True)
    fake_tree(chosen, "rustc")
    (rh / "settings.toml").write_text('default_toolchain = "../../chosen"\n')
    code, err = serve(ws, "--toolchain", "rust", env={"RUSTUP_HOME": str(rh), "PATH": "/usr/bin:/bin"})
    assert code == 2 and "toolchain 'rust' not found" in err, err
    # npm's global config inside a node version's prefix: not lent.
    nvm = tmp_path / "nvm"
    v = fake_tree(nvm / "versions" / "node" / "v20.1.0", "node")
    (v / "etc").mkdir()
    (v / "etc" / "npmrc").write_text("//registry.npmjs.org/:_authToken=DUMMY\n")
    code, err = serve(ws, "--toolchain", "node", env={"NVM_DIR": str(nvm)})
    assert code == 2 and "holds etc/npmrc" in err, err
    # A read-only profile path that links into /run: refused, not shown.
    link = tmp_path / "runlink"
    link.symlink_to("/run")
    prof = tmp_path / "p.toml"
    prof.write_text(PROFILE.format(ro=link, rw="?/nonexistent"))
    code, err = serve(ws, "-p", str(prof))
    assert code == 2 and "never shown inside" in err and "sockets" in err, err
