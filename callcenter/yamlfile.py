"""Loading user YAML files into pydantic models with errors that name file, line, column and field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from callcenter.errors import CallcenterError

M = TypeVar("M", bound=BaseModel)
MAX_YAML_NODES = 100_000  # a document that expands (aliases within aliases) to more is refused
MAX_YAML_BYTES = 2_000_000  # a user YAML file larger than this is refused unread


class YamlLoader(yaml.SafeLoader):
    """Safe YAML with YAML 1.2's core types: only true/false are booleans, so a caller's "yes",
    "no", "on" or "off" stays the word the author wrote; and dates stay text (the models parse
    them), as editors and JSON Schema see them."""


YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:timestamp")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


class UserFileError(CallcenterError, ValueError):
    """One or more problems in a user file, each as `file:line:col: message`."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


def _expanded_size(node: yaml.Node | None, limit: int) -> int:
    """How many nodes the document has with every alias expanded, counting up to just past `limit`
    (a "billion laughs" file is a few lines that expand to billions)."""
    count, stack = 0, [node] if node is not None else []
    while stack and count <= limit:
        n = stack.pop()
        count += 1
        if isinstance(n, yaml.MappingNode):
            for key, value in n.value:
                stack += [key, value]
        elif isinstance(n, yaml.SequenceNode):
            stack += n.value
    return count


def _positions(node: yaml.Node, path: tuple = ()) -> dict[tuple, tuple[int, int]]:
    """Map every key path in a composed YAML tree to its (line, col), 1-based."""
    pos = {path: (node.start_mark.line + 1, node.start_mark.column + 1)}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            sub = path + (key.value,)
            pos.update(_positions(value, sub))
            pos[sub] = (key.start_mark.line + 1, key.start_mark.column + 1)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            pos.update(_positions(item, path + (i,)))
    return pos


def _duplicates(node: yaml.Node | None, path: Path) -> list[str]:
    """Every key that appears twice in one mapping (PyYAML would keep the last one silently), at
    the line of the repeat."""
    out: list[str] = []
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, yaml.Node] = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                first = seen.get(key.value)
                if first is not None:
                    out.append(f"{path}:{key.start_mark.line + 1}:{key.start_mark.column + 1}: duplicate key "
                               f"{key.value!r} (first at line {first.start_mark.line + 1}); keys must be unique "
                               "in a mapping")
                else:
                    seen[key.value] = key
            out += _duplicates(value, path)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            out += _duplicates(item, path)
    return out


class LocatedYaml:
    """A parsed YAML document that can tell where any key path sits in the file."""

    def __init__(self, path: Path, text: str):
        self.path = path
        try:
            node = yaml.compose(text, Loader=YamlLoader)
            if _expanded_size(node, MAX_YAML_NODES) > MAX_YAML_NODES:
                raise UserFileError([f"{path}: the document expands to more than {MAX_YAML_NODES} values "
                                     "(anchors and aliases within each other?)"])
            self.data = yaml.load(text, Loader=YamlLoader)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
            hint = ""
            if "got '?'" in str(exc.problem or ""):  # `{text: Open?, next: c}`: the ? starts a key in { }
                hint = "; inside { } or [ ] a text with ? in it must be in quotes ('Open?')"
            elif "got '{'" in str(exc.problem or ""):  # `{text: Hello {name}.}`
                hint = "; inside { } a text with {placeholders} must be in quotes ('Hello {name}.')"
            raise UserFileError([f"{where}: invalid YAML: {exc.problem or exc}{hint}"]) from None
        except yaml.YAMLError as exc:
            raise UserFileError([f"{path}: invalid YAML: {exc}"]) from None
        duplicates = _duplicates(node, path)
        if duplicates:
            raise UserFileError(duplicates)
        self._pos = _positions(node) if node is not None else {}

    def file_loc(self, loc: tuple) -> tuple:
        """Drop the parts of a pydantic error location that are not keys in the file (the tags
        of tagged unions, for example), keeping those that are."""
        out: tuple = ()
        for head in loc:
            if out + (head,) not in self._pos:
                here = self._data_at(out)
                if isinstance(here, dict) and head not in here and head in here.values():
                    continue  # a tag pydantic added (the value of a discriminator field)
            out += (head,)
        return out

    def _data_at(self, loc: tuple):
        data = self.data
        for key in loc:
            try:
                data = data[key]
            except (KeyError, IndexError, TypeError):
                return None
        return data

    def where(self, loc: tuple) -> str:
        loc = tuple(loc)
        while loc and loc not in self._pos:
            loc = loc[:-1]
        line, col = self._pos.get(loc, (1, 1))
        return f"{self.path}:{line}:{col}"


def _field_name(loc: tuple) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def load_model(path: str | Path, model: type[M], context: dict[str, Any] | None = None) -> tuple[M, LocatedYaml]:
    """Parse and validate a YAML file; every problem is reported with its position."""
    doc = load_yaml(path)
    try:
        return model.model_validate(doc.data, context=context), doc
    except ValidationError as exc:
        raise UserFileError(validation_problems(doc, exc, model=model)) from None


def field_names(model: type[BaseModel], seen: set | None = None) -> set[str]:
    """Every field name of `model` and of the models inside it: the words a misspelt key is near."""
    import typing

    seen = seen if seen is not None else set()
    if model in seen:
        return set()
    seen.add(model)
    names = set(model.model_fields)
    for f in model.model_fields.values():
        stack = [f.annotation]
        while stack:
            t = stack.pop()
            if isinstance(t, type) and issubclass(t, BaseModel):
                names |= field_names(t, seen)
            stack += list(typing.get_args(t))
    return names


def validation_problems(doc: LocatedYaml, exc: ValidationError, prefix: tuple = (),
                        model: type[BaseModel] | None = None) -> list[str]:
    """pydantic's errors as `file:line:col: field: message`; `prefix`: where the validated part sits;
    `model`: the keys a misspelt one may have meant."""
    import difflib

    problems = []
    known = field_names(model) if model is not None else set()
    for err in exc.errors():
        loc = doc.file_loc(prefix + tuple(err["loc"]))
        if err["type"] == "union_tag_invalid":  # point at the bad tag, not at the whole entry
            loc += (err["ctx"]["discriminator"].strip("'"),)
        msg = err["msg"]
        if err["type"] == "extra_forbidden" and loc and isinstance(loc[-1], str):
            if loc[-1] in known:  # a real key, of another kind of entry
                msg = f"{loc[-1]!r} is not a key here"
            else:
                near = difflib.get_close_matches(loc[-1], sorted(known), n=1, cutoff=0.7)
                msg = f"unknown key {loc[-1]!r}" + (f" (did you mean {near[0]!r}?)" if near else "")
        problems.append(f"{doc.where(loc)}: {_field_name(loc)}: {msg}")
    return problems


def load_yaml(path: str | Path) -> LocatedYaml:
    """Read and parse a user YAML file (a mapping at the top), with positions."""
    import os
    import stat

    path = Path(path)
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):  # a FIFO would hang the loader (and the reload watcher)
            raise UserFileError([f"{path}: not a regular file"])
        if info.st_size > MAX_YAML_BYTES:
            raise UserFileError([f"{path}: larger than {MAX_YAML_BYTES // 1_000_000} MB"])
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserFileError([f"{path}: no such file"]) from None
    except UnicodeDecodeError:  # the error would quote the file's bytes
        raise UserFileError([f"{path}: cannot read: not UTF-8 text"]) from None
    except OSError as exc:
        raise UserFileError([f"{path}: cannot read: {exc.strerror or type(exc).__name__}"]) from None
    doc = LocatedYaml(path, text)
    if not isinstance(doc.data, dict):
        raise UserFileError([f"{path}:1:1: expected a mapping at the top level"])
    return doc

