#!/usr/bin/env python3
"""Re-measures issue #35's admission numbers against a real `veil serve` on loopback.

Starts `veil serve` (TLS, a fresh state directory), opens 30 idle TCP connections and 8 clients
that finish TLS, send a Veil hello and go quiet -- each reopened as soon as the server drops it --
then runs one honest `veil classify` and reports: whether it was served and how long it took, how
long the server held each quiet client (no slot may be held past the fixed set-up deadline, 120 s
by default), and the server's thread count once the attackers stop.

    python3 scripts/admission_measure.py --veil target/debug/veil --model default --hold 130

Standard library only; the attackers speak TLS without checking the server's certificate (they
are not Veil clients, only load).
"""

import argparse
import os
import re
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time

VERSION = 4


def hello(tokens):
    body = b"VEIL" + struct.pack("<II", VERSION, tokens)
    return struct.pack("<I", len(body)) + body


def until_closed(sock, stop):
    sock.settimeout(0.2)
    while not stop.is_set():
        try:
            if not sock.recv(4096):
                return
        except (socket.timeout, TimeoutError):
            continue
        except OSError:
            return


def idle(addr, stop, counts):
    while not stop.is_set():
        try:
            s = socket.create_connection(addr, timeout=5)
        except OSError:
            time.sleep(0.05)
            continue
        counts["idle"] += 1
        until_closed(s, stop)
        s.close()


def quiet(addr, stop, holds):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    while not stop.is_set():
        try:
            raw = socket.create_connection(addr, timeout=5)
            s = ctx.wrap_socket(raw, server_hostname="veil-server")
            start = time.monotonic()
            s.sendall(hello(16))
        except OSError:
            time.sleep(0.05)
            continue
        until_closed(s, stop)
        if not stop.is_set():
            holds.append(time.monotonic() - start)
        s.close()


def threads_of(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--veil", default="target/debug/veil")
    p.add_argument("--model", default="default")
    p.add_argument("--port", type=int, default=17935)
    p.add_argument("--idle", type=int, default=30)
    p.add_argument("--quiet", type=int, default=8)
    p.add_argument("--hold", type=float, default=130.0,
                   help="seconds to keep the attack open (past one set-up deadline)")
    p.add_argument("--serve-arg", action="append", default=[],
                   help="extra argument for veil serve (repeatable)")
    a = p.parse_args()
    addr = ("127.0.0.1", a.port)
    state = tempfile.mkdtemp(prefix="veil-admission-")
    server = subprocess.Popen(
        [a.veil, "serve", "--model", a.model, "--listen", f"{addr[0]}:{addr[1]}",
         "--state-dir", state, *a.serve_arg],
        stderr=subprocess.PIPE, text=True)
    fingerprint = None
    log = []
    for line in server.stderr:
        log.append(line)
        m = re.search(r"server fingerprint \(SHA-256 of its certificate\): ([0-9a-f]{64})", line)
        if m:
            fingerprint = m.group(1)
        if "serving" in line:
            break
    if fingerprint is None:
        sys.exit("veil serve did not start:\n" + "".join(log))
    threading.Thread(target=lambda: [log.append(l) for l in server.stderr], daemon=True).start()
    time.sleep(1.0)
    idle_threads = threads_of(server.pid)

    stop = threading.Event()
    counts = {"idle": 0}
    holds = []
    attackers = [threading.Thread(target=idle, args=(addr, stop, counts)) for _ in range(a.idle)]
    attackers += [threading.Thread(target=quiet, args=(addr, stop, holds)) for _ in range(a.quiet)]
    for t in attackers:
        t.start()
    time.sleep(3.0)

    start = time.monotonic()
    honest = subprocess.run(
        [a.veil, "classify", "--connect", f"{addr[0]}:{addr[1]}", "--model", a.model,
         "--server-fingerprint", fingerprint, "a good movie"],
        capture_output=True, text=True)
    honest_s = time.monotonic() - start
    rest = a.hold - (time.monotonic() - start)
    if rest > 0:
        time.sleep(rest)
    busy_threads = threads_of(server.pid)
    stop.set()
    for t in attackers:
        t.join()
    time.sleep(12.0)  # past the handshake deadline: every attacker's thread has ended
    after_threads = threads_of(server.pid)
    server.terminate()
    server.wait(timeout=120)

    print(f"honest veil classify: exit {honest.returncode} in {honest_s:.2f} s")
    print("  stdout:", honest.stdout.strip())
    if honest.returncode != 0:
        print("  stderr:", honest.stderr.strip())
    print(f"idle TCP connections opened: {counts['idle']} ({a.idle} at a time)")
    print(f"quiet clients dropped: {len(holds)}; longest held {max(holds, default=0):.1f} s"
          f" (set-up deadline 120 s)")
    print(f"server threads: {idle_threads} idle, {busy_threads} under attack,"
          f" {after_threads} after it")
    refusals = [l for l in log if "set-up did not finish" in l]
    print(f"server log: {len(refusals)} sessions dropped at the set-up deadline")


if __name__ == "__main__":
    main()
