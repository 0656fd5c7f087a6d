"""A TCP proxy that delays every byte by a fixed time in each direction (the kernel here has no
netem). Run inside a test namespace by netns.py:

    delay_proxy.py LISTEN_HOST:PORT TARGET_HOST:PORT DELAY_MS

Its first line on stdout is `listening on HOST:PORT`. Each accepted connection gets its own
connection to the target; what is read on one side is written to the other DELAY_MS later, in
order. A side that closes is shut down for writing on the other once its data is out.
Standard library only; runs until killed.
"""

import collections
import socket
import sys
import threading
import time


def pump(src, dst, delay):
    q = collections.deque()
    cv = threading.Condition()

    def reader():
        try:
            while True:
                data = src.recv(65536)
                with cv:
                    q.append((time.monotonic() + delay, data))
                    cv.notify()
                if not data:
                    return
        except OSError:
            with cv:
                q.append((time.monotonic(), b""))
                cv.notify()

    def writer():
        try:
            while True:
                with cv:
                    while not q:
                        cv.wait()
                    due, data = q.popleft()
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
        except OSError:
            for s in (src, dst):  # a broken side: break both directions
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    threading.Thread(target=reader, daemon=True).start()
    threading.Thread(target=writer, daemon=True).start()


def main():
    lhost, lport = sys.argv[1].rsplit(":", 1)
    thost, tport = sys.argv[2].rsplit(":", 1)
    delay = float(sys.argv[3]) / 1000.0
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((lhost, int(lport)))
    ls.listen(256)
    print("listening on %s:%d" % ls.getsockname(), flush=True)
    while True:
        c, _ = ls.accept()
        try:
            t = socket.create_connection((thost, int(tport)), timeout=5)
            t.settimeout(None)
        except OSError:
            c.close()
            continue
        for s in (c, t):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pump(c, t, delay)
        pump(t, c, delay)


if __name__ == "__main__":
    main()
