"""Snapshots in object storage through the S3 API (AWS S3, GCS interoperability, MinIO, Ceph, SeaweedFS, versitygw).

The ``kubernetes`` provider archives a sandbox's workspace volume with tar and streams it here; a restore streams
it back. This module knows nothing of Pods: it stores and fetches byte streams under keys it derives.

Why aiobotocore: it is botocore (the reference S3 client: signing, every error code, paging, retries) on aiohttp,
the HTTP stack kopf and ``kubernetes.aio`` already run on, so the operator gains no second async HTTP stack. What
the snapshots need of the S3 API is all there: multipart uploads that are *listed and aborted* (a crash mid-upload
must not leave parts behind that nobody can find: obstore, the other candidate, hides its upload ids) and
conditional writes (``If-None-Match: *`` on PutObject and on CompleteMultipartUpload), so the first taking of a
snapshot is the one kept whatever races it.

Memory is bounded whatever the size: an upload holds one part (``part_size``, 8 MiB by default) at a time, a
download one read chunk.

Keys. versitygw, like any store over a filesystem, keeps each object as a file: a key that is a path prefix of
another is refused, a key ending in ``/`` holds no data and ``x//y`` is ``x/y``. So every object key is
``<prefix>ks/<installation key>/<owner key>/<k|d>-<digest>.tar``: directories are hex digests that never end in
``.tar``, every object's name does, and nothing is ever stored below an object. A snapshot id is that key's
tail ``<installation key>-<owner key>-<k|d><digest>``, from which the key is derived again (restore and delete
get only the id); the digest is sha256 of the operation id, so a snapshot retried after a lost answer finds the
object already stored.

Credentials come only from the operator's configuration (environment, from a Secret the chart names); they are
never logged, never put in a message, and never given to a sandbox.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from durable_sandbox.providers.contract import (
    ConfigurationError,
    ProviderError,
    ProvisionError,
    SnapshotEntry,
    tag_key,
)
from durable_sandbox.providers.redaction import redact_url

log = logging.getLogger(__name__)

__all__ = ["S3Config", "S3SnapshotStore", "SnapshotMissing", "SnapshotName"]

DEFAULT_PART_SIZE = 8 * 1024 * 1024
MINIMUM_PART_SIZE = 5 * 1024 * 1024  # S3's minimum for every part but the last
DOWNLOAD_CHUNK = 1024 * 1024
_NO_TAG = "0" * 12
_ID = re.compile(r"([0-9a-f]{12})-([0-9a-f]{12})-([kd])([0-9a-f]{40})")

# What the environment calls each setting (the chart sets them from values and a Secret).
ENV_ENDPOINT = "DSB_S3_ENDPOINT"
ENV_BUCKET = "DSB_S3_BUCKET"
ENV_PREFIX = "DSB_S3_PREFIX"
ENV_REGION = "DSB_S3_REGION"
ENV_ACCESS_KEY = "DSB_S3_ACCESS_KEY_ID"
ENV_SECRET_KEY = "DSB_S3_SECRET_ACCESS_KEY"
ENV_SESSION_TOKEN = "DSB_S3_SESSION_TOKEN"
ENV_ADDRESSING = "DSB_S3_ADDRESSING_STYLE"

# The errors S3 answers when the request was understood and refused for who sent it: fix the configuration.
_REFUSED_CODES = frozenset({
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled", "InvalidToken",
    "ExpiredToken", "AccountProblem", "InvalidBucketName", "PermanentRedirect", "AuthorizationHeaderMalformed",
})
_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})


class SnapshotMissing(ProvisionError):
    """The snapshot's object is not in the store (deleted, or never completed): a restore from it cannot succeed."""

    def __init__(self, snapshot_id: str) -> None:
        super().__init__(f"snapshot {snapshot_id} is not in the object store (deleted, or never completed); "
                         f"restore from another snapshot or start afresh", retryable=False)
        self.snapshot_id = snapshot_id


@dataclass(frozen=True)
class SnapshotName:
    """A snapshot's identity: the tags of the sandbox it was taken of (as :func:`tag_key` digests) and the
    digest of the operation that took it."""

    installation_key: str
    owner_key: str | None
    retained: bool
    digest: str

    @classmethod
    def for_operation(cls, operation_id: str, *, installation: str | None, owner: str | None,
                      retained: bool) -> SnapshotName:
        return cls(installation_key=tag_key(installation) if installation is not None else _NO_TAG,
                   owner_key=tag_key(owner) if owner is not None else None, retained=retained,
                   digest=hashlib.sha256(operation_id.encode()).hexdigest()[:40])

    @classmethod
    def parse(cls, snapshot_id: str) -> SnapshotName | None:
        match = _ID.fullmatch(snapshot_id)
        if match is None:
            return None
        installation, owner, kept, digest = match.groups()
        return cls(installation, None if owner == _NO_TAG else owner, kept == "k", digest)

    @property
    def id(self) -> str:
        return f"{self.installation_key}-{self.owner_key or _NO_TAG}-{'k' if self.retained else 'd'}{self.digest}"

    def key(self, prefix: str) -> str:
        return (f"{prefix}ks/{self.installation_key}/{self.owner_key or _NO_TAG}/"
                f"{'k' if self.retained else 'd'}-{self.digest}.tar")


def _normalise_prefix(prefix: str) -> str:
    parts = [p for p in prefix.split("/") if p]  # versitygw folds x//y to x/y: never send an empty component
    return "".join(f"{p}/" for p in parts)


@dataclass(frozen=True)
class S3Config:
    """Where snapshots are stored. ``endpoint`` None is AWS S3 itself (the region's endpoint)."""

    bucket: str
    access_key_id: str = field(repr=False)
    secret_access_key: str = field(repr=False)
    endpoint: str | None = None
    prefix: str = ""
    region: str = "us-east-1"
    session_token: str | None = field(default=None, repr=False)
    addressing_style: str = "path"  # what every S3-compatible server serves; AWS accepts it too
    part_size: int = DEFAULT_PART_SIZE

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ConfigurationError("; ".join(problems))
        object.__setattr__(self, "prefix", _normalise_prefix(self.prefix))

    def problems(self) -> list[str]:
        out = []
        if not self.bucket:
            out.append(f"the snapshot store needs a bucket: set {ENV_BUCKET}")
        if not self.access_key_id or not self.secret_access_key:
            out.append(f"the snapshot store needs credentials: set {ENV_ACCESS_KEY} and {ENV_SECRET_KEY} "
                       f"(from the Secret named in the chart's values)")
        if self.endpoint is not None and urlsplit(self.endpoint).scheme not in ("http", "https"):
            out.append(f"{ENV_ENDPOINT} must be an http(s) URL, got {redact_url(self.endpoint)!r}")
        if self.addressing_style not in ("path", "virtual", "auto"):
            out.append(f"{ENV_ADDRESSING} must be path, virtual or auto, got {self.addressing_style!r}")
        if self.part_size < MINIMUM_PART_SIZE:
            out.append(f"the part size must be at least {MINIMUM_PART_SIZE} bytes (S3's minimum)")
        return out

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> S3Config:
        env = os.environ if environ is None else environ
        return cls(
            bucket=env.get(ENV_BUCKET, ""), access_key_id=env.get(ENV_ACCESS_KEY, ""),
            secret_access_key=env.get(ENV_SECRET_KEY, ""), endpoint=env.get(ENV_ENDPOINT) or None,
            prefix=env.get(ENV_PREFIX, ""), region=env.get(ENV_REGION) or "us-east-1",
            session_token=env.get(ENV_SESSION_TOKEN) or None, addressing_style=env.get(ENV_ADDRESSING) or "path",
        )

    @classmethod
    def environ_problems(cls, environ: Mapping[str, str]) -> list[str]:
        try:
            cls.from_environ(environ)
        except ConfigurationError as exc:
            return [f"Sandbox provider [kubernetes]: {p}" for p in str(exc).split("; ")]
        return []

    def where(self) -> str:
        """The store as a person may be shown it: endpoint (redacted), bucket and prefix, no credentials."""
        endpoint = redact_url(self.endpoint) if self.endpoint else f"AWS S3 ({self.region})"
        return f"{endpoint} bucket {self.bucket!r}" + (f" prefix {self.prefix!r}" if self.prefix else "")


class S3SnapshotStore:
    """Puts, gets, lists and deletes snapshot archives. One aiohttp pool, opened on first use; :meth:`aclose`."""

    def __init__(self, config: S3Config) -> None:
        self.config = config
        self._stack: contextlib.AsyncExitStack | None = None
        self._client: Any = None
        self.page_size = 1000  # keys per listing page (S3's maximum; tests lower it to check paging)

    def __repr__(self) -> str:
        return f"S3SnapshotStore({self.config.where()})"

    async def _s3(self) -> Any:
        if self._client is None:
            from aiobotocore.config import AioConfig
            from aiobotocore.session import get_session

            cfg = self.config
            stack = contextlib.AsyncExitStack()
            client_config = AioConfig(
                s3={"addressing_style": cfg.addressing_style},
                retries={"max_attempts": 3, "mode": "standard"},
                connect_timeout=10, read_timeout=60,
                # Checksums only where S3 requires them: the newer default (trailing CRC on every upload) is
                # refused by several S3-compatible stores (GCS interoperability among them).
                request_checksum_calculation="when_required", response_checksum_validation="when_required",
            )
            self._client = await stack.enter_async_context(get_session().create_client(
                "s3", endpoint_url=cfg.endpoint, region_name=cfg.region, aws_access_key_id=cfg.access_key_id,
                aws_secret_access_key=cfg.secret_access_key, aws_session_token=cfg.session_token,
                config=client_config,
            ))
            self._stack = stack
        return self._client

    async def aclose(self) -> None:
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    # ------------------------------------------------------------------------------------- errors

    def _failure(self, what: str, exc: BaseException) -> ProviderError:
        """A secret-free error for a failed request: refused (configuration) or transient (retry)."""
        from botocore.exceptions import BotoCoreError, ClientError

        where = self.config.where()
        if isinstance(exc, ClientError):
            err = exc.response.get("Error", {})
            code = str(err.get("Code", "")) or "unknown"
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            message = str(err.get("Message", "")).strip()
            detail = f"{code} (HTTP {status})" + (f": {message}" if message else "")
            if code == "NoSuchBucket":
                return ConfigurationError(f"{what}: the object store {where} has no such bucket; create it, or "
                                          f"set the bucket the chart's values name")
            if code in _REFUSED_CODES or status in (401, 403):
                return ConfigurationError(f"{what}: the object store {where} refused it: {detail}; check the "
                                          f"credentials and the bucket's policy (they come from the operator's Secret)")
            error = ProviderError(f"{what}: the object store {where} answered {detail}; it will be tried again")
            error.retryable = status is None or status >= 500 or status in (408, 429)
            return error
        if isinstance(exc, BotoCoreError | OSError | TimeoutError):
            return ProviderError(f"{what}: cannot reach the object store {where} ({type(exc).__name__}); "
                                 f"it will be tried again once it answers")
        return ProviderError(f"{what}: {type(exc).__name__} talking to the object store {where}")

    @staticmethod
    def _code(exc: BaseException) -> str | None:
        from botocore.exceptions import ClientError

        if isinstance(exc, ClientError):
            return str(exc.response.get("Error", {}).get("Code", ""))
        return None

    @staticmethod
    def _handled() -> tuple[type[BaseException], ...]:
        from botocore.exceptions import BotoCoreError, ClientError

        return (ClientError, BotoCoreError, OSError, TimeoutError)

    # ------------------------------------------------------------------------------------- objects

    def key(self, name: SnapshotName) -> str:
        return name.key(self.config.prefix)

    async def exists(self, name: SnapshotName) -> bool:
        s3 = await self._s3()
        try:
            await s3.head_object(Bucket=self.config.bucket, Key=self.key(name))
        except self._handled() as exc:
            if self._code(exc) in _MISSING_CODES:
                return False
            raise self._failure(f"look up snapshot {name.id}", exc) from None
        return True

    async def put(self, name: SnapshotName, chunks: AsyncIterator[bytes], *,
                  metadata: Mapping[str, str] | None = None) -> bool:
        """Store what ``chunks`` yields under ``name`` unless an object is already there. True when this call
        stored it, False when an earlier taking had (the first taking is kept: ``If-None-Match: *``).

        A failure (of the store or of ``chunks``) aborts the upload, so no parts are left behind; an upload a
        crashed process left is aborted by the next put or delete of the same name (:meth:`abort_uploads`)."""
        s3 = await self._s3()
        bucket, key = self.config.bucket, self.key(name)
        meta = dict(metadata or {})
        await self.abort_uploads(name)
        part_size = self.config.part_size
        buffer = bytearray()
        upload_id: str | None = None
        parts: list[dict[str, Any]] = []
        what = f"store snapshot {name.id}"
        try:
            async for chunk in _source(chunks):
                buffer += chunk
                while len(buffer) >= part_size:
                    if upload_id is None:
                        created = await s3.create_multipart_upload(Bucket=bucket, Key=key, Metadata=meta)
                        upload_id = created["UploadId"]
                    with memoryview(buffer) as view:
                        body = bytes(view[:part_size])  # one copy: the part sent while the buffer refills
                    del buffer[:part_size]
                    answer = await s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id,
                                                  PartNumber=len(parts) + 1, Body=body)
                    parts.append({"PartNumber": len(parts) + 1, "ETag": answer["ETag"]})
            if upload_id is None:
                await s3.put_object(Bucket=bucket, Key=key, Body=bytes(buffer), Metadata=meta, IfNoneMatch="*")
                return True
            if buffer:
                answer = await s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id,
                                              PartNumber=len(parts) + 1, Body=bytes(buffer))
                parts.append({"PartNumber": len(parts) + 1, "ETag": answer["ETag"]})
            buffer.clear()
            await s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id,
                                               MultipartUpload={"Parts": parts}, IfNoneMatch="*")
            upload_id = None
            return True
        except _SourceFailed as failed:
            raise failed.error from None  # the archive's stream broke, not the store: say that, as it was
        except self._handled() as exc:
            if self._code(exc) in ("PreconditionFailed", "ConditionalRequestConflict"):
                return False  # another taking completed first: keep it (its state is the first's)
            raise self._failure(what, exc) from None
        finally:
            if upload_id is not None:
                await self._abort(bucket, key, upload_id)

    async def _abort(self, bucket: str, key: str, upload_id: str) -> None:
        s3 = await self._s3()
        try:
            await s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        except self._handled() as exc:
            if self._code(exc) != "NoSuchUpload":
                log.warning("could not abort an unfinished snapshot upload of %s: %s", key,
                            self._failure("abort upload", exc))

    async def abort_uploads(self, name: SnapshotName) -> int:
        """Abort every unfinished multipart upload of ``name`` (a crashed taking's parts); how many."""
        return await self._abort_under(self.key(name), exact=True)

    async def abort_stale_uploads(self, installation: str, *, older_than: float) -> int:
        """Abort the unfinished uploads of ``installation``'s snapshots begun more than ``older_than`` seconds
        ago: parts of takings whose process died and whose snapshot was never taken again (the orphan sweep's
        part; a taking in progress is younger)."""
        cutoff = time.time() - older_than
        return await self._abort_under(f"{self.config.prefix}ks/{tag_key(installation)}/", before=cutoff)

    async def _abort_under(self, prefix: str, *, exact: bool = False, before: float | None = None) -> int:
        s3 = await self._s3()
        count = 0
        try:
            paginator = s3.get_paginator("list_multipart_uploads")
            async for page in paginator.paginate(Bucket=self.config.bucket, Prefix=prefix,
                                                  PaginationConfig={"PageSize": self.page_size}):
                for upload in page.get("Uploads", []) or []:
                    if exact and upload["Key"] != prefix:
                        continue
                    initiated = upload.get("Initiated")
                    if before is not None and initiated is not None and initiated.timestamp() > before:
                        continue
                    await self._abort(self.config.bucket, upload["Key"], upload["UploadId"])
                    count += 1
        except self._handled() as exc:
            raise self._failure(f"list unfinished uploads under {prefix}", exc) from None
        return count

    async def get(self, name: SnapshotName) -> AsyncGenerator[bytes, None]:
        """The archive's bytes in chunks of at most ``DOWNLOAD_CHUNK``. :class:`SnapshotMissing` when absent
        (raised before the first chunk)."""
        return (await self.open(name))[1]

    async def open(self, name: SnapshotName) -> tuple[int, AsyncGenerator[bytes, None]]:
        """The archive's size in bytes and its stream (see :meth:`get`)."""
        s3 = await self._s3()
        try:
            answer = await s3.get_object(Bucket=self.config.bucket, Key=self.key(name))
        except self._handled() as exc:
            if self._code(exc) in _MISSING_CODES:
                raise SnapshotMissing(name.id) from None
            raise self._failure(f"fetch snapshot {name.id}", exc) from None
        return int(answer["ContentLength"]), self._stream(name, answer["Body"])

    async def _stream(self, name: SnapshotName, body: Any) -> AsyncGenerator[bytes, None]:
        try:
            while chunk := await body.read(DOWNLOAD_CHUNK):
                yield chunk
        except self._handled() as exc:
            raise self._failure(f"fetch snapshot {name.id}", exc) from None
        finally:
            body.close()

    async def copy(self, name: SnapshotName, to: SnapshotName) -> None:
        """A server-side copy of snapshot ``name`` as ``to``, an object of its own (a fork's copy of its source's
        snapshot): nothing passes through this process. :class:`SnapshotMissing` when ``name`` is not there; a
        copy that exists already (a retry) is kept."""
        if await self.exists(to):
            return
        s3 = await self._s3()
        bucket = self.config.bucket
        try:
            await s3.copy_object(Bucket=bucket, Key=self.key(to), CopySource={"Bucket": bucket, "Key": self.key(name)})
        except self._handled() as exc:
            if self._code(exc) in _MISSING_CODES or self._code(exc) == "NoSuchKey":
                raise SnapshotMissing(name.id) from None
            raise self._failure(f"copy snapshot {name.id}", exc) from None

    async def delete(self, name: SnapshotName) -> None:
        """Delete the snapshot and any unfinished upload of it; deleting what is not there succeeds."""
        await self.abort_uploads(name)
        s3 = await self._s3()
        try:
            await s3.delete_object(Bucket=self.config.bucket, Key=self.key(name))
        except self._handled() as exc:
            if self._code(exc) in _MISSING_CODES:
                return
            raise self._failure(f"delete snapshot {name.id}", exc) from None

    async def inventory(self, installation: str, *, provider: str) -> list[SnapshotEntry]:
        """Every snapshot stored for ``installation``, on every page of the listing."""
        s3 = await self._s3()
        key = tag_key(installation)
        base = f"{self.config.prefix}ks/{key}/"
        entries: list[SnapshotEntry] = []
        try:
            paginator = s3.get_paginator("list_objects_v2")
            async for page in paginator.paginate(Bucket=self.config.bucket, Prefix=base,
                                                  PaginationConfig={"PageSize": self.page_size}):
                for item in page.get("Contents", []) or []:
                    name = _name_of(item["Key"], self.config.prefix)
                    if name is not None and name.installation_key == key:
                        entries.append(SnapshotEntry(id=name.id, provider=provider, installation_key=key,
                                                     owner_key=name.owner_key, retained=name.retained))
        except self._handled() as exc:
            raise self._failure(f"list the snapshots of installation {installation}", exc) from None
        return entries

    async def ensure_bucket(self) -> None:
        """Create the bucket when it does not exist (development and tests; operators create theirs)."""
        s3 = await self._s3()
        try:
            await s3.head_bucket(Bucket=self.config.bucket)
            return
        except self._handled() as exc:
            if self._code(exc) not in ("404", "NoSuchBucket", "NotFound"):
                raise self._failure(f"look up bucket {self.config.bucket}", exc) from None
        try:
            await s3.create_bucket(Bucket=self.config.bucket)
        except self._handled() as exc:
            if self._code(exc) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise self._failure(f"create bucket {self.config.bucket}", exc) from None


class _SourceFailed(Exception):
    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


async def _source(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``chunks``, with its own failures told apart from the store's (both may be OSErrors)."""
    while True:
        try:
            chunk = await anext(chunks)
        except StopAsyncIteration:
            return
        except Exception as exc:
            raise _SourceFailed(exc) from exc
        yield chunk


_KEY = re.compile(r"ks/([0-9a-f]{12})/([0-9a-f]{12})/([kd])-([0-9a-f]{40})\.tar")


def _name_of(key: str, prefix: str) -> SnapshotName | None:
    if not key.startswith(prefix):
        return None
    match = _KEY.fullmatch(key[len(prefix):])
    if match is None:
        return None
    installation, owner, kept, digest = match.groups()
    return SnapshotName(installation, None if owner == _NO_TAG else owner, kept == "k", digest)
