"""``forensics mapping init SAMPLE``: propose a mapping from one sample record file, and say how sure it is.

The sample's records are found where they are (the lines of a JSONL or CSV file; the longest list of objects
in a JSON or YAML document; a JSON object of equal-length arrays, as vLLM writes, is read as parallel arrays).
A stream of events (one line per event, tied by a request id) is proposed as an events layout
(``init_events``).  Each canonical field of the attempt schema is matched to a field of the records by name,
unit and shape (``init_fields``); the outcome reads every field that says a request failed (``init_outcome``).
The run id comes from the records when they carry one, else from the file's name.

Beside the proposal it says what it placed, what it guessed and why, what it could not decide (both readings,
and ``--pick FIELD=CHOICE`` to take one), and what the proposal gives on the sample: attempts, ok, failures by
outcome, items missing (``init_check``).  Fields it cannot place are listed as comments in the proposal.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forensics.errors import ForensicsError, InputError
from forensics.replay import init_events
from forensics.replay.init_check import SampleFacts, read_with
from forensics.replay.init_fields import Choice, Plan, Sample, dumps, is_timings, place
from forensics.replay.init_outcome import outcome
from forensics.replay.mapping import get_path, load_mapping, read_data

SAMPLED = 500  # records looked at to place fields (the check reads the whole sample)


@dataclass
class Proposal:
    """A proposed mapping (TOML text), how it was made and what it reads from the sample."""

    text: str
    attempts: int = 0
    records: int = 0  # the requests the sample holds (records, or an event stream's keys)
    problems: list[str] = field(default_factory=list)
    placed: dict[str, str] = field(default_factory=dict)  # canonical field -> the sample's field
    guesses: list[str] = field(default_factory=list)  # "field <- path: why"
    choices: list[Choice] = field(default_factory=list)  # left to the user
    facts: SampleFacts = field(default_factory=SampleFacts)
    options: dict[str, str] = field(default_factory=dict)  # "field=choice" -> what the sample gives with it
    unplaced: list[str] = field(default_factory=list)
    layout: str = "records"

    def report(self, sample: Path) -> list[str]:
        """The lines said beside the proposal (stderr)."""
        placed = ", ".join(f"{k} <- {v}" for k, v in self.placed.items()) or "nothing"
        lines = [f"checked on {sample}: {self.attempts} attempts read; placed {placed}"]
        lines += [f"guessed: {g}" for g in self.guesses]
        for c in self.choices:
            picks = " or ".join(f"--pick {c.canonical}={label}" for label, _ in c.options)
            lines.append(f"undecided: {c.canonical}: {c.why}; rerun with {picks}")
            lines += [f"  with {c.canonical}={label}: {self.options.get(f'{c.canonical}={label}', '?')}"
                      for label, _ in c.options]
        lines.append(f"on the sample: {self.facts.sentence()}" + (" (the undecided fields left out)"
                                                                  if self.choices else ""))
        if self.unplaced:
            lines.append(f"not placed ({len(self.unplaced)} fields, comments in the proposal): "
                         + ", ".join(self.unplaced[:8]) + (", ..." if len(self.unplaced) > 8 else ""))
        return lines


def propose(sample: Path, picks: dict[str, str] | None = None) -> Proposal:
    """Propose a mapping for ``sample`` and check it on the sample (see the module docstring); ``picks``:
    canonical field -> the reading chosen where two are plausible."""
    picks = dict(picks or {})
    if not sample.is_file():
        raise InputError("no such file", path=str(sample), hint="give a sample record file of the harness")
    fmt = _format(sample)
    records, path, layout = _records(sample, fmt)
    if not records:
        raise InputError("no records found in the sample (no lines, no list of objects)", path=str(sample),
                         hint="give a file the harness writes per request")
    stream = init_events.detect(records[:SAMPLED * 4]) if fmt == "jsonl" and layout == "records" else None
    columns = _columns(records[:SAMPLED])
    sample_fields = Sample.of(columns, _units(records[:SAMPLED]))
    plan = init_events.plan(stream, picks) if stream else _records_plan(sample_fields, picks)
    section = (path, "events" if stream else layout, stream.key if stream else None)
    proposal = Proposal("", placed=plan.placed, guesses=plan.guesses, choices=plan.choices, layout=section[1])
    proposal.records = len({r.get(stream.key) for r in records} - {None}) if stream else len(records)
    reads = plan.reads()
    proposal.unplaced = [p for p in columns if p not in reads and not any(p.startswith(f"{v}.") for v in reads)]
    proposal.text = _toml(sample, fmt, section, plan, {p: sample_fields.first[p] for p in proposal.unplaced})
    _check(proposal, sample)
    return proposal


def _records_plan(sample: Sample, picks: dict[str, str]) -> Plan:
    plan = place(sample, picks)
    result = outcome(sample, plan.placed, picks.get("outcome"))
    plan.guesses += result.guesses
    plan.choices += result.choices
    if result.line:
        plan.lines.append(result.line)
        plan.placed["outcome"] = " + ".join(dict.fromkeys(result.reads))
    return plan


def _format(sample: Path) -> str:
    name = sample.name.lower().removesuffix(".gz").removesuffix(".zst")
    for ext, fmt in ((".jsonl", "jsonl"), (".ndjson", "jsonl"), (".csv", "csv"), (".yaml", "yaml"), (".yml", "yaml")):
        if name.endswith(ext):
            return fmt
    head = sample.read_text(encoding="utf-8", errors="replace")[:65536].lstrip("\ufeff \t\r\n")
    lines = [ln for ln in head.splitlines() if ln.strip()]
    if len(lines) > 1 and all(ln.lstrip().startswith("{") and ln.rstrip().endswith("}") for ln in lines[:-1]):
        return "jsonl"
    return "json" if head[:1] in "{[" else "csv"


def _records(sample: Path, fmt: str) -> tuple[list[dict[str, Any]], str, str]:
    """The sample's records, the section path to them and the layout."""
    with tempfile.TemporaryDirectory(prefix="forensics-init-") as tmp:
        probe = Path(tmp) / "probe.toml"
        probe.write_text(f'[mapping]\nformat = "{fmt}"\n[attempts.set]\noutcome = "ok"\n', encoding="utf-8")
        df = read_data(load_mapping(probe), sample)
    if df.line_records:
        return [r for r in df.docs[0] if isinstance(r, dict)], "", "records"
    doc = df.docs[0]
    arrays = _parallel(doc)
    if arrays:
        n = max(len(v) for v in arrays.values())
        return [{k: (v[i] if i < len(v) else None) for k, v in arrays.items()} for i in range(n)], "", \
            "parallel_arrays"
    best = max(_lists(doc, ""), key=lambda x: len(x[1]), default=("", []))
    return best[1], best[0], "records"


def _parallel(doc: Any) -> dict[str, list[Any]]:
    """Two or more equal-length lists of scalars (or of lists) at the top of an object: parallel arrays."""
    if not isinstance(doc, dict):
        return {}
    lists = {k: v for k, v in doc.items() if isinstance(v, list) and v and not isinstance(v[0], dict)}
    sizes = [len(v) for v in lists.values()]
    common = max(set(sizes), key=sizes.count, default=0)
    same = {k: v for k, v in lists.items() if len(v) == common}
    return same if len(same) >= 2 and common > 1 else {}


def _lists(node: Any, path: str, depth: int = 0) -> list[tuple[str, list[dict[str, Any]]]]:
    """Lists of objects in ``node`` (their path: ``*`` iterates a list on the way)."""
    found: list[tuple[str, list[dict[str, Any]]]] = []
    if isinstance(node, list) and node and all(isinstance(x, dict) for x in node[:20]):
        found.append((path, node))
        if depth < 3:
            for sub_path, sub in _lists(node[0], f"{path}.*" if path else "*", depth + 1):
                rows = [r for x in node for r in (get_path(x, sub_path.split("*.", 1)[-1]) or [])
                        if isinstance(r, dict)] if "*." in sub_path else sub
                found.append((sub_path, rows))
    elif isinstance(node, dict) and depth < 4:
        for k, v in node.items():
            found.extend(_lists(v, f"{path}.{k}" if path else str(k), depth + 1))
    return found


def _columns(records: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Dot path -> its value in each record (None where a record lacks it), objects flattened four levels
    deep and a list of objects entered at its first element (``choices.0.finish_reason``)."""
    flat = [dict(_flatten(rec, "", 0)) for rec in records]
    paths = list(dict.fromkeys(p for f in flat for p in f))
    return {p: [f.get(p) for f in flat] for p in paths}


def _units(records: list[dict[str, Any]]) -> dict[str, str]:
    """Path -> the unit a {value, unit} object states (AIPerf writes every metric so)."""
    out: dict[str, str] = {}

    def walk(node: Any, prefix: str, depth: int) -> None:
        if isinstance(node, dict) and "value" in node and isinstance(node.get("unit"), str):
            out.setdefault(f"{prefix}.value", node["unit"])
        elif isinstance(node, dict) and depth < 4:
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k), depth + 1)

    for rec in records:
        walk(rec, "", 0)
    return out


def _flatten(node: Any, prefix: str, depth: int) -> list[tuple[str, Any]]:
    if isinstance(node, dict) and "value" in node and set(node) <= {"value", "unit", "header"}:
        return [(f"{prefix}.value", node.get("value"))]  # AIPerf's {value, unit}: the unit rides on the name
    if isinstance(node, dict) and depth < 5 and node and not is_timings(node):
        return [pair for k, v in node.items() for pair in _flatten(v, f"{prefix}.{k}" if prefix else str(k),
                                                                   depth + 1)]
    if isinstance(node, list) and node and isinstance(node[0], dict) and depth < 5 and prefix:
        return [(prefix, node), *_flatten(node[0], f"{prefix}.0", depth + 1)]
    return [(prefix, node)]


def _toml(sample: Path, fmt: str, section: tuple[str, str, str | None], plan: Plan, rest: dict[str, Any]) -> str:
    """The proposal: [attempts] at (path, layout, key), the plan's field lines, its choices and the unplaced
    fields as comments."""
    path, layout, key = section
    head = [f"# Proposed by `forensics mapping init {sample.name}`: check each field, then keep or change it.",
            "[mapping]", f'name = "{re.sub(r"[^A-Za-z0-9_-]+", "-", sample.stem)}"', f'format = "{fmt}"', "",
            "[attempts]", f'files = "{_glob(sample.name)}"']
    if path:
        head.append(f'path = "{path}"')
    if layout != "records":
        head.append(f'layout = "{layout}"')
    if key:
        head.append(f'key = "{key}"                 # one attempt per {key}: its events brought together')
    body = ["[attempts.fields]", *plan.lines]
    for c in plan.choices:
        body.append(f"# UNDECIDED {c.canonical}: {c.why}; keep one of these (or --pick {c.canonical}=...):")
        body += [f"# {line}" for _, line in c.options if line.startswith(c.canonical)]
    sets = ["[attempts.set]"]
    if "run_id" not in plan.placed:
        sets.append('run_id = "{stem}"                             # the records carry no run id: the file name')
    if "stage" not in plan.placed:
        sets.append('stage = "request"')
    if "outcome" not in plan.placed and not any(c.canonical == "outcome" for c in plan.choices):
        sets.append('outcome = "ok"                                # no field says a request failed')
    if "item" not in plan.placed and not any(c.canonical == "item" for c in plan.choices):
        body.append('item = "$index"                               # no request id found: the record number')
    sets = sets if len(sets) > 1 else []
    unknown = [f"#   {p} = {dumps(v)}" for p, v in list(rest.items())[:40]]
    tail = ["", "# fields not placed (map them if they mean something above):", *unknown] if unknown else []
    return "\n".join([*head, "", *body, "", *sets, *tail]) + "\n"


def _glob(name: str) -> str:
    """A glob for files like the sample: its extension(s), with its name's own words when they look fixed."""
    m = re.match(r"^(.*?)(\.[A-Za-z]+(?:\.gz|\.zst)?)$", name)
    return f"*{m.group(2)}" if m else name


def _check(proposal: Proposal, sample: Path) -> None:
    """Read the sample with the proposal (and with each undecided field's readings) and keep what it gives."""
    with tempfile.TemporaryDirectory(prefix="forensics-init-") as folder:
        tmp = Path(folder) / "proposed.toml"
        tmp.write_text(proposal.text, encoding="utf-8")
        try:
            proposal.facts, problems = read_with(sample, tmp)
        except ForensicsError as exc:
            proposal.problems.append(exc.one_line().replace(str(tmp), "the proposal"))
            return
        proposal.attempts = proposal.facts.attempts
        proposal.problems.extend(problems)
        for c in proposal.choices:
            for label, line in c.options:
                tmp.write_text(_with(proposal.text, c.canonical, line), encoding="utf-8")
                try:
                    proposal.options[f"{c.canonical}={label}"] = read_with(sample, tmp)[0].sentence()
                except ForensicsError as exc:
                    proposal.options[f"{c.canonical}={label}"] = exc.one_line().replace(str(tmp), "the proposal")


def _with(text: str, canonical: str, line: str) -> str:
    """The proposal with one reading of an undecided field put in."""
    return text.replace("[attempts.fields]\n", f"[attempts.fields]\n{line}\n", 1)
