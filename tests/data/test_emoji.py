"""The emoji dataset build on tiny fake npm tarballs (no network)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import stat
import sys
import tarfile

import numpy as np
import pytest
from PIL import Image

from jdml.data import emoji
from jdml.data.sources import load_dataset
from jdml.errors import DataError

# (key, name, category, subcategory, fill colour); the fourth is a flag (a dropped
# subcategory), the fifth lacks two designs; OpenMoji's outline of the tangerine is its colour
# drawing (a copy within the class), the lemon's is the black circle every other outline is (a
# copy across classes), and the lemon has no Fluent drawing (3 designs left without the copy).
FAKE = [
    ("1F600", "grinning face", "Smileys & Emotion", "face-smiling", (250, 200, 0)),
    ("1F436", "dog face", "Animals & Nature", "animal-mammal", (160, 100, 40)),
    ("2764-FE0F", "red heart", "Smileys & Emotion", "heart", (220, 20, 40)),
    ("1F1FA-1F1E6", "flag: Ukraine", "Flags", "country-flag", (90, 90, 200)),
    ("1F34E", "red apple", "Food & Drink", "food-fruit", (200, 0, 0)),
    ("1F34A", "tangerine", "Food & Drink", "food-fruit", (255, 140, 0)),
    ("1F34B", "lemon", "Food & Drink", "food-fruit", (250, 240, 60)),
]


def _png(colour, box) -> bytes:
    image = Image.new("RGBA", (64, 64), (0, 0, 0, 0))
    image.paste((*colour, 255), box)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _svg(colour, shape: str) -> bytes:
    fill = "#{:02x}{:02x}{:02x}".format(*colour)
    body = (
        f'<circle cx="36" cy="36" r="20" fill="{fill}"/>'
        if shape == "circle"
        else f'<rect x="20" y="14" width="30" height="44" fill="{fill}" stroke="#000"/>'
    )
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 72 72">{body}</svg>').encode()


def _tarball(path, files: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _fake_tarballs(folder) -> list[emoji.Source]:
    """Writes fake packages into ``folder`` and returns Source pins with their sha256."""
    folder.mkdir(parents=True, exist_ok=True)
    entries = [
        {"unified": k, "name": n.upper(), "category": c, "subcategory": s, "skin_variations": {}}
        for k, n, c, s, _ in FAKE
    ]
    openmoji = [{"hexcode": k, "annotation": n, "skintone": ""} for k, n, *_ in FAKE]
    openmoji.append({"hexcode": "1F600-1F3FB", "annotation": "toned", "skintone": "1"})
    packages: dict[str, dict[str, bytes]] = {}
    for vendor, box in (("google", (4, 4, 60, 60)), ("twitter", (10, 20, 54, 50))):
        files = {"package/emoji.json": json.dumps(entries).encode()}
        for k, _, _, _, colour in FAKE:
            files[f"package/img/{vendor}/64/{k.lower()}.png"] = _png(colour, box)
        files[f"package/img/{vendor}/64/1f600-1f3fb.png"] = _png((0, 0, 0), box)  # a tone
        packages[f"emoji-datasource-{vendor}"] = files
    om = {"package/data/openmoji.json": json.dumps(openmoji).encode()}
    for k, _, _, _, colour in FAKE[:4]:
        om[f"package/color/svg/{k}.svg"] = _svg(colour, "circle")
        om[f"package/black/svg/{k}.svg"] = _svg((0, 0, 0), "circle")
    om["package/color/svg/1F34E.svg"] = _svg(FAKE[4][4], "circle")  # no black apple
    om["package/color/svg/1F34A.svg"] = om["package/black/svg/1F34A.svg"] = _svg(
        FAKE[5][4], "circle"
    )
    om["package/color/svg/1F34B.svg"] = _svg(FAKE[6][4], "circle")
    om["package/black/svg/1F34B.svg"] = _svg((0, 0, 0), "circle")
    packages["openmoji"] = om
    fl = {}
    for _, n, _, _, colour in FAKE[:6]:
        slug = emoji.fluent_slug(n)
        fl[f"package/icons/modern/{slug}.svg"] = _svg(colour, "rect")
        fl[f"package/icons/flat/{slug}.svg"] = _svg(colour, "circle")  # not read
    fl["package/icons/modern/red-apple.svg"] = b"<svg xmlns='http://www.w3.org/2000/svg'/>"
    packages["fluentui-emoji"] = fl
    sources = []
    for package, files in sorted(packages.items()):
        source = emoji.Source(package, "1.0.0", "", "sha512-fake", "test")
        path = folder / source.filename
        _tarball(path, files)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        sources.append(dataclasses.replace(source, sha256=digest))
    return sources


def _fake_npm(tmp_path, store) -> str:
    """An ``npm`` that copies ``pack`` tarballs from ``store`` (and counts its calls)."""
    script = tmp_path / "npm"
    script.write_text(
        f"#!{sys.executable}\n"
        "import shutil, sys\n"
        "args = sys.argv[1:]\n"
        "name, version = args[1].rsplit('@', 1)\n"
        "dest = args[args.index('--pack-destination') + 1]\n"
        f"open({str(tmp_path / 'calls')!r}, 'a').write(args[1] + '\\n')\n"
        f"shutil.copy({str(store)!r} + '/' + name + '-' + version + '.tgz', dest)\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("emoji")
    sources = _fake_tarballs(tmp / "store")
    npm = _fake_npm(tmp, tmp / "store")
    cache = tmp / "cache"
    manifest = emoji.fetch_and_build(cache, sources, npm=npm)
    return tmp, cache, sources, npm, manifest


def test_classes_designs_and_skin_tones(built):
    _, cache, _, _, manifest = built
    arrays, _ = emoji.read_cache(cache)
    keys = [c["key"] for c in manifest["classes"]]
    # the flag is dropped, the apple has 3 visible designs (blank fluent-color, no black), the
    # lemon 3 once its outline (a copy of the others') is dropped
    assert sorted(keys) == ["1F34A", "1F436", "1F600", "2764"]
    assert keys == sorted(keys, key=emoji.class_order_key)
    assert manifest["stats"]["blank_drawings"] == 1
    counts = np.bincount(arrays["labels"])
    assert counts.tolist() == [4, 4, 4, 4]
    assert arrays["images"].shape == (16, 64, 64, 3) and arrays["images"].dtype == np.uint8
    assert list(arrays["design_names"]) == [d.name for d in emoji.DESIGNS]
    black = emoji.DESIGNS.index(next(d for d in emoji.DESIGNS if d.name == "openmoji-black"))
    assert black not in arrays["designs"]  # every outline was a copy
    assert sorted(arrays["designs"][arrays["labels"] == 0].tolist()) == [0, 1, 2, 4]
    assert "Flags/country-flag" in manifest["subcategory_stats"]  # measured before dropping
    assert all("toned" not in str(n) for n in arrays["class_names"])  # no skin-tone classes
    assert [s["license"] for s in manifest["designs"]][:2] == ["Apache-2.0", "CC-BY-4.0"]


def test_copies_are_dropped_and_recorded(built):
    _, cache, _, _, manifest = built
    dup = manifest["duplicates"]
    assert dup["rms_threshold"] == emoji.DUPLICATE_RMS
    (cross,) = dup["cross_class"]  # the outlines' black circle, drawn for four classes
    assert cross["max_rms"] == 0.0
    assert sorted(d["class"] for d in cross["drawings"]) == ["1F34B", "1F436", "1F600", "2764"]
    assert {d["design"] for d in cross["drawings"]} == {"openmoji-black"}
    (within,) = dup["within_class"]
    assert within["kept"] == {"class": "1F34A", "name": "tangerine", "design": "openmoji-color"}
    assert within["dropped"] == ["openmoji-black"]
    assert dup["classes_dropped"] == [{"class": "1F34B", "name": "lemon", "designs_left": 3}]
    assert dup["images_dropped"] == 5 + 3  # 4 circles + 1 copy, then the lemon's other 3
    assert manifest["stats"]["duplicates_dropped"] == dup["images_dropped"]
    assert dup["nearest_other_class"]["<= 0"] == 4
    images = emoji.read_cache(cache)[0]["images"].reshape(16, -1).astype(float)
    gaps = np.sqrt(((images[:, None] - images[None]) ** 2).mean(-1))
    assert gaps[~np.eye(16, dtype=bool)].min() > emoji.DUPLICATE_RMS  # nothing alike is left


def test_manifest_attributes_every_design(built):
    _, _, _, _, manifest = built
    block = manifest["attribution"]
    covered = [d for a in block["designs"] for d in a["designs"]]
    assert sorted(covered) == sorted(d.name for d in emoji.DESIGNS)
    assert all(a["creator"] and a["copyright"] and a["license_url"] for a in block["designs"])
    assert "recentred" in block["modification"]
    fluent = next(a for a in block["designs"] if a["designs"] == ["fluent-color"])
    assert "Mohammad Abu Mattar" in fluent["via"] and fluent["creator"] == "Microsoft"


def test_same_background_and_framing_for_every_source(built):
    _, cache, _, _, _ = built
    images = emoji.read_cache(cache)[0]["images"]
    corners = images[:, [0, 0, -1, -1], [0, -1, 0, -1]]
    assert (corners == 255).all()
    for image in images:  # the visible box is CONTENT_SIZE on its longer side, centred
        ink = (image < 250).any(-1)
        rows, cols = np.flatnonzero(ink.any(1)), np.flatnonzero(ink.any(0))
        long = max(rows[-1] - rows[0], cols[-1] - cols[0]) + 1
        assert emoji.CONTENT_SIZE - 2 <= long <= emoji.CONTENT_SIZE
        assert abs((rows[0] + rows[-1]) / 2 - 31.5) <= 1.5
        assert abs((cols[0] + cols[-1]) / 2 - 31.5) <= 1.5


def test_manifest_records_sources_and_checksums(built):
    _, cache, sources, _, manifest = built
    npz_path, manifest_path = emoji.cache_paths(cache)
    assert manifest["npz_sha256"] == hashlib.sha256(npz_path.read_bytes()).hexdigest()
    assert [s["sha256"] for s in manifest["sources"]] == [s.sha256 for s in sources]
    images = emoji.read_cache(cache)[0]["images"]
    assert manifest["stats"]["images_sha256"] == hashlib.sha256(images.tobytes()).hexdigest()
    assert json.loads(manifest_path.read_text()) == manifest


def test_rebuild_is_byte_identical_and_reuses_tarballs(built):
    tmp, cache, sources, npm, _ = built
    npz_path, manifest_path = emoji.cache_paths(cache)
    before = npz_path.read_bytes(), manifest_path.read_bytes()
    other = tmp / "other"
    emoji.fetch_and_build(other, sources, npm=npm)
    emoji.fetch_and_build(cache, sources, npm=npm)  # tarballs present: checked, not fetched
    assert (npz_path.read_bytes(), manifest_path.read_bytes()) == before
    assert emoji.cache_paths(other)[0].read_bytes() == before[0]
    assert len((tmp / "calls").read_text().split()) == 2 * len(sources)


def test_sha256_mismatch_is_refused(built, tmp_path):
    _, _, sources, npm, _ = built
    bad = [dataclasses.replace(sources[0], sha256="0" * 64), *sources[1:]]
    with pytest.raises(emoji.EmojiFetchError, match="pinned to 0000"):
        emoji.fetch_sources(tmp_path, bad, npm=npm)


def test_registry_loader_and_missing_cache(built, tmp_path, monkeypatch):
    _, cache, _, _, _ = built
    data = load_dataset(
        "emoji", path="", image_size=32, cache_dir=str(cache), channels=1, skip_unreadable=False
    )
    assert data.images.shape == (16, 32, 32, 1) and data.num_classes == 4
    monkeypatch.setenv("JDML_CACHE", str(tmp_path))
    with pytest.raises(DataError, match="python -m jdml data fetch emoji") as err:
        load_dataset("emoji", path="", image_size=64, cache_dir=None, channels=3)
    assert str(tmp_path / "emoji") in str(err.value)
    npz_path = emoji.cache_paths(tmp_path / "emoji")[0]
    npz_path.parent.mkdir(parents=True)
    npz_path.write_bytes(emoji.cache_paths(cache)[0].read_bytes()[:-10])
    emoji.cache_paths(tmp_path / "emoji")[1].write_text(emoji.cache_paths(cache)[1].read_text())
    with pytest.raises(DataError, match="does not match its manifest"):
        load_dataset("emoji", path="", image_size=64, cache_dir=None, channels=3)


def test_command_line(built, capsys, monkeypatch):
    from jdml.__main__ import main

    tmp, cache, sources, _npm, _ = built
    monkeypatch.setattr(emoji, "SOURCES", tuple(sources))
    monkeypatch.setenv("PATH", f"{tmp}{os.pathsep}{os.environ['PATH']}")
    sheet = tmp / "sheet.png"
    main(["data", "fetch", "emoji", "--cache-dir", str(cache), "--sheet", str(sheet)])
    out = capsys.readouterr().out
    assert "emoji: 4 classes, 16 images" in out and "dropped as copies (RMS <= 6): 8" in out
    width, height = Image.open(sheet).size  # the sheet, with the artwork's notice under it
    assert width == 12 * 66 + 2 and height > 5 * 66 + 2 + 20


def test_fluent_slugs():
    assert emoji.fluent_slug("A button (blood type)") == "a-button-blood-type"
    assert emoji.fluent_slug("piñata") == "pinata"
    assert emoji.fluent_slug("1st place medal") == "1st-place-medal"
    assert emoji.emoji_key("2764-fe0f") == "2764"
