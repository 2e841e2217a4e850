"""The S3 snapshot store (providers/s3_snapshots.py) against a real S3 server: versitygw on loopback."""

from __future__ import annotations

import hashlib
import itertools
import secrets
import tracemalloc
from collections.abc import AsyncIterator

import pytest

from durable_sandbox.providers.contract import ConfigurationError, ProviderError, tag_key
from durable_sandbox.providers.s3_snapshots import (
    MINIMUM_PART_SIZE,
    S3Config,
    S3SnapshotStore,
    SnapshotMissing,
    SnapshotName,
)
from tests.objectstore import S3Server


@pytest.fixture
async def store(s3_server: S3Server) -> AsyncIterator[S3SnapshotStore]:
    bucket = "t-" + secrets.token_hex(6)
    store = S3SnapshotStore(s3_server.config(bucket, prefix="dsb/snapshots", part_size=MINIMUM_PART_SIZE))
    await store.ensure_bucket()
    yield store
    await store.aclose()


def name(op: str = "op", installation: str | None = "inst", owner: str | None = "ns/uid",
         retained: bool = False) -> SnapshotName:
    return SnapshotName.for_operation(op, installation=installation, owner=owner, retained=retained)


async def chunks(data: bytes, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i:i + size]


async def generated(total: int, seed: bytes = b"x") -> AsyncIterator[bytes]:
    """``total`` pseudo-random bytes, made as they are consumed (never all in memory)."""
    block = hashlib.sha256(seed).digest() * 2048  # 64 KiB
    for i in range(0, total, len(block)):
        yield block[: min(len(block), total - i)]


async def read_all(store: S3SnapshotStore, snapshot: SnapshotName) -> bytes:
    return b"".join([c async for c in await store.get(snapshot)])


async def unfinished_uploads(store: S3SnapshotStore) -> list[str]:
    s3 = await store._s3()
    answer = await s3.list_multipart_uploads(Bucket=store.config.bucket)
    return [u["Key"] for u in answer.get("Uploads", []) or []]


def test_ids_round_trip_and_no_key_is_the_prefix_of_another() -> None:
    names = [name(op, inst, owner, kept) for op, inst, owner, kept in itertools.product(
        ("a", "b", "c/d"), ("inst", None), ("ns/uid", None), (True, False))]
    keys = [n.key("p/") for n in names]
    assert len(set(keys)) == len(keys)
    for one, other in itertools.permutations(keys, 2):
        assert not other.startswith(one), f"{one} is a prefix of {other}: a filesystem store refuses that"
    for n in names:
        assert SnapshotName.parse(n.id) == n
        assert "//" not in n.key("p/") and not n.key("p/").endswith("/")
    assert name("a").id == name("a").id, "stable per operation id"
    assert SnapshotName.parse("not-a-snapshot") is None


def test_prefix_is_normalised_and_configuration_is_checked() -> None:
    config = S3Config(bucket="b", access_key_id="k", secret_access_key="s", prefix="/a//b/")
    assert config.prefix == "a/b/"
    assert "secret_access_key" not in repr(config) and "access_key_id" not in repr(config)
    with pytest.raises(ConfigurationError) as excinfo:
        S3Config(bucket="", access_key_id="", secret_access_key="", endpoint="ftp://x")
    text = str(excinfo.value)
    assert "DSB_S3_BUCKET" in text and "DSB_S3_ACCESS_KEY_ID" in text and "http(s)" in text
    problems = S3Config.environ_problems({"DSB_S3_BUCKET": "b"})
    assert problems and all(p.startswith("Sandbox provider [kubernetes]:") for p in problems)


async def test_small_snapshot_round_trips_and_a_second_taking_keeps_the_first(store: S3SnapshotStore) -> None:
    snapshot = name()
    assert not await store.exists(snapshot)
    assert await store.put(snapshot, chunks(b"first state")) is True
    assert await store.exists(snapshot)
    assert await store.put(snapshot, chunks(b"later state")) is False, "a retried snapshot finds the stored one"
    assert await read_all(store, snapshot) == b"first state"


async def test_large_snapshot_is_streamed_in_parts_with_bounded_memory(store: S3SnapshotStore) -> None:
    total = 6 * MINIMUM_PART_SIZE + 12345  # seven parts
    snapshot = name("big")
    tracemalloc.start()
    try:
        assert await store.put(snapshot, generated(total)) is True
        _, peak_put = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        digest, size = hashlib.sha256(), 0
        async for chunk in await store.get(snapshot):
            digest.update(chunk)
            size += len(chunk)
        _, peak_get = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    expected = hashlib.sha256(b"".join([c async for c in generated(total)]))
    assert (size, digest.hexdigest()) == (total, expected.hexdigest())
    assert peak_put < 4 * MINIMUM_PART_SIZE, f"upload held {peak_put} bytes: more than a few parts of {total}"
    assert peak_get < 2 * MINIMUM_PART_SIZE, f"download held {peak_get} bytes of {total}"
    assert await unfinished_uploads(store) == []


async def test_a_failed_upload_leaves_no_object_and_no_parts(store: S3SnapshotStore) -> None:
    async def broken() -> AsyncIterator[bytes]:
        async for chunk in generated(3 * MINIMUM_PART_SIZE):
            yield chunk
        raise OSError("the tar stream broke")

    snapshot = name("broken")
    with pytest.raises(OSError, match="the tar stream broke"):
        await store.put(snapshot, broken())
    assert not await store.exists(snapshot)
    assert await unfinished_uploads(store) == [], "the parts already sent were aborted"
    assert await store.put(snapshot, chunks(b"second try")) is True
    assert await read_all(store, snapshot) == b"second try"


async def test_parts_a_crashed_taking_left_are_aborted_by_the_retry_and_by_delete(store: S3SnapshotStore) -> None:
    s3 = await store._s3()
    snapshot = name("crashed")
    for _ in range(2):  # as a process killed mid-upload leaves them
        created = await s3.create_multipart_upload(Bucket=store.config.bucket, Key=store.key(snapshot))
        await s3.upload_part(Bucket=store.config.bucket, Key=store.key(snapshot), UploadId=created["UploadId"],
                             PartNumber=1, Body=b"x" * MINIMUM_PART_SIZE)
    assert len(await unfinished_uploads(store)) == 2
    assert await store.put(snapshot, chunks(b"retried")) is True
    assert await unfinished_uploads(store) == []
    created = await s3.create_multipart_upload(Bucket=store.config.bucket, Key=store.key(snapshot))
    await store.delete(snapshot)
    assert await unfinished_uploads(store) == [] and not await store.exists(snapshot)


async def test_the_sweep_aborts_stale_uploads_of_its_installation_only(store: S3SnapshotStore) -> None:
    s3 = await store._s3()
    for snapshot in (name("dead"), name("other-inst", installation="other")):
        await s3.create_multipart_upload(Bucket=store.config.bucket, Key=store.key(snapshot))
    assert await store.abort_stale_uploads("inst", older_than=3600) == 0, "a taking in progress is left alone"
    assert len(await unfinished_uploads(store)) == 2
    assert await store.abort_stale_uploads("inst", older_than=0) == 1
    assert await unfinished_uploads(store) == [store.key(name("other-inst", installation="other"))]


@pytest.mark.parametrize("first", ["original", "copy"])
async def test_a_server_side_copy_is_an_object_of_its_own_deleted_in_either_order(store: S3SnapshotStore,
                                                                                   first: str) -> None:
    """A fork's copy of its source's snapshot (sandboxes/fork.py): the same bytes under another key; a retry keeps
    the first copy; deleting either leaves the other whole; a copy of a missing snapshot says so."""
    original, copy = name("source-op"), name("copy-op", owner="ns/fork-uid")
    data = secrets.token_bytes(200_000)
    await store.put(original, chunks(data))
    await store.copy(original, copy)
    await store.copy(original, copy)  # a retry
    assert await read_all(store, copy) == data
    gone, kept = (original, copy) if first == "original" else (copy, original)
    await store.delete(gone)
    assert not await store.exists(gone) and await read_all(store, kept) == data
    await store.delete(kept)
    with pytest.raises(SnapshotMissing):
        await store.copy(original, name("another-copy"))
    assert not await store.exists(name("another-copy"))


async def test_delete_is_idempotent_and_a_deleted_snapshot_is_missing(store: S3SnapshotStore) -> None:
    snapshot = name("gone")
    await store.put(snapshot, chunks(b"data"))
    await store.delete(snapshot)
    await store.delete(snapshot)
    await store.delete(name("never-stored"))
    with pytest.raises(SnapshotMissing) as excinfo:
        await store.get(snapshot)
    assert excinfo.value.retryable is False and snapshot.id in str(excinfo.value)


async def test_inventory_lists_an_installations_snapshots_on_every_page(store: S3SnapshotStore) -> None:
    mine = [name(f"m{i}", owner=f"ns/{i % 2}") for i in range(5)]
    kept = name("kept", retained=True)
    unowned = name("unowned", owner=None)
    other = name("other", installation="other-inst")
    for snapshot in (*mine, kept, unowned, other):
        await store.put(snapshot, chunks(b"s"))
    store.page_size = 2
    entries = {e.id: e for e in await store.inventory("inst", provider="kubernetes")}
    assert set(entries) == {s.id for s in (*mine, kept, unowned)}
    assert entries[mine[1].id].owner_key == tag_key("ns/1") and entries[mine[1].id].installation_key == tag_key("inst")
    assert entries[kept.id].retained and not entries[mine[0].id].retained
    assert entries[unowned.id].owner_key is None
    assert {e.provider for e in entries.values()} == {"kubernetes"}


async def test_a_wrong_secret_is_refused_as_configuration_without_echoing_it(s3_server: S3Server,
                                                                             store: S3SnapshotStore) -> None:
    wrong = "wrong-" + secrets.token_hex(16)
    bad = S3SnapshotStore(s3_server.config(store.config.bucket, secret_access_key=wrong))
    try:
        with pytest.raises(ConfigurationError) as excinfo:
            await bad.put(name("refused"), chunks(b"x"))
    finally:
        await bad.aclose()
    text = str(excinfo.value)
    assert "refused" in text and "SignatureDoesNotMatch" in text and store.config.bucket in text
    assert wrong not in text and s3_server.secret_key not in text


async def test_a_missing_bucket_says_so(s3_server: S3Server) -> None:
    missing = S3SnapshotStore(s3_server.config("no-such-bucket-" + secrets.token_hex(4)))
    try:
        with pytest.raises(ConfigurationError, match="no such bucket"):
            await missing.put(name(), chunks(b"x"))
    finally:
        await missing.aclose()


async def test_a_store_that_is_down_is_a_retryable_error_and_works_once_back(s3_server: S3Server,
                                                                             store: S3SnapshotStore) -> None:
    snapshot = name("while-down")
    await store.put(snapshot, chunks(b"before"))
    s3_server.stop()
    try:
        with pytest.raises(ProviderError) as excinfo:
            await store.put(name("refused-while-down"), chunks(b"x"))
        assert excinfo.value.retryable is True
        assert s3_server.endpoint in str(excinfo.value) and s3_server.secret_key not in str(excinfo.value)
        with pytest.raises(ProviderError):
            await store.delete(snapshot)
    finally:
        s3_server.start()
    assert await read_all(store, snapshot) == b"before"
    await store.delete(snapshot)
    assert not await store.exists(snapshot)
