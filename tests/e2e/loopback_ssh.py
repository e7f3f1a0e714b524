"""An sshd of the test's own on a free loopback port, and an ssh config that names it ``node1`` and ``node2``: the
hostfile path of a multi-node DeepSpeed job (the launcher reaches every host with pdsh over ssh) on one machine,
touching nothing of the user's.

- Keys are made here, in the test's temporary directory: the server's host key (pinned in a known_hosts file of
  its own, checked strictly) and the client key its authorized_keys file lists.
- The server listens on 127.0.0.1 only, with a config of its own (keys only: no passwords, no PAM), in the
  foreground (``-D``), so the test holds its pid and stops it by that pid.
- The client side is an ssh config read with ``-F``, through an ``ssh`` put first on the launcher's PATH: DeepSpeed's
  reachability check (``ssh node1 hostname``) and pdsh's ssh both read it, as both read ``~/.ssh/config`` for a user,
  while the user's own ``~/.ssh`` is never read or written.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.launching import free_port

HOSTS = ("node1", "node2")
_HOST_KEY_ALIAS = "hf-lora-ds-loopback-sshd"


def ssh_tools() -> dict[str, str]:
    """The programs the hostfile path needs, or a skip that names the missing ones."""
    found = {
        name: shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")
        for name in ("sshd", "ssh", "ssh-keygen", "pdsh")
    }
    missing = sorted(name for name, path in found.items() if path is None)
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (apt-get install openssh-server pdsh; .ci/run does)")
    if os.geteuid() == 0 and not Path("/run/sshd").is_dir():
        pytest.skip("sshd run as root needs its privilege separation directory: mkdir -p /run/sshd (.ci/run does)")
    return found


def _keygen(ssh_keygen: str, path: Path) -> str:
    subprocess.run([ssh_keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


@contextmanager
def loopback_sshd(root: Path) -> Iterator[dict[str, str]]:
    """Start the sshd, yield the environment a launcher needs to reach ``node1``/``node2`` through it (PATH with the
    configured ``ssh`` first), and stop the sshd by its pid."""
    tools = ssh_tools()
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    host_key = root / "host_ed25519"
    host_public = _keygen(tools["ssh-keygen"], host_key)
    client_key = root / "client_ed25519"
    (root / "authorized_keys").write_text(_keygen(tools["ssh-keygen"], client_key) + "\n")
    (root / "known_hosts").write_text(f"{_HOST_KEY_ALIAS} {host_public}\n")
    (root / "sshd_config").write_text(
        f"ListenAddress 127.0.0.1\nPort {port}\nHostKey {host_key}\nPidFile {root / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {root / 'authorized_keys'}\n"
        "StrictModes no\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PubkeyAuthentication yes\nPermitRootLogin prohibit-password\nUseDNS no\nPrintMotd no\n"
    )
    (root / "ssh_config").write_text(
        f"Host {' '.join(HOSTS)}\n    HostName 127.0.0.1\n    Port {port}\n    User {getpass.getuser()}\n"
        f"    IdentityFile {client_key}\n    IdentitiesOnly yes\n    BatchMode yes\n"
        f"    HostKeyAlias {_HOST_KEY_ALIAS}\n    UserKnownHostsFile {root / 'known_hosts'}\n"
        "    StrictHostKeyChecking yes\n    LogLevel ERROR\n"
    )
    bin_dir = root / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(f'#!/bin/sh\nexec {tools["ssh"]} -F {root / "ssh_config"} "$@"\n')
    ssh.chmod(0o755)

    log = open(root / "sshd.log", "w")
    sshd = subprocess.Popen(
        [tools["sshd"], "-D", "-e", "-f", str(root / "sshd_config")], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        _wait_for_port(port, sshd, root / "sshd.log")
        yield {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    finally:
        sshd.terminate()  # by its pid: the listener; the sessions it forked ended with the launch
        try:
            sshd.wait(timeout=30)
        except subprocess.TimeoutExpired:
            sshd.kill()
            sshd.wait()
        log.close()


def _wait_for_port(port: int, sshd: subprocess.Popen, log: Path, timeout_s: float = 120) -> None:
    """Polls until sshd listens; ``timeout_s`` catches an sshd that never does (a hang), not a slow start."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sshd.poll() is not None:
            raise RuntimeError(f"sshd exited with {sshd.returncode}:\n{log.read_text()[-3000:]}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"sshd did not listen on 127.0.0.1:{port} within {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")
