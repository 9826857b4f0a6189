"""The Spark engine: the store's views and the same named SQL, on a Spark session.

``use_spark(store, master)`` makes every ``store.connect()`` hand out a ``SparkConnection`` instead of a DuckDB
connection.  It has the five methods the analysis calls on a connection (``execute``, ``sql``, ``register``,
``unregister``, ``close``) and binds each table as a Spark temporary view over the same Parquet files the DuckDB
views read (a part's own file with ``run`` from its hive folder, a pack's rows less those of parts dropped since).
Every statement is DuckDB SQL, as in ``forensics/queries/``: ``transpile`` turns it into Spark SQL with sqlglot,
the bound parameters (``$name``, ``?``) becoming typed literals.  A few constructs mean something else on Spark
and are rewritten on the syntax tree (``FIXES``); a query that needs more is written in the subset both share.

The session is made once per process (``session``): ``--spark-master URL`` for a cluster, ``local[*]`` by default,
the UI off and the driver bound to 127.0.0.1 for a local master.  Install with ``pip install
'llama-forensics[spark]'``; Java 17 or newer must be on the PATH (or JAVA_HOME).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from forensics import schema
from forensics.errors import InternalError, QueryError, StoreError

if TYPE_CHECKING:
    from forensics.store import Store

DEFAULT_MASTER = "local[*]"
INSTALL_HINT = "pip install 'llama-forensics[spark]'"
JAVA_HINT = "install Java 17 or newer (Debian: apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
LOG_CONFIG = Path(__file__).resolve().parent / "spark-log4j2.properties"  # errors only, on stderr
_SESSIONS: dict[str, Any] = {}


# ---------------------------------------------------------------------------------------------- session
@cache
def _java_major(java: str) -> int | None:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if m is None:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major  # "1.8.0" is Java 8


def check_runtime() -> None:
    """Raise one line when Spark cannot start here: pyspark not installed, no Java, or a Java too old."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise StoreError("--engine spark needs pyspark, which is not installed", hint=INSTALL_HINT) from None
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise StoreError("--engine spark needs Java, and none was found", hint=JAVA_HINT)
    major = _java_major(java)
    if major is None or major < 17:
        raise StoreError(f"--engine spark needs Java 17 or newer; {java} is {major or 'unknown'}", hint=JAVA_HINT)


def _local(master: str) -> bool:
    return master.startswith("local")


SMALL_DATA = {  # a local session over small stores (the tests): plans and JIT dominate, not the data
    "spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.adaptive.enabled": "false", "java": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}


def session(master: str | None = None, *, partitions: int | None = None, conf: Mapping[str, str] | None = None) -> Any:
    """The process's Spark session for ``master`` (made on first use; a second master is an error: a process
    has one SparkContext).  ``conf`` adds Spark settings (``java``: options for the driver's JVM)."""
    conf = dict(conf or {})
    java = conf.pop("java", "")
    master = master or os.environ.get("FORENSICS_SPARK_MASTER") or DEFAULT_MASTER
    check_runtime()  # first: what the machine lacks is the answer, whatever ran before in this process
    if master in _SESSIONS:
        return _SESSIONS[master]
    if _SESSIONS:
        raise StoreError(f"a Spark session on {next(iter(_SESSIONS))} is running; cannot start one on {master}",
                         hint="use one --spark-master per process")
    from pyspark.sql import SparkSession

    b = (SparkSession.builder.master(master).appName("llama-forensics")
         .config("spark.ui.enabled", "false")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.sql.sources.partitionColumnTypeInference.enabled", "false")  # run=42 stays a string
         .config("spark.sql.execution.arrow.pyspark.enabled", "true")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={LOG_CONFIG} {java}".strip()))
    for key, value in conf.items():
        b = b.config(key, value)
    if _local(master):  # nothing listens beyond this machine
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        b = (b.config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", str(partitions or max(2, 2 * (os.cpu_count() or 1)))))
    elif partitions:
        b = b.config("spark.sql.shuffle.partitions", str(partitions))
    try:
        spark = b.getOrCreate()
    except Exception as exc:  # the JVM did not start: say why in one line
        raise StoreError(f"Spark did not start on {master}: {str(exc).strip().splitlines()[0][:200]}",
                         hint="check --spark-master and the Java install") from exc
    spark.sparkContext.setLogLevel("ERROR")
    logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)  # a failed query is our QueryError
    _SESSIONS[master] = spark
    return spark


class SparkEngine:
    """Connections to a store's tables on one Spark session (``Store.engine``)."""

    name = "spark"

    def __init__(self, master: str | None = None, *, partitions: int | None = None,
                 conf: Mapping[str, str] | None = None) -> None:
        check_runtime()  # a missing or old Java is said at once; the JVM starts when a query first needs it
        self._args = (master, partitions, conf)
        self._spark: Any = None

    @property
    def spark(self) -> Any:
        """The session, started on first use: a command that only reads the stored analysis (``read_derived``)
        never waits for a JVM."""
        if self._spark is None:
            master, partitions, conf = self._args
            self._spark = session(master, partitions=partitions, conf=conf)
        return self._spark

    def connect(self, store: Store, *, tables: list[str] | None = None, existing_only: bool = False) -> SparkConnection:
        con = SparkConnection(self.spark.newSession())  # its own temporary views: connections never collide
        for table in tables or list(schema.TABLES):
            con.bind(store, table, existing_only)
        return con


def use_spark(store: Store, master: str | None = None, *, partitions: int | None = None) -> Store:
    """``store`` (or fleet) read through Spark from now on: every ``connect()`` is a ``SparkConnection``."""
    store.engine = SparkEngine(master, partitions=partitions)
    return store


# ---------------------------------------------------------------------------------------------- views
def _spark_type(dtype: pl.DataType) -> str:
    if dtype == pl.Int64():
        return "bigint"
    if dtype == pl.Float64():
        return "double"
    if dtype == pl.Boolean():
        return "boolean"
    if isinstance(dtype, pl.Datetime):
        return "timestamp"
    return "string"


def _conformed(frame: Any, table: str) -> Any:
    """The schema's columns in order (NULL of its type for a column no part has); events keep their
    format-specific fields too, as the DuckDB views do.  The files were read with the contract's types."""
    from pyspark.sql import functions as F

    have = set(frame.columns)
    declared = schema.TABLES[table]
    cols = [F.col(f"`{c.name}`") if c.name in have else F.lit(None).cast(_spark_type(c.dtype)).alias(c.name)
            for c in declared]
    if table == "events":
        known = {c.name for c in declared}
        cols += [F.col(f"`{c}`") for c in frame.columns if c not in known]
    return frame.select(*cols)


def _file_schema(paths: list[str], table: str) -> str:
    """The Spark schema of ``table``'s files: the contract's columns and types, plus (events) the format-specific
    fields the files carry, read from their Parquet footers here (no Spark job to infer it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import from_arrow_type

    declared = {c.name: _spark_type(c.dtype) for c in schema.TABLES[table]}
    cols = dict(declared)
    for path in paths:
        for f in pq.read_schema(path):
            if f.name not in cols and f.name != "_part":
                cols[f.name] = "string" if pa.types.is_null(f.type) else from_arrow_type(_plain(f.type)).simpleString()
    return ", ".join(f"`{name}` {kind}" for name, kind in cols.items())


def _member_frame(spark: Any, store: Store, table: str, existing_only: bool) -> Any | None:
    """One store's rows of ``table``: own part files (``run`` from the folder) and packs, as one frame."""
    from pyspark.sql import functions as F

    own, packs = store.table_files(table, existing_only)
    if not own and not packs:
        return None
    ddl = _file_schema([*own, *(p for p, _ in packs)], table)
    frames = []
    if own:
        frames.append(spark.read.schema(ddl).option("basePath", str(store.root / table)).parquet(*own))
    for path, dead in packs:
        rows = spark.read.schema(ddl + ", `_part` string").parquet(path)
        if dead:
            rows = rows.where(~F.col("_part").isin(dead))
        frames.append(rows.drop("_part"))
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f, allowMissingColumns=True)
    return out


def _derived_frame(spark: Any, store: Store, table: str) -> Any | None:
    """One store's rows of a derived table (``forensics.derived``): its file in every live batch, less the batches'
    dead runs."""
    from pyspark.sql import functions as F

    from forensics import derived

    frames = []
    for b in derived.batches(store):
        rel = b.tables.get(table)
        if rel is None:
            continue
        rows = spark.read.parquet(str(store.root / rel))
        frames.append(rows.where(~F.col("run").isin(sorted(b.dead))) if b.dead else rows)
    if not frames:
        return None
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f, allowMissingColumns=True)
    return out


def table_frame(spark: Any, store: Store, table: str, existing_only: bool = False) -> Any:
    """``table`` of ``store`` (or of each member of a fleet, its runs named ``host:run``) as a Spark frame with
    the DuckDB view's columns."""
    from pyspark.sql import functions as F

    from forensics.fleet import HOST_SEP, RUN_NAME_COLUMNS, members_of

    frames = []
    declared = table in schema.TABLES
    for host, member in members_of(store):
        frame = _member_frame(spark, member, table, existing_only) if declared else \
            _derived_frame(spark, member, table)
        if frame is not None and host is not None:
            for col in ("run", *RUN_NAME_COLUMNS.get(table, ())):
                if col in frame.columns:
                    frame = frame.withColumn(col, F.concat(F.lit(host + HOST_SEP), F.col(col).cast("string")))
        if frame is not None:
            frames.append(frame)
    if not frames and not declared:
        raise StoreError(f"the store has no derived table {table!r}", hint="run `forensics ingest` again")
    if not frames:
        ddl = ", ".join(f"`{c.name}` {_spark_type(c.dtype)}" for c in schema.TABLES[table])
        return spark.createDataFrame([], ddl)
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f, allowMissingColumns=True)
    return _conformed(out, table) if declared else out


# ---------------------------------------------------------------------------------------------- transpiling
def _json_type(structure: str) -> str | None:
    """A DuckDB JSON structure (``'["VARCHAR"]'``, ``'[{"name": "VARCHAR"}]'``) as a Spark schema
    (``ARRAY<STRING>``, ``ARRAY<STRUCT<`name`: STRING>>``); None if it is not made of lists, objects and these
    types."""
    import json

    names = {"VARCHAR": "STRING", "BIGINT": "BIGINT", "DOUBLE": "DOUBLE", "BOOLEAN": "BOOLEAN"}

    def spark(node: Any) -> str | None:
        if isinstance(node, str):
            return names.get(node.upper())
        if isinstance(node, list) and len(node) == 1:
            inner = spark(node[0])
            return f"ARRAY<{inner}>" if inner else None
        if isinstance(node, dict) and node:
            fields = [(k, spark(v)) for k, v in node.items()]
            if all(t for _, t in fields) and all(re.fullmatch(r"\w+", k) for k, _ in fields):
                return "STRUCT<" + ", ".join(f"`{k}`: {t}" for k, t in fields) + ">"
        return None

    try:
        return spark(json.loads(structure))
    except ValueError:
        return None


def _fix(node: Any) -> Any:
    """One node of a DuckDB statement as Spark must see it to mean the same (see FIXES)."""
    from sqlglot import exp

    if isinstance(node, exp.CTE) and node.args.get("materialized") is not None:
        node.set("materialized", None)  # a planner hint Spark's grammar lacks
        return node
    if isinstance(node, exp.TimeToUnix):  # epoch(ts): seconds with their fraction (UNIX_TIMESTAMP drops it)
        micros = exp.Anonymous(this="UNIX_MICROS", expressions=[node.this])
        return exp.Div(this=exp.cast(micros, "double"), expression=exp.Literal.number(1000000))
    if isinstance(node, exp.UnixToTime) and node.args.get("scale") is None:  # to_timestamp(seconds): its fraction
        seconds = exp.Paren(this=node.this.transform(_fix))  # its own epoch() fixed too: a replaced node's
        whole = exp.cast(exp.Round(this=exp.Mul(this=seconds, expression=exp.Literal.number(1000000))), "bigint")
        return exp.Anonymous(this="TIMESTAMP_MICROS", expressions=[whole])
    if isinstance(node, exp.PercentileCont) and not isinstance(node.parent, exp.WithinGroup):
        return exp.Anonymous(this="PERCENTILE", expressions=[node.this, node.expression])  # exact, interpolated
    if isinstance(node, exp.PercentileDisc) and not isinstance(node.parent, exp.WithinGroup):
        # quantile_disc(x, q): Spark takes the standard form (the same value: the first whose share reaches q)
        order = exp.Order(expressions=[exp.Ordered(this=node.this.copy())])
        disc = exp.Anonymous(this="PERCENTILE_DISC", expressions=[node.expression.copy()])  # not sqlglot's approx
        return exp.WithinGroup(this=disc, expression=order)
    if isinstance(node, exp.Anonymous) and str(node.this).lower() == "list_position":
        pos = exp.Anonymous(this="ARRAY_POSITION", expressions=node.expressions)
        return exp.Nullif(this=pos, expression=exp.Literal.number(0))  # 0 on Spark, NULL on DuckDB
    if isinstance(node, exp.Anonymous) and str(node.this).lower() == "printf" and len(node.expressions) > 1:
        nulls = [exp.Is(this=a.copy(), expression=exp.null()) for a in node.expressions]
        formatted = exp.Anonymous(this="FORMAT_STRING", expressions=node.expressions)
        return exp.If(this=exp.or_(*nulls), true=exp.null(), false=formatted)  # DuckDB: NULL in, NULL out
    if isinstance(node, exp.FromJson) and isinstance(node.expression, exp.Literal):
        spark_type = _json_type(node.expression.this)
        if spark_type is not None:
            return exp.Anonymous(this="FROM_JSON", expressions=[node.this, exp.Literal.string(spark_type)])
    if isinstance(node, exp.Literal) and not node.is_string and re.search(r"[.eE]", node.this):
        return exp.cast(node.copy(), "double")  # 1000.0 is a DECIMAL on Spark: division then rounds to 6 places
    if (isinstance(node, exp.Cast) and isinstance(node.this, exp.Div)
            and node.to.this in (exp.DataType.Type.BIGINT, exp.DataType.Type.INT)):
        return exp.Cast(this=exp.Round(this=node.this), to=node.to)  # DuckDB rounds a double cast to integer
    return node


FIXES = """[NOT] MATERIALIZED hints are dropped; epoch(ts) and to_timestamp(seconds) keep their fraction; quantile_cont is Spark's exact percentile; quantile_disc its percentile_disc within group; list_position is NULL when
absent; printf of a NULL is NULL (Spark writes "null"); from_json takes a Spark schema; decimal literals are doubles; a double cast to an integer rounds."""


@cache
def _parsed(sql: str) -> Any:
    import sqlglot

    try:
        tree = sqlglot.parse_one(sql, read="duckdb")
    except sqlglot.errors.ParseError as exc:
        raise QueryError(f"cannot read the SQL for Spark: {str(exc).splitlines()[0]}",
                         hint="write it in the SQL both DuckDB and Spark read") from exc
    return tree.transform(_fix)


def _literal(value: object) -> Any:
    from sqlglot import exp

    if value is None:
        return exp.null()
    if isinstance(value, bool):
        return exp.true() if value else exp.false()
    if isinstance(value, (int, float)):
        lit = exp.Literal.number(repr(value))
        return exp.cast(lit, "double") if isinstance(value, float) else lit
    if isinstance(value, (list, tuple)):
        items = [_literal(v) for v in value]
        kind = "string" if all(isinstance(v, str) for v in value) else None
        arr = exp.Array(expressions=items)
        return exp.cast(arr, f"array<{kind}>") if kind else arr
    return exp.Literal.string(str(value))


def transpile(sql: str, params: Mapping[str, object] | Sequence[object] | None = None) -> Any:
    """The DuckDB statement ``sql`` as a sqlglot tree in Spark's terms, its parameters bound as literals."""
    from sqlglot import exp

    tree = _parsed(sql).copy()
    if params is None:
        return tree
    positional = iter(params) if isinstance(params, (list, tuple)) else None
    named = params if isinstance(params, Mapping) else {}
    for node in list(tree.find_all(exp.Placeholder, exp.Parameter)):
        name = "" if node.name == "?" else node.name
        if name and name in named:
            node.replace(_literal(named[name]))
        elif not name and positional is not None:
            node.replace(_literal(next(positional)))
        else:
            raise QueryError(f"no value for the parameter {name or '?'}", hint="this is a bug in the caller")
    return tree


def spark_sql(sql: str, params: Mapping[str, object] | Sequence[object] | None = None) -> str:
    """``sql`` (DuckDB) as Spark SQL text, parameters bound."""
    return str(transpile(sql, params).sql(dialect="spark"))


# ---------------------------------------------------------------------------------------------- connection
def _to_polars(frame: Any) -> pl.DataFrame:
    """A Spark frame's rows as polars, decimals as doubles (DuckDB's type for the same arithmetic)."""
    table = frame.toArrow()
    out = pl.from_arrow(table)
    if not isinstance(out, pl.DataFrame):  # from_arrow of a table is a frame; a series would be a bug here
        raise InternalError(f"Spark's Arrow result read as {type(out).__name__}, not a table")
    decimals = [c for c, t in out.schema.items() if isinstance(t, pl.Decimal)]
    return out.with_columns(pl.col(decimals).cast(pl.Float64)) if decimals else out


class SparkResult:
    """A statement's result, read the ways the analysis reads a DuckDB result: ``fetchall``, ``fetchone``,
    and as an Arrow stream (``fetch_pl``)."""

    def __init__(self, frame: Any | None) -> None:
        self._frame = frame
        self._rows: pl.DataFrame | None = None

    def pl(self) -> pl.DataFrame:
        if self._rows is None:
            self._rows = pl.DataFrame() if self._frame is None else _to_polars(self._frame)
        return self._rows

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.pl().rows()

    def fetchone(self) -> tuple[Any, ...] | None:
        rows = self.pl().rows()
        return rows[0] if rows else None

    def __arrow_c_stream__(self, requested_schema: object = None) -> object:
        return self.pl().__arrow_c_stream__(requested_schema)


def _plain(t: Any) -> Any:
    """An Arrow type Spark reads: polars' string and binary views as plain strings and binaries."""
    import pyarrow as pa

    if t in (pa.string_view(), pa.large_string()):
        return pa.string()
    if t in (pa.binary_view(), pa.large_binary()):
        return pa.binary()
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return pa.list_(_plain(t.value_type))
    return t


def _arrow_table(obj: Any) -> Any:
    import pyarrow as pa

    if isinstance(obj, pl.DataFrame):
        table = obj.to_arrow()
    elif isinstance(obj, pa.Table):
        table = obj
    else:
        table = pa.table(obj)  # anything with __arrow_c_stream__ (store.ArrowStream)
    target = pa.schema([f.with_type(_plain(f.type)) for f in table.schema])
    return table.cast(target) if target != table.schema else table


class SparkConnection:
    """One Spark session's temporary views over a store, used like a DuckDB connection (see the module)."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self._views: set[str] = set()
        self._kept: list[Any] = []  # materialized frames, released at close

    def bind(self, store: Store, table: str, existing_only: bool = False) -> None:
        """``table`` of ``store`` as a view of the same name."""
        try:
            frame = table_frame(self.spark, store, table, existing_only)
        except StoreError:
            raise
        except Exception as exc:  # a damaged part: say so, never read it as "no rows"
            raise StoreError(f"cannot read the {table} table: {_first_line(exc)}",
                             hint="run `forensics check` to see how to repair the store") from exc
        self._view(table, frame)

    def _view(self, name: str, frame: Any) -> None:
        frame.createOrReplaceTempView(name)
        self._views.add(name)

    def view_names(self) -> set[str]:
        return set(self._views)

    def register(self, name: str, obj: Any) -> None:
        """A frame (polars, Arrow, or any Arrow stream) as the view ``name``."""
        table = _arrow_table(obj)
        if table.num_rows == 0:  # Spark infers no type from no rows: give it the schema
            from pyspark.sql.pandas.types import from_arrow_schema

            frame = self.spark.createDataFrame([], from_arrow_schema(table.schema))
        else:
            frame = self.spark.createDataFrame(table)
        self._view(name, frame)

    def unregister(self, name: str) -> None:
        self.spark.catalog.dropTempView(name)
        self._views.discard(name)

    def execute(self, sql: str, params: Mapping[str, object] | Sequence[object] | None = None) -> SparkResult:
        """Run one DuckDB statement: a query, ``CREATE [OR REPLACE] TEMP VIEW|TABLE name AS query`` (a table is
        computed once and kept), or ``DESCRIBE name``."""
        from sqlglot import exp

        tree = transpile(sql, params)
        try:
            if isinstance(tree, exp.Create) and isinstance(tree.expression, exp.Query):
                frame = self.spark.sql(tree.expression.sql(dialect="spark"))
                if str(tree.args.get("kind", "")).upper() == "TABLE":
                    frame = frame.localCheckpoint()  # computed now, read many times
                    self._kept.append(frame)
                self._view(tree.this.name, frame)
                return SparkResult(None)
            if isinstance(tree, exp.Describe):
                fields = self.spark.table(tree.this.name).schema.fields
                return SparkResult(self.spark.createDataFrame(
                    [(f.name, f.dataType.simpleString()) for f in fields], "column_name string, column_type string"))
            return SparkResult(self.spark.sql(tree.sql(dialect="spark")))
        except Exception as exc:
            if isinstance(exc, (QueryError, StoreError)):
                raise
            raise QueryError(f"Spark: {_first_line(exc)}", hint="write the query in the SQL both engines read "
                             "(docs/scale.md)") from exc

    def sql(self, sql: str, params: Mapping[str, object] | Sequence[object] | None = None) -> SparkResult:
        result = self.execute(sql, params)
        try:
            result.pl()  # run now, so a failure is raised here as with DuckDB
        except Exception as exc:
            raise QueryError(f"Spark: {_first_line(exc)}", hint="write the query in the SQL both engines read "
                             "(docs/scale.md)") from exc
        return result

    def close(self) -> None:
        for name in list(self._views):
            self.spark.catalog.dropTempView(name)
        self._views.clear()
        for frame in self._kept:
            frame.unpersist()
        self._kept.clear()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    # Spark's messages start with an error class in brackets, then the sentence; the plan follows on later lines
    return (text.splitlines() or [type(exc).__name__])[0][:300]

