"""Every importer's file: required unless the importer has its own, and a file not given or
not there is one line naming it and where to download it (replaylab.sources.registry)."""

from __future__ import annotations

from pathlib import Path

import pytest

from replaylab.contracts.errors import InputError
from replaylab.sources.registry import SOURCES, SourceFileMissing, files_table, import_source

REPO = Path(__file__).resolve().parents[2]
NEEDS_PATH = [n for n, s in SOURCES.items() if not s.path_optional]


@pytest.mark.parametrize("name", NEEDS_PATH)
def test_no_path_is_one_line_naming_the_file_and_its_url(name):
    spec = SOURCES[name]
    with pytest.raises(SourceFileMissing) as e:
        import_source(name, None)
    msg = str(e.value)
    assert isinstance(e.value, InputError) and "\n" not in msg
    assert msg.startswith(f"source={name} needs source.path=PATH: ")
    assert spec.file in msg and spec.url in msg and spec.url.startswith("https://")


@pytest.mark.parametrize("name", list(SOURCES))
def test_an_absent_path_is_one_line_naming_the_file_and_its_url(name, tmp_path):
    missing = tmp_path / "not-downloaded.csv"
    with pytest.raises(SourceFileMissing) as e:
        import_source(name, str(missing))
    msg = str(e.value)
    assert "\n" not in msg and f"source.path={missing} does not exist" in msg
    assert SOURCES[name].file in msg and SOURCES[name].url in msg


def test_the_setting_named_is_the_one_given():
    with pytest.raises(SourceFileMissing, match=r"needs data\.outcomes=PATH"):
        import_source("routerarena", None, "data.outcomes")


def test_no_source_config_defaults_to_a_shared_folder():
    for path in (REPO / "conf" / "source").glob("*.yaml"):
        text = path.read_text()
        assert "shared_dir" not in text and "\npath: null\n" in text, path.name
    assert {p.stem for p in (REPO / "conf" / "source").glob("*.yaml")} == set(SOURCES)


def test_the_howto_holds_the_registry_table():
    assert files_table() in (REPO / "docs" / "howto" / "import-data.md").read_text()
