"""A tiny Cloud Storage JSON API on loopback: what gcsfs needs to upload, download, list and delete.

Point gcsfs at it with ``STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT`` and ``token="anon"``. It keeps
objects in memory and speaks: bucket get/insert, object list (prefix, delimiter, pages), get
(metadata, or ``alt=media`` with Range), multipart and resumable uploads, delete and batch delete.
``writes`` lists the object names (``bucket/name``) in the order their uploads completed.

gcsfs's default filesystem class (``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT``, on by default) also asks the
Storage Control gRPC API for each bucket's layout, which this JSON-only fake does not speak: use
``gcsfs.core.GCSFileSystem``, or set ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` before gcsfs is imported.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, unquote, urlsplit

from loopback import LoopbackServer


class FakeGCS(LoopbackServer):
    """Buckets of objects in memory; use as a context manager and read ``endpoint``."""

    def __init__(self, buckets: tuple[str, ...] = ()):
        self.objects: dict[str, dict[str, bytes]] = {b: {} for b in buckets}  # bucket -> name -> data
        self._uploads: dict[str, tuple[str, str, bytearray]] = {}  # upload id -> (bucket, name, data so far)
        self.writes: list[str] = []  # "bucket/name" of each completed upload, oldest first
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def _handler_class(self):
        return _handler(self)

    def meta(self, bucket: str, name: str) -> dict:
        data = self.objects[bucket][name]
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        return {"kind": "storage#object", "bucket": bucket, "name": name, "size": str(len(data)),
                "generation": "1", "metageneration": "1", "contentType": "application/octet-stream",
                "md5Hash": base64.b64encode(hashlib.md5(data).digest()).decode(), "updated": now,
                "timeCreated": now, "storageClass": "STANDARD"}

    def store(self, bucket: str, name: str, data: bytes) -> tuple[int, dict]:
        self.objects[bucket][name] = bytes(data)
        self.writes.append(f"{bucket}/{name}")
        return 200, self.meta(bucket, name)

    def listing(self, bucket: str, q: dict) -> tuple[int, dict]:
        prefix, delimiter = q.get("prefix", ""), q.get("delimiter", "")
        items, prefixes = [], set()
        for name in sorted(self.objects[bucket]):
            if not name.startswith(prefix):
                continue
            cut = name.find(delimiter, len(prefix)) if delimiter else -1
            if cut >= 0:
                prefixes.add(name[:cut + len(delimiter)])
            else:
                items.append(self.meta(bucket, name))
        start, size = int(q.get("pageToken") or 0), int(q.get("maxResults") or 1000)
        page = {"kind": "storage#objects", "items": items[start:start + size], "prefixes": sorted(prefixes)}
        if start + size < len(items):
            page["nextPageToken"] = str(start + size)
        return 200, page

    def handle(self, method: str, parts: list[str], q: dict, headers, body: bytes):
        """(status, JSON or bytes, extra headers) for one request; ``parts`` is the unquoted path."""
        api, rest = parts[:3], parts[3:]  # e.g. ["storage", "v1", "b"] or ["upload", "storage", "v1"]
        if parts[:1] in (["upload"], ["download"]):
            api, rest = parts[:4], parts[4:]
        if parts == ["batch", "storage", "v1"]:
            return self.batch(headers, body)
        if api[-1] == "b" and not rest and method == "POST":
            self.objects.setdefault(json.loads(body)["name"], {})
            return 200, {"kind": "storage#bucket", "name": json.loads(body)["name"]}, {}
        bucket = rest[0] if rest else ""
        if bucket not in self.objects:
            return 404, {"error": {"code": 404, "message": f"The specified bucket does not exist: {bucket}"}}, {}
        if len(rest) == 1 and method == "GET":
            return 200, {"kind": "storage#bucket", "name": bucket, "location": "US"}, {}
        if rest[1:] == ["o"] and method == "GET":
            return (*self.listing(bucket, q), {})
        if rest[1:] == ["o"] and method == "POST" and q.get("uploadType") == "multipart":
            boundary = headers["Content-Type"].split("boundary=", 1)[1].strip('"').encode()
            meta, data = [_part(s) for s in body.split(b"--" + boundary)[1:3]]
            meta = json.loads(meta)
            return (*self.store(bucket, meta.get("name") or q["name"], data), {})
        if rest[1:] == ["o"] and q.get("uploadType") == "resumable":
            if "upload_id" not in q:
                upload = str(next(self._ids))
                self._uploads[upload] = (bucket, json.loads(body or b"{}").get("name") or q["name"], bytearray())
                location = f"{self.endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=resumable&upload_id={upload}"
                return 200, {}, {"Location": location}
            _, name, data = self._uploads[q["upload_id"]]
            data.extend(body)
            total = re.search(r"/(\d+|\*)$", headers.get("Content-Range", "*/*")).group(1)
            if total != "*" and len(data) >= int(total):
                del self._uploads[q["upload_id"]]
                return (*self.store(bucket, name, data), {})
            return 308, b"", {"Range": f"bytes=0-{len(data) - 1}"} if data else {}
        if len(rest) == 3 and rest[1] == "o":
            name = rest[2]
            if name not in self.objects[bucket]:
                return 404, {"error": {"code": 404, "message": f"No such object: {bucket}/{name}"}}, {}
            if method == "DELETE":
                del self.objects[bucket][name]
                return 204, b"", {}
            if q.get("alt") == "media":
                data = self.objects[bucket][name]
                found = re.match(r"bytes=(\d+)-(\d*)", headers.get("Range", ""))
                if not found:
                    return 200, data, {}
                end = int(found.group(2)) + 1 if found.group(2) else len(data)
                return 206, data[int(found.group(1)):end], {}
            return 200, self.meta(bucket, name), {}
        return 400, {"error": {"code": 400, "message": f"the fake does not implement {method} {parts}"}}, {}

    def batch(self, headers, body: bytes):
        """A batch of DELETEs: each answered in its own multipart/mixed part."""
        answers = []
        for target in re.findall(rb"DELETE (\S+) HTTP/1.1", body):
            parts = [unquote(p) for p in urlsplit(target.decode()).path.strip("/").split("/")]
            status = self.handle("DELETE", parts, {}, {}, b"")[0]
            answers.append(f"Content-Type: application/http\r\n\r\nHTTP/1.1 {status} {'No Content' if status == 204 else 'Not Found'}\r\n\r\n{{}}\r\n")
        text = "".join(f"--batch_fake\r\n{a}" for a in answers) + "--batch_fake--\r\n"
        return 200, text.encode(), {"Content-Type": "multipart/mixed; boundary=batch_fake"}


def _part(section: bytes) -> bytes:
    """The body of one multipart section (gcsfs writes bare \\n line ends, others \\r\\n)."""
    section = section.removeprefix(b"\r\n").removeprefix(b"\n")
    body = re.split(rb"\r?\n\r?\n", section, maxsplit=1)[1]
    return body.removesuffix(b"\r\n") if body.endswith(b"\r\n") else body.removesuffix(b"\n")


def _handler(gcs: FakeGCS):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self):
            url = urlsplit(self.path)
            parts = [unquote(p) for p in url.path.strip("/").split("/")]
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                with gcs._lock:
                    status, payload, extra = gcs.handle(self.command, parts, query, self.headers, body)
            except Exception as exc:  # a request the fake cannot parse: say so instead of hanging up
                status, payload, extra = 500, {"error": {"code": 500, "message": f"fake GCS: {exc!r}"}}, {}
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            for key, value in {"Content-Type": "application/json", **extra}.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _serve

        def log_message(self, *args):
            pass

    return Handler


__all__ = ["FakeGCS"]
