"""Kamailio on the store's PostgreSQL (`kamailio-config --db`): the agents' registrations are written
through to the `location` table, so a Kamailio restart loses none of them, and the workers are rows
of `dispatcher`. Raw UDP on loopback: a socket plays a worker (a row of the dispatcher table) and
another plays bob's phone."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid

import pytest

from callcenter.lab.balancer import KamailioProcess
from tests.conftest import free_udp_port, wait_for
from tests.sipraw import RawUac, request
from tests.test_security_agents import PASSWORDS, Uac, _register

pytestmark = [pytest.mark.sip, pytest.mark.slow]
if not shutil.which("kamailio"):
    pytest.skip("kamailio is needed (scripts/setup installs it)", allow_module_level=True)


def test_a_kamailio_restart_loses_no_registration(tmp_path, postgres_server):
    url = postgres_server.new_database()
    balancer = free_udp_port()
    worker = RawUac()  # a worker, as far as Kamailio knows: its address is a row of the dispatcher table
    phone = Uac()  # bob's phone
    env = dict(os.environ, BOB_PW=PASSWORDS["bob"])
    subprocess.run([sys.executable, "-m", "callcenter.cli", "kamailio-config", "--worker",
                    f"sip:127.0.0.1:{worker.local[1]}", "--listen", f"127.0.0.1:{balancer}", "--out",
                    str(tmp_path / "cfg"), "--agent", "bob=BOB_PW", "--db", url], check=True, env=env,
                   capture_output=True)
    cfg, log, pid = tmp_path / "cfg" / "kamailio.cfg", tmp_path / "kamailio.log", tmp_path / "k.pid"
    assert "BOB_PW" not in cfg.read_text() and PASSWORDS["bob"] not in cfg.read_text()  # HA1 in the table only
    name = url.rsplit("/", 1)[1]
    assert postgres_server.sql("SELECT destination FROM dispatcher", name) == f"sip:127.0.0.1:{worker.local[1]}"
    kam = KamailioProcess(cfg, log, pid)
    try:
        kam_addr = ("127.0.0.1", balancer)
        assert wait_for(lambda: _register(phone, kam_addr, "bob", [f"sip:bob@127.0.0.1:{phone.local[1]}"]) == 200,
                        10), log.read_text()[-2000:]
        assert postgres_server.sql("SELECT username FROM location", name) == "bob"  # written through
        kam.stop()
        kam = KamailioProcess(cfg, log, pid)
        kam.wait_ready(*kam_addr)
        # the worker rings bob through the restarted balancer: his phone, registered before, rings
        call_id = f"{uuid.uuid4().hex}@127.0.0.1"
        worker.send(request("INVITE", f"sip:bob@127.0.0.1:{balancer}", worker.local, call_id, "w1", 1,
                            body="v=0\r\n"), kam_addr)
        phone.sock.settimeout(5)
        got = b""
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and not got.startswith(b"INVITE"):
            try:
                got = phone.sock.recvfrom(65535)[0]
            except socket.timeout:
                break
        assert got.startswith(b"INVITE sip:bob@127.0.0.1"), (got[:200], log.read_text()[-2000:])
    finally:
        kam.stop()
        worker.close()
        phone.close()
