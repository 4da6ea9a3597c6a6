"""Weights by name, downloaded: served from a loopback HTTP server through DETCORE_WEIGHTS_MIRROR
(no test reaches the internet), in each publisher's layout, with the catalog's checksums
replaced by the generated files' (zoo_files.entry_for)."""
import hashlib
import logging
import os
import re

import pytest

from detcore.checkpoint import DownloadError, detect_format, read_checkpoint, resolve_weights
from detcore.checkpoint import download
from detcore.checkpoint.catalog import CATALOG, Checksum
from detcore.checkpoint.download import cache_path, mirrored

from .weights_server import Behaviour, refused_url, serve
from .zoo_files import DETECTRON2, GENERATORS, MSRA, TORCHVISION, entry_for, msra_pkl, torchvision_pth, url_path

EXPECTED_FORMAT = {TORCHVISION: "torchvision-detection", DETECTRON2: "detectron2", MSRA: "caffe2-resnet"}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DETCORE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(download.MIRROR_ENV, raising=False)
    monkeypatch.setattr(download, "RETRIES", 2)
    monkeypatch.setattr(download, "BACKOFF_SECONDS", 0.0)
    return tmp_path / "cache"


@pytest.fixture
def server(cache, monkeypatch):
    """The server, the mirror pointing at it, and each test entry's generated file served at its
    publisher's path (checksums replaced)."""
    with serve() as state:
        monkeypatch.setenv(download.MIRROR_ENV, state.url)
        for name, make in GENERATORS.items():
            data = make()
            state.files[url_path(name)] = data
            monkeypatch.setitem(CATALOG, name, entry_for(name, data))
        yield state


def published_path(name):
    return cache_path(CATALOG[name].url)


# --- success ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [TORCHVISION, DETECTRON2, MSRA])
def test_catalog_name_downloads_once_into_the_cache_in_its_layout(server, name):
    path = resolve_weights(name)
    assert path == str(published_path(name))
    assert "weights" in path and CATALOG[name].url.split("://", 1)[1] in path  # host/path of the publisher
    with open(path, "rb") as f:
        assert f.read() == server.files[url_path(name)]
    state_dict, _ = read_checkpoint(path)
    assert detect_format(state_dict) == EXPECTED_FORMAT[name]
    recorded = open(path + ".sha256").read().split()[0]
    assert recorded == hashlib.sha256(server.files[url_path(name)]).hexdigest()
    assert not os.path.exists(path + ".part")
    # Used again: from the cache, no request.
    assert resolve_weights(name) == path
    assert server.count(url_path(name)) == 1


def test_aliases_urls_and_detectron2_paths_share_the_cache(server):
    first = resolve_weights("detectron2/mask_rcnn_R_50_FPN_3x")  # the preset's path
    assert resolve_weights(CATALOG[DETECTRON2].url) == first    # the publisher's URL: its entry
    d2 = CATALOG[MSRA].url.replace("https://dl.fbaipublicfiles.com/detectron2/", "detectron2://")
    assert resolve_weights(d2) == resolve_weights(MSRA)
    assert server.count(url_path(DETECTRON2)) == 1 and server.count(url_path(MSRA)) == 1


def test_plain_urls_checked_by_their_hash_in_the_name_or_fragment(cache):
    data = torchvision_pth(seed=3)
    digest = hashlib.sha256(data).hexdigest()
    with serve() as state:
        state.files[f"/files/model-{digest[:8]}.pth"] = data
        state.files["/files/plain.pth"] = data
        state.files["/files/wrong-0123abcd.pth"] = data
        path = resolve_weights(f"{state.url}/files/model-{digest[:8]}.pth")
        assert open(path, "rb").read() == data
        assert resolve_weights(f"{state.url}/files/plain.pth#sha256={digest}").endswith("plain.pth")
        assert state.requests[-1] == ("/files/plain.pth", None)  # the fragment is not sent
        with pytest.raises(DownloadError, match=f"its sha256 is {digest}, the publisher's starts with 0123abcd"):
            resolve_weights(f"{state.url}/files/wrong-0123abcd.pth")
        with pytest.raises(DownloadError, match="starts with ffffffff"):
            resolve_weights(f"{state.url}/files/plain.pth#sha256=ffffffff")


def test_progress_is_shown_while_downloading(server, monkeypatch, caplog):
    monkeypatch.setattr(download, "_CHUNK", 1024)  # small reads: several progress steps for a small file
    size = len(server.files[url_path(TORCHVISION)])
    with caplog.at_level(logging.INFO, logger="detcore.checkpoint.download"):
        resolve_weights(TORCHVISION)
    name = CATALOG[TORCHVISION].url.rsplit("/", 1)[1]
    steps = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"Downloading {name}: ")]
    assert len(steps) >= 5, steps
    assert steps[-1].endswith(f"of {size / 2**20:.1f} MiB")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="detcore.checkpoint.download"):
        resolve_weights(TORCHVISION, progress=False)  # cached: nothing to show
    assert not [r for r in caplog.records if r.getMessage().startswith("Downloading")]


# --- failures --------------------------------------------------------------------------------------
def test_checksum_mismatch_is_refused_and_nothing_is_kept(server, monkeypatch):
    monkeypatch.setitem(CATALOG, TORCHVISION, entry_for(TORCHVISION, b"another file"))
    expected = CATALOG[TORCHVISION].checksum.prefix
    with pytest.raises(DownloadError) as info:
        resolve_weights(TORCHVISION)
    message = str(info.value)
    assert "not the file expected" in message and f"starts with {expected}" in message
    assert str(published_path(TORCHVISION)) in message
    assert not published_path(TORCHVISION).exists()
    assert not os.path.exists(str(published_path(TORCHVISION)) + ".part")


def test_md5_of_detectron2_is_checked(server, monkeypatch):
    monkeypatch.setitem(CATALOG, DETECTRON2, entry_for(DETECTRON2, b"another file"))
    with pytest.raises(DownloadError, match="its md5 is"):
        resolve_weights(DETECTRON2)


def test_a_file_without_published_checksum_must_have_its_layout(server):
    server.files[url_path(MSRA)] = torchvision_pth()  # a mirror serving the wrong file
    with pytest.raises(DownloadError, match="it is a torchvision-detection checkpoint, where the catalog expects caffe2-resnet"):
        resolve_weights(MSRA)
    server.files[url_path(MSRA)] = b"<html>Not here</html>"  # a proxy's error page
    with pytest.raises(DownloadError, match="not a checkpoint"):
        resolve_weights(MSRA)
    assert not published_path(MSRA).exists()


def test_404_is_not_retried_and_says_where_to_put_the_file(server):
    del server.files[url_path(TORCHVISION)]
    with pytest.raises(DownloadError) as info:
        resolve_weights(TORCHVISION)
    message = str(info.value)
    assert "HTTP 404" in message
    assert server.url + url_path(TORCHVISION) in message and CATALOG[TORCHVISION].url in message
    assert str(published_path(TORCHVISION)) in message
    assert server.count(url_path(TORCHVISION)) == 1


def test_refused_connection_is_retried_then_names_the_url_and_the_manual_path(cache, monkeypatch, caplog):
    monkeypatch.setenv(download.MIRROR_ENV, refused_url())
    with caplog.at_level(logging.WARNING, logger="detcore.checkpoint.download"):
        with pytest.raises(DownloadError) as info:
            resolve_weights(TORCHVISION)
    message = str(info.value)
    assert "3 attempts failed" in message and "ConnectionRefusedError" in message
    assert mirrored(CATALOG[TORCHVISION].url) in message
    manual = str(published_path(TORCHVISION))
    assert re.search(rf"place it at\s+{re.escape(manual)}\s", message), message
    assert sum("attempt" in r.getMessage() for r in caplog.records) == 2


def test_offline_a_file_placed_by_hand_is_used_after_its_checks(cache, monkeypatch):
    data = torchvision_pth()
    monkeypatch.setitem(CATALOG, TORCHVISION, entry_for(TORCHVISION, data))
    monkeypatch.setenv(download.MIRROR_ENV, refused_url())
    manual = published_path(TORCHVISION)
    manual.parent.mkdir(parents=True)
    manual.write_bytes(b"half a file")
    with pytest.raises(DownloadError):  # a wrong file there is moved aside, and the download fails
        resolve_weights(TORCHVISION)
    assert (manual.parent / (manual.name + ".corrupt")).read_bytes() == b"half a file"
    manual.write_bytes(data)
    assert resolve_weights(TORCHVISION) == str(manual)


# --- cut transfers, corrupt caches ------------------------------------------------------------------
@pytest.mark.parametrize("honour_range", [True, False])
def test_transfer_cut_in_the_middle_is_retried(server, honour_range, caplog):
    data = server.files[url_path(TORCHVISION)]
    server.behaviour[url_path(TORCHVISION)] = Behaviour(cut_after=len(data) // 2, cuts=1, honour_range=honour_range)
    with caplog.at_level(logging.WARNING, logger="detcore.checkpoint.download"):
        path = resolve_weights(TORCHVISION)
    assert open(path, "rb").read() == data
    requests = [r for p, r in server.requests if p == url_path(TORCHVISION)]
    assert requests == [None, f"bytes={len(data) // 2}-"]  # resumed after the half it had
    assert any("transfer cut after" in r.getMessage() for r in caplog.records)


def test_a_stale_partial_file_of_another_version_is_downloaded_whole(server):
    part = published_path(TORCHVISION).with_name(published_path(TORCHVISION).name + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes(b"\xff" * 1000)  # left by a killed download of another file
    path = resolve_weights(TORCHVISION)
    assert open(path, "rb").read() == server.files[url_path(TORCHVISION)]
    assert [r for p, r in server.requests if p == url_path(TORCHVISION)] == ["bytes=1000-", None]


@pytest.mark.parametrize("name", [TORCHVISION, MSRA])
def test_corrupted_cached_file_is_downloaded_again_never_loaded(server, name):
    path = resolve_weights(name)
    good = open(path, "rb").read()
    with open(path, "r+b") as f:  # one byte flipped: same size, same layout
        f.seek(len(good) // 2)
        f.write(bytes([good[len(good) // 2] ^ 0xFF]))
    assert resolve_weights(name) == path
    assert open(path, "rb").read() == good
    assert os.path.exists(path + ".corrupt")
    assert server.count(url_path(name)) == 2


# --- the mirror ------------------------------------------------------------------------------------
def test_mirror_replaces_scheme_and_host_and_keeps_the_path(monkeypatch):
    url = CATALOG[DETECTRON2].url
    monkeypatch.setenv(download.MIRROR_ENV, "http://10.0.0.5:8080")
    assert mirrored(url) == "http://10.0.0.5:8080/detectron2/COCO-InstanceSegmentation/mask_rcnn_R_50_FPN_3x/137849600/model_final_f10217.pkl"
    monkeypatch.setenv(download.MIRROR_ENV, "https://mirror.example/weights/")
    assert mirrored(url).startswith("https://mirror.example/weights/detectron2/COCO-InstanceSegmentation/")
    monkeypatch.setenv(download.MIRROR_ENV, "10.0.0.5:8080")
    with pytest.raises(ValueError, match="DETCORE_WEIGHTS_MIRROR must be"):
        mirrored(url)
    monkeypatch.delenv(download.MIRROR_ENV)
    assert mirrored(url) == url


def test_cache_path_is_host_and_path_under_the_cache(cache):
    assert cache_path("https://download.pytorch.org/models/resnet50-0676ba61.pth") == (
        cache / "weights" / "download.pytorch.org" / "models" / "resnet50-0676ba61.pth"
    )
    assert cache_path("http://127.0.0.1:8000/a/b.pkl?x=1") == cache / "weights" / "127.0.0.1_8000" / "a" / "b.pkl"
    with pytest.raises(ValueError, match="must name a host and a file path"):
        cache_path("https://example.org/../../etc/passwd")


def test_checksums_must_be_hex_digests():
    with pytest.raises(ValueError, match="6 to 64 hex digits"):
        Checksum("sha256", "xyz123")
    with pytest.raises(ValueError, match="'sha256' or 'md5'"):
        Checksum("crc32", "abcdef12")
    assert Checksum("md5", "ABCDEF").matches("abcdef0123")


# --- ranks, in one process (tests/checkpoint/test_download_processes.py runs real ranks) -----------
def as_rank(monkeypatch, rank, rank0_failure):
    """This process as ``rank`` of two, the all_gather answering what rank 0 reports."""
    from detcore.utils import comm

    seen = []

    def all_gather(obj):
        seen.append(obj)
        return [rank0_failure if rank else obj, None]

    monkeypatch.setattr(comm, "get_world_size", lambda: 2)
    monkeypatch.setattr(comm, "get_rank", lambda: rank)
    monkeypatch.setattr(comm, "all_gather", all_gather)
    return seen


def test_a_rank_other_than_0_raises_rank_0s_failure_without_downloading(server, monkeypatch):
    seen = as_rank(monkeypatch, 1, "DownloadError: Could not download ...: HTTP 404 Not Found")
    with pytest.raises(DownloadError, match="rank 0 could not fetch MODEL.WEIGHTS 'torchvision/mask_rcnn_R_50_FPN': DownloadError: .*HTTP 404"):
        resolve_weights(TORCHVISION, all_ranks=True)
    assert seen == [None] and server.count(url_path(TORCHVISION)) == 0


def test_rank_0_reports_its_failure_to_the_others_then_raises_it(server, monkeypatch):
    del server.files[url_path(TORCHVISION)]
    seen = as_rank(monkeypatch, 0, None)
    with pytest.raises(DownloadError, match="HTTP 404"):
        resolve_weights(TORCHVISION, all_ranks=True)
    assert len(seen) == 1 and seen[0].startswith("DownloadError: Could not download") and "HTTP 404" in seen[0]


def test_a_rank_after_rank_0s_download_uses_the_shared_file(server, monkeypatch):
    path = resolve_weights(TORCHVISION)  # rank 0's download, into the cache the ranks share
    as_rank(monkeypatch, 1, None)
    assert resolve_weights(TORCHVISION, all_ranks=True) == path
    assert server.count(url_path(TORCHVISION)) == 1
