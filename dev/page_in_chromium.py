#!/usr/bin/python3
"""Drives serve's page (GET /) in headless Chromium through the DevTools protocol, as a user
would: types PROMPT into the prompt box, sets temperature and length, clicks Generate, waits for
the stream to end, and prints the page's output text (the prompt and the streamed reply) as JSON;
--screenshot FILE saves the page as PNG. Standard library only (its own WebSocket client).

  dev/page_in_chromium.py URL PROMPT [--temperature 0] [--max-tokens 40] [--screenshot FILE]
"""
import argparse
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


class DevTools:
    """A minimal WebSocket client (RFC 6455, text frames, client masking) for one target."""

    def __init__(self, ws_url):
        host_port, path = ws_url[len("ws://"):].split("/", 1)
        host, port = host_port.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /{path} HTTP/1.1\r\nHost: {host_port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        response = b""
        while b"\r\n\r\n" not in response:
            response += self.sock.recv(4096)
        self.buffer = response.split(b"\r\n\r\n", 1)[1]
        self.next_id = 0

    def _send(self, text):
        payload = text.encode()
        header = bytearray([0x81])
        n = len(payload)
        if n < 126:
            header.append(0x80 | n)
        elif n < 65536:
            header += bytes([0x80 | 126]) + n.to_bytes(2, "big")
        else:
            header += bytes([0x80 | 127]) + n.to_bytes(8, "big")
        mask = os.urandom(4)
        self.sock.sendall(bytes(header) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def _read(self, n):
        while len(self.buffer) < n:
            self.buffer += self.sock.recv(65536)
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def _receive(self):
        message = b""
        while True:
            first, second = self._read(2)
            n = second & 0x7F
            if n == 126:
                n = int.from_bytes(self._read(2), "big")
            elif n == 127:
                n = int.from_bytes(self._read(8), "big")
            message += self._read(n)
            if first & 0x80:
                return json.loads(message)

    def call(self, method, **params):
        self.next_id += 1
        self._send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            reply = self._receive()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def evaluate(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        return result.get("result", {}).get("value")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("prompt")
    parser.add_argument("--temperature", default="0")
    parser.add_argument("--max-tokens", default="40")
    parser.add_argument("--screenshot", default="")
    parser.add_argument("--chromium", default="chromium")
    args = parser.parse_args()
    profile = tempfile.mkdtemp(prefix="gpt2-chromium-")
    browser = subprocess.Popen(
        [args.chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--remote-debugging-port=0", f"--user-data-dir={profile}", "--window-size=1000,800",
         "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = os.path.join(profile, "DevToolsActivePort")
        for _ in range(600):
            if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
                break
            time.sleep(0.05)
        port = open(port_file).read().split()[0]
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json"))
        page = next(t for t in targets if t["type"] == "page")
        tools = DevTools(page["webSocketDebuggerUrl"])
        tools.call("Page.enable")
        tools.call("Page.navigate", url=args.url)
        for _ in range(600):
            if tools.evaluate("document.readyState") == "complete":
                break
            time.sleep(0.05)
        # Types the prompt as a user would: focus the box, then the keyboard's text.
        tools.evaluate("document.getElementById('prompt').focus()")
        tools.call("Input.insertText", text=args.prompt)
        tools.evaluate(f"document.getElementById('temperature').value = '{args.temperature}'")
        tools.evaluate(f"document.getElementById('max_tokens').value = '{args.max_tokens}'")
        tools.evaluate("document.getElementById('send').click()")
        for _ in range(1200):
            if tools.evaluate("document.body.dataset.done") == "yes":
                break
            time.sleep(0.05)
        out = tools.evaluate("document.getElementById('out').textContent")
        status = tools.evaluate("document.getElementById('status').textContent")
        if args.screenshot:
            shot = tools.call("Page.captureScreenshot", format="png")
            with open(args.screenshot, "wb") as f:
                f.write(base64.b64decode(shot["data"]))
        print(json.dumps({"out": out, "status": status}))
    finally:
        browser.terminate()
        browser.wait(timeout=30)
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
