"""A user's formats folder (``forensics --formats DIR`` or ``FORENSICS_FORMATS``) adds a fork's lines without an
edit of the installed package: a made-up fork, "turbo", prints one line of its own after each request's timings
(fixtures/user-formats/turbo.log); its folder declares the kind and the three fields the line carries."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from forensics import cli as cli_mod
from forensics.cli import cli
from parsers import spec
from tests.conftest import ROOT

FOLDER = ROOT / "fixtures" / "user-formats" / "turbo"
LOG = ROOT / "fixtures" / "user-formats" / "turbo.log"
TURBO_ROWS = ("line_no,kind,slot,task,turbo_tree_width,turbo_tree_depth,turbo_kv_moved_kib\n"
              "16,turbo_tree,0,0,4,6,812.0\n"
              "34,turbo_tree,1,4,8,5,1530.5\n")
TURBO_SQL = ("select line_no, kind, slot, task, turbo_tree_width, turbo_tree_depth, turbo_kv_moved_kib "
             "from events where line_no in (16, 34) order by line_no")


def _run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, list(args), env=env)
    return res.exit_code, res.stdout, res.stderr


def _requests(store: Path) -> str:
    return _run("sql", "select slot, task, prompt_tokens, gen_tokens from requests order by slot, task",
                "--format", "csv", "--store", str(store))[1]


def test_the_folder_reads_the_forks_lines_with_their_fields(tmp_path: Path) -> None:
    store = tmp_path / "with"
    rc, _, err = _run("--formats", str(FOLDER), "ingest", str(LOG), "--store", str(store))
    assert rc == 0, err
    assert err.splitlines()[-1].startswith("total: files=1 (1 ingested) lines=35 parsed=35 skipped=0 unparsed=0 "
                                           "requests=4 ")
    assert _run("sql", TURBO_SQL, "--format", "csv", "--store", str(store))[1] == TURBO_ROWS
    # without the folder the same lines are the slot frame's catch-all, with no field; the requests are the same
    plain = tmp_path / "without"
    assert _run("ingest", str(LOG), "--store", str(plain))[0] == 0
    assert _run("sql", "select line_no, kind from events where line_no in (16, 34) order by line_no",
                "--format", "csv", "--store", str(plain))[1] == "line_no,kind\n16,slot_other\n34,slot_other\n"
    assert _requests(store) == _requests(plain) != ""
    assert spec.FORMATS_ENV not in os.environ  # the option held for its own command only


def test_the_environment_variable_does_the_same(tmp_path: Path) -> None:
    store, empty = tmp_path / "s", tmp_path / "another-folder"
    empty.mkdir()
    rc, _, err = _run("ingest", str(LOG), "--format", "turbo", "--store", str(store),
                      env={"FORENSICS_FORMATS": f"{empty}{os.pathsep}{FOLDER}"})
    assert rc == 0, err
    assert _run("sql", TURBO_SQL, "--format", "csv", "--store", str(store))[1] == TURBO_ROWS
    assert cli_mod.FORMATS_ENV == spec.FORMATS_ENV


def test_the_forks_format_is_a_choice_only_with_its_folder(tmp_path: Path) -> None:
    rc, _, err = _run("ingest", str(LOG), "--format", "turbo", "--store", str(tmp_path / "s"))
    assert rc == 2 and "'turbo' is not one of" in err
    rc, _, err = _run("--formats", str(FOLDER), "ingest", str(LOG), "--format", "turbo", "--store",
                      str(tmp_path / "s"))
    assert rc == 0, err


def _folder(tmp_path: Path, **files: str) -> Path:
    folder = tmp_path / "mine"
    folder.mkdir()
    for name, text in files.items():
        (folder / f"{name}.toml").write_text(text, encoding="utf-8")
    return folder


TURBO = (FOLDER / "turbo.toml").read_text(encoding="utf-8")
FIELDS = (FOLDER / "fields.toml").read_text(encoding="utf-8")


@pytest.mark.parametrize(("files", "line"), [
    ({"turbo": TURBO}, "{dir}/turbo.toml: kind 'turbo_tree' captures 'turbo_tree_width', which fields.toml does not "
                       "declare (declare the field with its type)"),
    ({"turbo": TURBO + "role = 'tree'\n", "fields": FIELDS},
     "{dir}/turbo.toml: kind 'turbo_tree' has unknown role 'tree' (use one of " + ", ".join(sorted(spec.ROLES)) + ")"),
    ({"turbo": TURBO.replace('name = "turbo_tree"', 'name = "graphs_reused"'), "fields": FIELDS},
     "{dir}/turbo.toml: kind 'graphs_reused' is declared in llama-common and turbo (kind names are unique across "
     "formats)"),
    ({"turbo": TURBO.replace('name = "turbo"', 'name = "forks"'), "fields": FIELDS},
     "{dir}/turbo.toml: format 'forks' is declared twice"),
    ({"turbo": TURBO, "fields": FIELDS + "[fields.slot]\ntype = 'float'\n"},
     "{dir}/fields.toml: field 'slot' has type 'float', but it is declared as 'int' already (use the declared type, "
     "or another name)"),
    ({"turbo": TURBO.replace("depth = 6", "depth = six"), "fields": FIELDS},
     "{dir}/turbo.toml: kind 'turbo_tree': sample 'slot   turbo_spec: id  0 | task 0 | turbo: speculative tree width "
     "= 4, depth = six, kv moved = 812 KiB' reads as slot_other (fix the regex or the sample: a sample reads as its "
     "own kind among every format)"),
    ({"frames": "[macros]\n"}, "{dir}/frames.toml: frames.toml cannot be replaced from a formats folder (a formats "
                               "folder holds format files and a fields.toml of new fields)"),
])
def test_a_bad_folder_is_refused_in_one_line(tmp_path: Path, files: dict[str, str], line: str) -> None:
    folder = _folder(tmp_path, **files)
    rc, out, err = _run("--formats", str(folder), "ingest", str(LOG), "--store", str(tmp_path / "s"))
    assert (rc, out, err) == (2, "", "forensics: error: " + line.format(dir=folder) + "\n")
    assert not (tmp_path / "s" / "_manifest.json").exists()


def test_a_folder_that_does_not_exist_is_refused_in_one_line(tmp_path: Path) -> None:
    rc, _, err = _run("--formats", str(tmp_path / "nope"), "ingest", str(LOG), "--store", str(tmp_path / "s"))
    assert rc == 2 and err.startswith("forensics: error: Invalid value for '--formats': Directory ")
    rc, _, err = _run("ingest", str(LOG), "--store", str(tmp_path / "s"), env={"FORENSICS_FORMATS": str(tmp_path / "nope")})
    assert (rc, err) == (2, f"forensics: error: {tmp_path / 'nope'}: no such formats folder (--formats DIR and "
                            "$FORENSICS_FORMATS name folders of format files)\n")
