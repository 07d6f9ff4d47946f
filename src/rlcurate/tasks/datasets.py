"""Reading real datasets from a local directory or the Hugging Face Hub (chapter 4, *The variance audit*).

The book never ships dataset files. A user points ``RLCURATE_DATA_DIR`` (or a ``data_dir`` argument)
at a directory laid out as ::

    <data_dir>/gsm8k/train.jsonl, test.jsonl
    <data_dir>/math500/test.jsonl
    <data_dir>/math_train_l3to5/train.jsonl   (or train.parquet)
    <data_dir>/countdown/train.jsonl, test.jsonl

or, on a machine with Hub access and no such directory, the rows are fetched by dataset id with
``datasets.load_dataset``. Either way a split becomes a list of :class:`Record` (one row plus the file
and line it came from), and a malformed row raises :class:`DatasetFormatError` naming file, line
and field. :class:`DatasetTask` is the shared base of the GSM8K, MATH and Countdown tasks.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from rlcurate.errors import UserError
from rlcurate.tasks.base import Problem, Task

log = logging.getLogger(__name__)

__all__ = [
    "DATA_DIR_ENV",
    "HINT_HEADER",
    "DatasetFormatError",
    "DatasetUnavailableError",
    "UnusableRow",
    "HubSpec",
    "Record",
    "SplitSpec",
    "DatasetTask",
    "resolve_data_dir",
    "read_jsonl",
    "read_parquet",
    "read_local",
    "read_hub",
    "load_split",
    "row_field",
    "with_hint",
]

DATA_DIR_ENV = "RLCURATE_DATA_DIR"
HINT_HEADER = "Here is a hint to help you:"


class DatasetFormatError(UserError):
    """A dataset row that cannot be used (chapter 4); the message names the file, the line and the field.
    A :class:`~rlcurate.errors.UserError` (so a ``ValueError``): the command line prints it as one line."""

    def __init__(self, source: str, line: int, field_name: str, problem: str):
        self.source, self.line, self.field, self.problem = source, line, field_name, problem
        super().__init__(f"{source}, line {line}: field {field_name!r}: {problem}")


class DatasetUnavailableError(FileNotFoundError):
    """A split that could be read neither from a local directory nor from the Hub (chapter 4)."""


class UnusableRow(Exception):
    """A well-formed row that cannot be graded (an empty gold answer; chapter 4); the task skips it with a
    warning and lists it in ``task.skipped[split]`` instead of failing the whole split."""

    def __init__(self, source: str, line: int, field_name: str, problem: str):
        self.source, self.line, self.field, self.problem = source, line, field_name, problem
        super().__init__(f"{source}, line {line}: field {field_name!r}: {problem}")


@dataclass(frozen=True)
class Record:
    """One dataset row (chapter 4).

    Attributes:
        data: the row as a dict.
        source: where it came from (a file path, or ``hf://<id>`` for the Hub).
        line: 1-based line of a JSONL file, or 1-based row of a parquet file or Hub split.
        index: 0-based position of the row in its split (the basis of stable problem ids).
    """

    data: Mapping[str, Any]
    source: str
    line: int
    index: int


@dataclass(frozen=True)
class HubSpec:
    """Where a split lives on the Hugging Face Hub (chapter 4): ``load_dataset(id, config, data_dir=..., split=...)``.

    ``split`` may use slicing syntax (``"train[:8001]"``).
    """

    id: str
    split: str
    config: str | None = None
    data_dir: str | None = None


@dataclass(frozen=True)
class SplitSpec:
    """Where one split of a task lives (chapter 4): ``<data_dir>/<folder>/<stem>.jsonl`` (or ``.parquet``),
    or on the Hub."""

    folder: str
    stem: str
    hub: HubSpec | None = None


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path | None:
    """The local dataset directory: ``data_dir`` if given, else ``$RLCURATE_DATA_DIR``, else ``None``.

    Raises ``ValueError`` when the directory given does not exist (chapter 4 sets it for the book).
    """
    if data_dir is None:
        env = os.environ.get(DATA_DIR_ENV, "").strip()
        if not env:
            return None
        path = Path(env).expanduser()
        if not path.is_dir():
            raise ValueError(f"{DATA_DIR_ENV}={env!r} is not a directory")
        return path
    if not isinstance(data_dir, (str, os.PathLike)):
        raise ValueError(f"data_dir must be a path, got {data_dir!r}")
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise ValueError(f"data_dir={str(data_dir)!r} is not a directory")
    return path


def read_jsonl(path: str | os.PathLike) -> list[Record]:
    """The rows of a JSON-lines file, one JSON object per non-blank line (chapter 4).

    A line that is not UTF-8 text, not valid JSON, or not a JSON object raises
    :class:`DatasetFormatError` naming the file and line.
    """
    path = Path(path)
    records: list[Record] = []
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                problem = (f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
                           "save the file as UTF-8")
                raise DatasetFormatError(str(path), lineno, "<row>", problem) from None
            if lineno == 1 and text.startswith("\ufeff"):  # the byte-order mark some editors write
                text = text[1:]
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                raise DatasetFormatError(str(path), lineno, "<row>", f"not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                problem = f"expected a JSON object, got {type(row).__name__}"
                raise DatasetFormatError(str(path), lineno, "<row>", problem)
            records.append(Record(row, str(path), lineno, len(records)))
    return records


def read_parquet(path: str | os.PathLike) -> list[Record]:
    """The rows of a parquet file (chapter 4; needs ``pyarrow``, which ``datasets`` installs); ``line`` is
    the 1-based row."""
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - pyarrow comes with datasets
        raise ImportError(f"reading {path} needs pyarrow: pip install pyarrow (or use the .jsonl file)") from exc
    rows = pq.read_table(str(path)).to_pylist()
    return [Record(row, str(path), i + 1, i) for i, row in enumerate(rows)]


def read_local(data_dir: str | os.PathLike, spec: SplitSpec) -> list[Record]:
    """Rows of ``<data_dir>/<folder>/<stem>.jsonl``, else of the ``.parquet`` file next to it (chapter 4).

    Raises :class:`DatasetUnavailableError` naming the paths tried when neither exists.
    """
    base = Path(data_dir) / spec.folder
    jsonl, parquet = base / f"{spec.stem}.jsonl", base / f"{spec.stem}.parquet"
    if jsonl.is_file():
        return read_jsonl(jsonl)
    if parquet.is_file():
        return read_parquet(parquet)
    raise DatasetUnavailableError(
        f"no dataset file for split {spec.stem!r}: neither {jsonl} nor {parquet} exists "
        f"(the data directory must be laid out as <data_dir>/{spec.folder}/{spec.stem}.jsonl)"
    )


def read_hub(hub: HubSpec, local_hint: str = "") -> list[Record]:
    """Rows of a Hugging Face Hub dataset split, via ``datasets.load_dataset`` (chapter 4).

    Any failure (no ``datasets`` package, no network, offline mode, unknown id) raises
    :class:`DatasetUnavailableError` that names the dataset id and says how to use a local copy.
    """
    where = f"dataset {hub.id!r}" + (f" (config {hub.config!r})" if hub.config else "")
    where += f", split {hub.split!r}" + (f", data_dir {hub.data_dir!r}" if hub.data_dir else "")
    advice = (
        f"To work offline, download it once, save the rows as JSON lines under a directory laid out as "
        f"<dir>/{local_hint or '<task>/<split>.jsonl'}, and set {DATA_DIR_ENV}=<dir> (or pass data_dir=...)."
    )
    try:
        import datasets
    except ImportError as exc:
        raise DatasetUnavailableError(
            f"loading {where} from the Hugging Face Hub needs the 'datasets' package "
            f"(pip install 'rlcurate[gpu]'). {advice}"
        ) from exc
    kwargs = {"split": hub.split}
    if hub.data_dir:
        kwargs["data_dir"] = hub.data_dir
    try:
        ds = datasets.load_dataset(hub.id, hub.config, **kwargs)
    except Exception as exc:  # offline, unknown id, no permission: one clear message
        raise DatasetUnavailableError(
            f"could not load {where} from the Hugging Face Hub ({type(exc).__name__}: {exc}). {advice}"
        ) from exc
    source = f"hf://{hub.id}" + (f"/{hub.config}" if hub.config else "") + f"[{hub.split}]"
    return [Record(dict(row), source, i + 1, i) for i, row in enumerate(ds)]


def load_split(
    spec: SplitSpec,
    data_dir: str | os.PathLike | None = None,
    source: str = "auto",
) -> list[Record]:
    """The rows of one split (chapter 4).

    ``source="auto"`` reads the local directory (``data_dir`` or ``$RLCURATE_DATA_DIR``) when one is
    set and falls back to the Hub otherwise; ``"local"`` and ``"hub"`` force one of them.
    """
    if source not in ("auto", "local", "hub"):
        raise ValueError(f"source must be 'auto', 'local' or 'hub', got {source!r}")
    local_hint = f"{spec.folder}/{spec.stem}.jsonl"
    if source != "hub":
        root = resolve_data_dir(data_dir)
        if root is not None:
            return read_local(root, spec)
        if source == "local":
            raise DatasetUnavailableError(
                f"no local data directory: pass data_dir=... or set {DATA_DIR_ENV} to a directory "
                f"holding {local_hint}"
            )
    if spec.hub is None:
        raise DatasetUnavailableError(
            f"split {spec.stem!r} of {spec.folder!r} has no Hugging Face Hub source; set {DATA_DIR_ENV} "
            f"to a directory holding {local_hint}"
        )
    return read_hub(spec.hub, local_hint)


_TYPE_NAMES = {str: "a string", int: "an integer", list: "a list"}


def row_field(record: Record, name: str | Sequence[str], kind: type, required: bool = True) -> Any:
    """The value of field ``name`` of ``record`` (chapter 4; the first present of several alternative names),
    checked to be of type ``kind``; a missing or mistyped field raises :class:`DatasetFormatError`.

    Integers stored as floats (``3.0``, as parquet may give) are accepted for ``kind=int``; booleans are not.
    Returns ``None`` for a missing optional field.
    """
    names = (name,) if isinstance(name, str) else tuple(name)
    label = " or ".join(repr(n) for n in names)
    present = [n for n in names if n in record.data and record.data[n] is not None]
    if not present:
        if required:
            raise DatasetFormatError(record.source, record.line, names[0], f"missing (expected {label})")
        return None
    key = present[0]
    value = record.data[key]
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise DatasetFormatError(
            record.source, record.line, key,
            f"must be {_TYPE_NAMES.get(kind, kind.__name__)}, got {type(value).__name__} {value!r:.80}",
        )
    return value


def with_hint(text: str, hint: str | None) -> str:
    """The user turn with a SAGE hint (chapter 7), or ``text`` unchanged when ``hint`` is empty; the
    layout of SAGE's released code (``_build_answer_messages_with_hint``)::

        Question:
        <text>

        Here is a hint to help you:
        <hint>
    """
    if hint is None:
        return text
    if not isinstance(hint, str):
        raise ValueError(f"hint must be a string or None, got {hint!r}")
    if not hint.strip():
        return text
    return f"Question:\n{text}\n\n{HINT_HEADER}\n{hint.strip()}"


def _display_source(record: Record, root: Path | None) -> str:
    if root is not None:
        try:
            return Path(os.path.abspath(record.source)).relative_to(os.path.abspath(root)).as_posix()
        except ValueError:
            pass
    return record.source


class DatasetTask(Task):
    """A :class:`~rlcurate.tasks.base.Task` backed by dataset files (chapter 4).

    Subclasses set :attr:`name`, :attr:`splits` (split name to :class:`SplitSpec`) and
    :attr:`default_system_prompt`, and implement :meth:`_parse` (one :class:`Record` to a
    :class:`~rlcurate.tasks.base.Problem`, raising :class:`DatasetFormatError` on a bad row) and
    :meth:`_user_text`.

    Args:
        data_dir: local dataset directory; ``None`` reads ``$RLCURATE_DATA_DIR``, else the Hub.
        source: ``"auto"``, ``"local"`` or ``"hub"`` (see :func:`load_split`).
        system_prompt: the system turn; ``None`` uses the task's default, ``""`` sends no system turn.
        prefill: text the assistant turn starts with.
        validation_size: the last this many problems of the training file form the ``validation``
            split (for choosing a learning rate without the test prompts, chapter 10), and the
            ``train`` split leaves them out; 0 (the default): no validation split.
    """

    splits: Mapping[str, SplitSpec] = {}
    default_system_prompt: str = ""

    def __init__(
        self,
        data_dir: str | os.PathLike | None = None,
        *,
        source: str = "auto",
        system_prompt: str | None = None,
        prefill: str = "",
        validation_size: int = 0,
    ):
        if isinstance(validation_size, bool) or not isinstance(validation_size, int) or validation_size < 0:
            raise ValueError(f"validation_size must be an integer >= 0, got {validation_size!r}")
        if source not in ("auto", "local", "hub"):
            raise ValueError(f"source must be 'auto', 'local' or 'hub', got {source!r}")
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise ValueError(f"system_prompt must be a string or None, got {system_prompt!r}")
        if not isinstance(prefill, str):
            raise ValueError(f"prefill must be a string, got {prefill!r}")
        if data_dir is not None:
            resolve_data_dir(data_dir)  # fail early on a wrong path
        self.data_dir = data_dir
        self.source = source
        self.system_prompt = self.default_system_prompt if system_prompt is None else system_prompt
        self._prefill = prefill
        self.validation_size = validation_size
        self._cache: dict[str, list[Problem]] = {}
        self.skipped: dict[str, list[str]] = {}

    # -- problems -----------------------------------------------------------------------------
    def problems(self, split: str = "train") -> list[Problem]:
        """All problems of ``split`` in file order; parsed once, then cached (chapter 4).

        A malformed row raises :class:`DatasetFormatError`; a row that cannot be graded (an empty
        gold answer) is skipped with a warning and listed in ``self.skipped[split]``. With
        ``validation_size`` the ``validation`` split is the end of the training file (class docstring).
        """
        if self.validation_size and split in ("train", "validation"):
            train = self._problems("train")
            if len(train) <= self.validation_size:
                raise ValueError(f"validation_size={self.validation_size} leaves no training problems "
                                 f"(task {self.name!r} has {len(train)})")
            cut = len(train) - self.validation_size
            return train[cut:] if split == "validation" else train[:cut]
        return self._problems(split)

    def _problems(self, split: str) -> list[Problem]:
        if split not in self.splits:
            extra = " (a validation split: task_kwargs validation_size)" if split == "validation" else ""
            raise ValueError(f"split={split!r} is not available for task {self.name!r}; it has "
                             f"{sorted(self.splits)}{extra}")
        if split not in self._cache:
            records = load_split(self.splits[split], self.data_dir, self.source)
            root = resolve_data_dir(self.data_dir) if self.source != "hub" else None
            problems, skipped = [], []
            for record in records:
                try:
                    problem = self._parse(record, split, _display_source(record, root))
                except UnusableRow as exc:
                    skipped.append(str(exc))
                    continue
                if problem is not None:
                    problems.append(problem)
            if skipped:
                log.warning(
                    "task %s split %s: skipped %d row(s) that cannot be graded, e.g. %s",
                    self.name, split, len(skipped), skipped[0],
                )
            self.skipped[split] = skipped
            uids = [p.uid for p in problems]
            if len(set(uids)) != len(uids):
                dup = next(u for u in uids if uids.count(u) > 1)
                raise ValueError(f"task {self.name!r}, split {split!r}: problem uid {dup!r} is not unique")
            log.debug("task %s split %s: %d problems", self.name, split, len(problems))
            self._cache[split] = problems
        return list(self._cache[split])

    def _parse(self, record: Record, split: str, source: str) -> Problem | None:  # pragma: no cover
        raise NotImplementedError

    # -- prompts ------------------------------------------------------------------------------
    def _user_text(self, problem: Problem) -> str:
        return problem.question

    def messages(self, problem: Problem, hint: str | None = None) -> list[dict[str, str]]:
        """The system turn (if any) and the user turn posing ``problem``, with ``hint`` appended (chapter 7)."""
        turns = []
        if self.system_prompt:
            turns.append({"role": "system", "content": self.system_prompt})
        turns.append({"role": "user", "content": with_hint(self._user_text(problem), hint)})
        return turns

    def prefill(self, problem: Problem) -> str:
        """The text the assistant turn starts with (chapter 4; the ``prefill`` given to the constructor)."""
        return self._prefill

    def __repr__(self) -> str:
        where = self.data_dir if self.data_dir is not None else f"${DATA_DIR_ENV} or the Hub"
        return f"{type(self).__name__}(name={self.name!r}, splits={sorted(self.splits)}, data={where})"
