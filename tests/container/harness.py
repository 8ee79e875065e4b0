"""Real podman (runc) driving the sandmux image: the runtime configurations of
docs/container.md, rootful and rootless, and `check --json` / `serve` inside
them. Nothing here stands in for podman, the kernel or sandmux."""

import json
import os
import pathlib
import pwd
import resource
import shutil
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.path.abspath(os.environ.get("SANDMUX_BIN", str(ROOT / "target" / "debug" / "sandmux")))
IMAGE = os.environ.get("SMX_IMAGE", "localhost/sandmux:dev")
SECCOMP = ROOT / "container" / "seccomp.json"
PODMAN_SECCOMP = pathlib.Path("/usr/share/containers/seccomp.json")
ROOTLESS_UID = 65534

# Namespace-creating and keyring calls that docker's default profile refuses
# to a container without CAP_SYS_ADMIN (EPERM), as moby documents it.
NO_NS_CALLS = {"unshare", "mount", "umount2", "pivot_root", "setns", "keyctl", "add_key", "request_key",
               "mount_setattr", "move_mount", "open_tree", "fsopen", "fsmount", "fsconfig", "clone", "clone3"}
CLONE_NS_FLAGS = 0x7E020000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET


def no_userns_profile():
    """podman's default seccomp profile turned into what docker's default is
    for namespaces: unshare, mount, setns and keyctl refused with EPERM,
    clone allowed only without namespace flags, clone3 ENOSYS (so libc falls
    back to clone). Built from the installed file at test time."""
    d = json.loads(PODMAN_SECCOMP.read_text())
    for s in d["syscalls"]:
        if s["action"] == "SCMP_ACT_ALLOW" and not s.get("includes") and not s.get("excludes"):
            s["names"] = [n for n in s["names"] if n not in NO_NS_CALLS]
    d["syscalls"].append({"names": ["clone"], "action": "SCMP_ACT_ALLOW", "includes": {}, "excludes": {},
                          "args": [{"index": 0, "value": CLONE_NS_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]})
    d["syscalls"].append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38, "args": [],
                          "includes": {}, "excludes": {}})
    d["defaultErrnoRet"], d["defaultErrno"] = 1, "EPERM"
    return d


def ulimits():
    """podman's rootful default rlimits (nofile 1048576, nproc 4194304) need
    CAP_SYS_RESOURCE, which these machines lack: ask for what we have (nproc
    no higher than the 32768 podman itself runs with)."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nofile = 1048576 if nofile == resource.RLIM_INFINITY else nofile
    nproc = 32768 if nproc == resource.RLIM_INFINITY else min(nproc, 32768)
    return [f"nofile={nofile}:{nofile}", f"nproc={nproc}:{nproc}"]


def containers_conf():
    """The rlimits above, and runc: crun refuses this machine's cgroup layout."""
    lims = ", ".join(f'"{u}"' for u in ulimits())
    return f'[containers]\ndefault_ulimits = [{lims}]\n[engine]\nruntime = "runc"\n'



# The runtime configurations of docs/container.md's table: runtime -> name ->
# flags (paths filled in by Runtime.flags).
FLAGS = {
    "podman": {
        "defaults": [],
        "unmask": ["--security-opt", "unmask=/proc/*"],
        "seccomp": ["--security-opt", "seccomp={seccomp}"],
        "full": ["--security-opt", "unmask=/proc/*", "--security-opt", "seccomp={seccomp}"],
        "no-userns": ["--security-opt", "seccomp={no_userns}"],
        "no-userns-user": ["--security-opt", "seccomp={no_userns}", "--user", "65534:65534"],
    },
    "docker": {
        "defaults": [],
        "systempaths": ["--security-opt", "systempaths=unconfined"],
        "seccomp": ["--security-opt", "seccomp={seccomp}"],
        "full": ["--security-opt", "systempaths=unconfined", "--security-opt", "seccomp={seccomp}"],
        "defaults-user": ["--user", "65534:65534"],
    },
}


class Runtime:
    """podman rootful (as root) or rootless (uid 65534 with its own home,
    runtime directory and storage), or docker (the session's own dockerd);
    config files in a shared 0755 directory."""

    def __init__(self, tool, mode, share, docker_host=None):
        self.tool, self.mode, self.share = tool, mode, pathlib.Path(share)
        self.env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "CONTAINERS_CONF": str(self.share / "containers.conf"), "LANG": "C.UTF-8"}
        self.prefix = []
        self.exe = "podman"
        if tool == "docker":
            self.exe = "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else "docker"
            self.env["DOCKER_HOST"] = docker_host
        if mode == "rootless" and os.getuid() == 0:
            self.env.update(HOME=str(self.share / "home"), XDG_RUNTIME_DIR=str(self.share / "run"))
            self.prefix = ["setpriv", f"--reuid={ROOTLESS_UID}", f"--regid={ROOTLESS_UID}", "--clear-groups", "--"]
        else:
            self.env.update({k: os.environ[k] for k in ("HOME", "XDG_RUNTIME_DIR") if k in os.environ})

    def __repr__(self):
        return f"{self.tool}-{self.mode}"

    def argv(self, *args):
        return [*self.prefix, self.exe, *args]

    def run(self, *args, timeout=120, input=None):
        return subprocess.run(self.argv(*args), env=self.env, capture_output=True, text=True,
                              timeout=timeout, input=input)

    def flags(self, name):
        paths = {"seccomp": self.share / "seccomp.json", "no_userns": self.share / "no-userns.json"}
        return [f.format(**paths) for f in FLAGS[self.tool][name]]

    def check(self, flags, profile, *extra):
        """`sandmux check -p PROFILE --json` in a fresh container: (status,
        the report or None, stderr)."""
        # A container's own root cannot hold the copy-on-write layer
        # (overlayfs over overlayfs): the built-ins that require the mount
        # layer run live there (docs/container.md); `container` falls back.
        live = [] if profile == "container" else ["--workspace-mode", "live"]
        p = self.run("run", "--rm", "--network", "none", *self.flags(flags), *extra, IMAGE,
                     "check", "-p", profile, *live, "--json")
        try:
            rep = json.loads(p.stdout)
        except ValueError:
            rep = None
        return p.returncode, rep, p.stderr


def Podman(mode, share):
    return Runtime("podman", mode, share)


def dropped(report):
    return sorted(l["layer"] for l in report["layers"] if not l["enforced"])


def first_line(text):
    return next((l for l in (text or "").splitlines() if l.strip()), "")


def rootless_unavailable():
    """Why rootless podman as uid 65534 cannot run here, or None."""
    name = pwd.getpwuid(ROOTLESS_UID).pw_name if _has_uid(ROOTLESS_UID) else str(ROOTLESS_UID)
    if os.getuid() not in (0, ROOTLESS_UID):
        return f"rootless runs as uid {ROOTLESS_UID}; this is uid {os.getuid()}"
    for tool in ("newuidmap", "newgidmap"):
        if not shutil.which(tool):
            return f"{tool} is missing (apt-get install uidmap)"
    for f in ("/etc/subuid", "/etc/subgid"):
        try:
            lines = pathlib.Path(f).read_text().split()
        except OSError:
            return f"{f} does not exist: rootless podman needs a range for {name} (.ci/run adds '{name}:300000:65536')"
        if not any(l.split(":")[0] in (name, str(ROOTLESS_UID)) for l in lines):
            return f"{f} has no range for {name} (uid {ROOTLESS_UID}); .ci/run adds '{name}:300000:65536'"
    return None


def _has_uid(uid):
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False
