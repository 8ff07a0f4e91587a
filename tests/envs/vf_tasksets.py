"""A small verifiers taskset for the tests, installed as a distribution into a directory.

``install(site)`` writes the package ``rollnet_vf_probe`` and its ``.dist-info`` (``METADATA``,
``RECORD``) under ``site``; with ``site`` on the import path, ``importlib.metadata`` and
verifiers find it as an installed distribution, offline. Its tasks ask to reverse a word. Two
rewards score a completion: ``correct`` (weight 1: the reply is the reversed word) and
``brief`` (weight 0.5: the reply has at most 12 characters). A completion starting with one
of the words below makes the reward function misbehave instead, as a hostile taskset would:

* ``raise`` raises; ``hang`` loops forever; ``allocate`` allocates without bound;
* ``write:PATH`` writes a file at PATH and scores 1.0 if it could;
* ``read:PATH`` reads PATH and scores 1.0 if it could;
* ``socket:PORT`` connects to 127.0.0.1:PORT and scores 1.0 if it could;
* ``spawn`` starts processes until it cannot and scores 1.0 past 1000 of them.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

NAME = "rollnet-vf-probe"
MODULE = "rollnet_vf_probe"
TASKSET = "rollnet-vf-probe"

SOURCE = '''\
"""A probe taskset for rollnet's tests."""

import os
import socket

import verifiers.v1 as vf

WORDS = ["stone", "river", "cloud", "ember", "frost", "maple", "orbit", "prism"]


class ProbeData(vf.TaskData):
    answer: str


class ProbeTask(vf.Task[ProbeData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        reply = trace.last_reply
        if reply == "raise":
            raise ValueError("the probe reward refuses this reply")
        if reply == "hang":
            while True:
                pass
        if reply == "allocate":
            hoard = []
            while True:
                hoard.append(bytearray(64 << 20))
        if reply.startswith("write:"):
            with open(reply[6:], "w") as handle:
                handle.write("written by a taskset")
            return 1.0
        if reply.startswith("read:"):
            with open(reply[5:], "rb") as handle:
                handle.read()
            return 1.0
        if reply.startswith("socket:"):
            socket.create_connection(("127.0.0.1", int(reply[7:])), timeout=2).close()
            return 1.0
        if reply == "spawn":
            children = 0
            while children < 1000:
                if os.fork() == 0:
                    import time
                    time.sleep(30)
                    os._exit(0)
                children += 1
            return 1.0
        return 1.0 if reply == self.data.answer else 0.0

    @vf.reward(weight=0.5)
    async def brief(self, trace: vf.Trace) -> float:
        return 1.0 if len(trace.last_reply) <= 12 else 0.0


class ProbeConfig(vf.TasksetConfig):
    count: int = 6
    system: str | None = None


class ProbeTaskset(vf.Taskset[ProbeTask, ProbeConfig]):
    def load(self):
        for index in range(self.config.count):
            word = WORDS[index % len(WORDS)] + str(index)
            yield ProbeTask(
                ProbeData(
                    prompt=f"Reverse the word {word}.",
                    system_prompt=self.config.system,
                    answer=word[::-1],
                ),
                self.config.task,
            )


__all__ = ["ProbeTaskset"]
'''


def install(site: Path, *, version: str = "1.0.0", source: str = SOURCE) -> Path:
    """Write the distribution under ``site`` (created); returns ``site``.

    ``site`` is made readable by everyone, as an installation is: a sandbox started by root
    runs under a user id of its own (pytest makes its temporary directories private).
    """
    package = site / MODULE
    package.mkdir(parents=True, exist_ok=True)
    site.chmod(0o755)
    files = {f"{MODULE}/__init__.py": source.encode()}
    info = f"{MODULE}-{version}.dist-info"
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {version}\n".encode()
    )
    files[f"{info}/INSTALLER"] = b"rollnet-tests\n"
    files[f"{info}/top_level.txt"] = f"{MODULE}\n".encode()
    lines = []
    for relative, content in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=")
        lines.append(f"{relative},sha256={digest.decode()},{len(content)}")
        path = site / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    lines.append(f"{info}/RECORD,,")
    (site / info / "RECORD").write_text("\n".join(lines) + "\n")
    return site
