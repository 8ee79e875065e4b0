"""The README's first five minutes, as written: step 3's smoke test is taken
from README.md and run by bash exactly as it stands there, in a directory
where its `target/release/sandmux` is the binary under test."""

import json
import os
import re
import subprocess
import tempfile

from conftest import BIN, ROOT


def smoke_block():
    text = (ROOT / "README.md").read_text()
    step = text.index("**A smoke test with a real tool call**")
    m = re.search(r"```sh\n(.*?)```", text[step:], re.S)
    assert m, "README's step 3 has no sh block"
    return m.group(1)


def test_the_readme_smoke_test_runs_as_written():
    block = smoke_block()
    assert "target/release/sandmux" in block, block
    with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as state:
        os.makedirs(os.path.join(d, "target", "release"))
        os.symlink(BIN, os.path.join(d, "target", "release", "sandmux"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMUX_")}
        env["XDG_STATE_HOME"] = state
        r = subprocess.run(["bash", "-c", block], cwd=d, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    last = json.loads(r.stdout.strip().splitlines()[-1])
    result = json.loads(last["result"]["content"][0]["text"])
    # What the README says the last line holds.
    assert result["output"] == "hello from sandmux" and result["exit_status"] == 0, last
