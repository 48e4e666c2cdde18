#!/usr/bin/env python3
"""A stand-in for the Hugging Face Hub's file API on 127.0.0.1, for membill's tests.

    hub_server.py ROOT PORT_FILE

serves ROOT/ORG/NAME/COMMIT/FILE as GET /ORG/NAME/resolve/REVISION/FILE, where REVISION is a
commit or a branch named by ROOT/ORG/NAME/refs/BRANCH. It answers as the Hub does: X-Repo-Commit
on every answer of a repo, ETag on small files, and for *.safetensors (LFS files) a 302 to a
storage URL with X-Linked-Etag (sha256) and X-Linked-Size; range requests on every file; 401
RepoNotFound, 404 RevisionNotFound and EntryNotFound. What a repo folder holds changes how it
answers:
    GATED       the token it wants (401 GatedRepo without one, 403 GatedRepo with another)
    LOOP        every file redirects to itself
    STALL       the answer waits 60 s before its first byte
    TRUNCATE    whole-file answers stop half-way (Content-Length says the whole)
    CUT_ONCE    the next whole-file or open-range answer of a .safetensors stops half-way, once
    NO_RANGE    range requests are ignored (200 and the whole file)
Every request is appended to ROOT/requests.log as "GET PATH RANGE AUTH". The port it listens on
is written to PORT_FILE once it listens.
"""
import hashlib
import http.server
import os
import re
import sys
import time
import urllib.parse

ROOT = sys.argv[1]


DIGESTS = {}


def digest(path, kind):
    """A file's sha256 or sha1, computed once (weights run to hundreds of MB)."""
    key = (path, os.path.getmtime(path), kind)
    if key not in DIGESTS:
        h = hashlib.new(kind)
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        DIGESTS[key] = h.hexdigest()
    return DIGESTS[key]


def log(line):
    with open(os.path.join(ROOT, "requests.log"), "a") as f:
        f.write(line + "\n")


class Hub(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, *args):
        pass

    def send(self, status, headers=(), body=b""):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def error(self, status, code, commit=None):
        headers = [("X-Error-Code", code), ("X-Error-Message", code)]
        if commit:
            headers.append(("X-Repo-Commit", commit))
        self.send(status, headers, code.encode())

    def do_GET(self):
        rng = self.headers.get("Range", "-")
        auth = self.headers.get("Authorization", "-")
        log("GET %s %s %s" % (self.path, rng, auth))
        path = urllib.parse.unquote(self.path)
        m = re.match(r"^/cdn/([^/]+)/([^/]+)/([0-9a-f]{40})/(.+)$", path)
        if m:
            return self.storage(os.path.join(ROOT, m.group(1), m.group(2)), m.group(3), m.group(4))
        m = re.match(r"^/([^/]+)/([^/]+)/resolve/([^/]+)/(.+)$", path)
        if not m:
            return self.error(404, "NotFound")
        org, name, rev, file = m.groups()
        repo = os.path.join(ROOT, org, name)
        if not os.path.isdir(repo):
            return self.error(401, "RepoNotFound")
        gated = os.path.join(repo, "GATED")
        if os.path.exists(gated):
            want = "Bearer " + open(gated).read().strip()
            if auth == "-":
                return self.error(401, "GatedRepo")
            if auth != want:
                return self.error(403, "GatedRepo")
        if os.path.exists(os.path.join(repo, "STALL")):
            time.sleep(60)
            return
        if os.path.exists(os.path.join(repo, "LOOP")):
            return self.send(302, [("Location", self.path)])
        commit = rev
        ref = os.path.join(repo, "refs", rev)
        if os.path.isfile(ref):
            commit = open(ref).read().strip()
        if not re.match(r"^[0-9a-f]{40}$", commit) or not os.path.isdir(os.path.join(repo, commit)):
            return self.error(404, "RevisionNotFound")
        full = os.path.join(repo, commit, file)
        if not os.path.isfile(full):
            return self.error(404, "EntryNotFound", commit)
        if file.endswith(".safetensors"):
            headers = [("X-Repo-Commit", commit), ("X-Linked-Etag", '"%s"' % digest(full, "sha256")),
                       ("X-Linked-Size", str(os.path.getsize(full))), ("ETag", '"%s"' % digest(full, "sha1")),
                       ("Location", "/cdn/%s/%s/%s/%s" % (org, name, commit, file))]
            return self.send(302, headers)
        self.body(repo, full, [("X-Repo-Commit", commit), ("ETag", '"%s"' % digest(full, "sha1"))], file)

    def storage(self, repo, commit, file):
        full = os.path.join(repo, commit, file)
        if not os.path.isfile(full):
            return self.error(404, "NotFound")
        self.body(repo, full, [], file)

    def body(self, repo, full, headers, file):
        size = os.path.getsize(full)
        rng = self.headers.get("Range")
        m = re.match(r"^bytes=(\d+)-(\d*)$", rng or "")
        if m and not os.path.exists(os.path.join(repo, "NO_RANGE")):
            a = int(m.group(1))
            b = int(m.group(2)) if m.group(2) else size - 1
            if a >= size:
                return self.send(416, headers + [("Content-Range", "bytes */%d" % size)])
            b = min(b, size - 1)
            headers = headers + [("Content-Range", "bytes %d-%d/%d" % (a, b, size))]
            cut = not m.group(2) and self.cut_once(repo, file)
            return self.partial(206, headers, full, a, b + 1 - a, cut)
        cut = os.path.exists(os.path.join(repo, "TRUNCATE")) or self.cut_once(repo, file)
        self.partial(200, headers, full, 0, size, cut)

    def cut_once(self, repo, file):
        marker = os.path.join(repo, "CUT_ONCE")
        if file.endswith(".safetensors") and os.path.exists(marker):
            os.unlink(marker)
            return True
        return False

    def partial(self, status, headers, full, start, length, cut):
        """length bytes of the file from start (half of them when cut), Content-Length the whole."""
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        left = length // 2 if cut else length
        with open(full, "rb") as f:
            f.seek(start)
            while left > 0:
                block = f.read(min(left, 1 << 20))
                if not block:
                    break
                self.wfile.write(block)
                left -= len(block)
        self.wfile.flush()


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
server.daemon_threads = True
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
server.serve_forever()
