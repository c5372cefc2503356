"""The raw-TCP floor: two Python processes exchanging length-prefixed pickles over a socket.

``rawtcp.py server PORT`` serves calls; ``rawtcp.py client PORT KINDS SIZES OUTFILE`` measures
the same small-call and payload workloads as worker.py.
"""

import json
import pickle
import socket
import struct
import sys
import time

from common import add, echo, make_payload, percentiles, sink


def recv_exact(sock, n):
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("peer closed")
        got += k
    return buf


def send_msg(sock, obj):
    data = pickle.dumps(obj, protocol=5)
    sock.sendall(struct.pack("!Q", len(data)))
    sock.sendall(data)


def recv_msg(sock):
    (n,) = struct.unpack("!Q", recv_exact(sock, 8))
    return pickle.loads(recv_exact(sock, n))


def serve(port):
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", port))
    lsock.listen(1)
    conn, _ = lsock.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while True:
            func, args = recv_msg(conn)
            if func is None:
                return
            send_msg(conn, func(*args))
    except ConnectionError:
        return


def client(port, kinds, sizes, outfile):
    sock = None
    for _ in range(200):
        try:
            sock = socket.create_connection(("127.0.0.1", port))
            break
        except OSError:
            time.sleep(0.05)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def call(func, *args):
        send_msg(sock, (func, args))
        return recv_msg(sock)

    out = {}
    for _ in range(300):
        call(add, 1, 2)
    samples = []
    for _ in range(3000):
        t0 = time.perf_counter()
        call(add, 1, 2)
        samples.append(time.perf_counter() - t0)
    out["sync_p50_us"], out["sync_p99_us"] = (x * 1e6 for x in percentiles(samples))
    for kind in kinds.split(","):
        for size in [int(s) for s in sizes.split(",")]:
            payload = make_payload(kind, size)
            reps = int(min(200, max(3, (256 << 20) // size)))
            for mode, fn in (("oneway", sink), ("echo", echo)):
                call(fn, payload)
                start = time.perf_counter()
                for _ in range(reps):
                    call(fn, payload)
                elapsed = time.perf_counter() - start
                out[f"{mode}_{kind}_{size}_GBps"] = size * reps * (2 if mode == "echo" else 1) / elapsed / 1e9
    send_msg(sock, (None, ()))
    with open(outfile, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        serve(int(sys.argv[2]))
    else:
        client(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
