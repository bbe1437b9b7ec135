"""Reading the shell the operand pods run: init-container wait loops, entrypoint scripts, preStop hooks.

The templates (ours and NVIDIA's) use a handful of shell idioms, and the emulators act on exactly
those, parsed from the rendered command and args or from the script a ConfigMap mounts:

* ``until [ -f FILE ]; do ...; sleep N; done``: wait for FILE, checking every N seconds;
* ``. FILE`` / ``source FILE``: read an env file (``driver-ready``) into the environment;
* ``export NAME=VALUE``, ``NAME=VALUE``: set a variable (``$VAR``/``${VAR}``/``${VAR:-x}`` expanded);
* ``sleep N`` (a delay), ``sleep infinity`` / ``while true; do sleep N; done`` (run forever);
* ``rm -f GLOB...``: remove files (the validator's and the driver's preStop hooks); ``touch FILE...``;
* ``exit N``; ``exec PROGRAM ARGS`` or a last plain command: the program the script hands over to;
  ``PROGRAM && ...``: a program that runs to its end, the script going on after it (a failure ends the
  script with the program's status, as ``&&`` does);
* ``if [ "$(cat FILE)" != "VALUE" ]; then ...; fi`` (or ``=``): the sandbox gates' test of the
  validator's ``workload-type`` file; the ``then`` part's steps run when it holds.

Everything else (``echo``, ``cat``, ``set``, a redirection alone, ``if``/``for``/``case`` blocks) is
accepted and has no effect. A
script is turned into a list of :class:`Step` records; :mod:`.kubelet` runs them.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

SHELLS = frozenset({"sh", "ash", "bash", "/bin/sh", "/bin/ash", "/bin/bash", "/usr/bin/bash", "/busybox/sh"})


@dataclass(frozen=True)
class Step:
    kind: str
    """wait, source, env, sleep, forever, remove, touch, exit, run (hand over to a program, or with
    `chained` run it to its end and go on), if (`path`'s content compared with `value`, `name` the
    operator, `body` the steps when it holds)."""
    argv: tuple[str, ...] = ()
    path: str = ""
    seconds: float = 0.0
    name: str = ""
    value: str = ""
    code: int = 0
    chained: bool = False
    body: tuple[Step, ...] = ()


@dataclass(frozen=True)
class Script:
    steps: tuple[Step, ...] = field(default_factory=tuple)
    interpreter: str = ""
    """The shebang interpreter (`/bin/sh`), '' without one."""


_BLOCK_OPEN = {"until": "done", "while": "done", "for": "done", "if": "fi", "case": "esac"}


def _statements(text: str) -> list[str]:
    """Split a script into simple statements on newlines and top-level `;`, keeping `do`/`then` apart."""
    out: list[str] = []
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        current, quote = "", ""
        for char in line:
            if quote:
                current += char
                if char == quote:
                    quote = ""
            elif char in "'\"":
                quote = char
                current += char
            elif char == ";":
                out.append(current.strip())
                current = ""
            elif char == "&" and current.endswith("&"):
                # `a && b`: `a` ends a statement that hands over to nothing (marked by a trailing &&).
                out.append(current[:-1].strip() + " &&")
                current = ""
            elif char == "#" and (not current or current.endswith(" ")):
                break
            else:
                current += char
        if current.strip():
            out.append(current.strip())
    result: list[str] = []
    for statement in out:
        for keyword in ("do", "then", "else"):
            if statement == keyword:
                break
            if statement.startswith(keyword + " "):
                result.append(keyword)
                statement = statement[len(keyword) + 1 :].strip()
                break
        if statement:
            result.append(statement)
    return result


def expand(word: str, env: Mapping[str, str]) -> str:
    """`$VAR`, `${VAR}` and `${VAR:-default}` as sh expands them (unset: empty)."""

    def braced(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(3)
        value = env.get(name, "")
        return value if value or default is None else default

    word = re.sub(r"\$\{(\w+)(:-([^}]*))?\}", braced, word)
    return re.sub(r"\$(\w+)", lambda m: env.get(m.group(1), ""), word)


def _words(statement: str) -> list[str]:
    try:
        return shlex.split(statement)
    except ValueError:
        return statement.split()


def _loop_step(header: str, body: list[str]) -> Step | None:
    """A loop the emulators understand: a wait for a file, or forever."""
    sleeps = [
        float(w[1]) for w in (_words(s) for s in body) if len(w) == 2 and w[0] == "sleep" and _is_number(w[1])
    ]
    interval = sleeps[0] if sleeps else 1.0
    waited = re.match(r"until\s+\[\[?\s+-[fe]\s+(\S+?)\s+\]?\]", header)
    if waited:
        return Step("wait", path=waited.group(1).strip("\"'"), seconds=interval)
    if re.match(r"while\s+(true|:)\s*$", header):
        return Step("forever")
    return None


def _if_step(header: str, body: list[str], variables: dict[str, str]) -> Step | None:
    """`if [ "$(cat FILE)" != "VALUE" ]` with its `then` part (an `else` part is not read)."""
    found = re.match(r'if\s+\[\s+"\$\(cat\s+(\S+?)\)"\s+(!=|=)\s+"([^"]*)"\s+\]\s*$', header)
    if not found:
        return None
    then = []
    for statement in body:
        if statement in ("then",):
            continue
        if statement == "else":
            break
        then.append(statement)
    inner = parse("\n".join(then), variables)
    return Step("if", path=found.group(1), name=found.group(2), value=found.group(3), body=inner.steps)


def _is_number(text: str) -> bool:
    return re.fullmatch(r"\d+(\.\d+)?", text) is not None


def parse(text: str, env: Mapping[str, str] | None = None) -> Script:
    """Parse a script (`sh -c` string or file content) into steps; `env` expands assignments."""
    variables = dict(env or {})
    interpreter = ""
    first = text.lstrip().splitlines()[0] if text.strip() else ""
    if first.startswith("#!"):
        interpreter = first[2:].strip().split()[0] if first[2:].strip() else ""
    statements = _statements(text)
    steps: list[Step] = []
    index = 0
    while index < len(statements):
        statement = statements[index]
        words = _words(statement)
        head = words[0] if words else ""
        if head in _BLOCK_OPEN:
            # Collect the block up to its matching end (nested blocks counted).
            depth, end, body = 1, index + 1, []
            while end < len(statements) and depth:
                word = (_words(statements[end]) or [""])[0]
                if word in _BLOCK_OPEN:
                    depth += 1
                elif word in ("done", "fi", "esac"):
                    depth -= 1
                if depth:
                    body.append(statements[end])
                end += 1
            if head in ("until", "while"):
                step = _loop_step(statement, body)
                if step is not None:
                    steps.append(step)
            elif head == "if":
                step = _if_step(statement, body, variables)
                if step is not None:
                    steps.append(step)
            index = end
            continue
        index += 1
        chained = words[-1:] == ["&&"]
        step = _simple(words[:-1] if chained else words, variables)
        if step is not None:
            if chained and step.kind == "run":
                step = Step("run", argv=step.argv, chained=True)
            steps.append(step)
            if step.kind in ("run", "exit", "forever") and not step.chained:
                break
    return Script(tuple(steps), interpreter)


def _simple(words: list[str], variables: dict[str, str]) -> Step | None:
    if not words:
        return None
    head = words[0]
    if head in (".", "source") and len(words) > 1:
        return Step("source", path=expand(words[1], variables))
    if head == "export" or (re.match(r"^\w+=", head) and len(words) == 1):
        for word in words[1:] if head == "export" else words:
            if "=" in word:
                name, _, value = word.partition("=")
                variables[name] = expand(value, variables)
                return Step("env", name=name, value=variables[name])
        return None
    if head == "sleep" and len(words) == 2:
        if words[1] == "infinity":
            return Step("forever")
        if _is_number(words[1]):
            return Step("sleep", seconds=float(words[1]))
        return None
    if head == "rm":
        return Step("remove", argv=tuple(expand(w, variables) for w in words[1:] if not w.startswith("-")))
    if head == "touch":
        return Step("touch", argv=tuple(expand(w, variables) for w in words[1:] if not w.startswith("-")))
    if head == "exit":
        return Step("exit", code=int(words[1]) if len(words) > 1 and words[1].isdigit() else 0)
    if head in ("echo", "cat", "set", "mkdir", "true", ":", "printf", "[", "test") or head.startswith(
        (">", "<")
    ):
        # A redirection alone (`> feature-flags.env`, NVIDIA's device-plugin entrypoint) creates or reads
        # a file nothing here reads back.
        return None
    if head == "exec":
        words = words[1:]
    return Step("run", argv=tuple(expand(w, variables) for w in words))


def shell_script(argv: tuple[str, ...]) -> tuple[str, str] | None:
    """For `sh -c SCRIPT` or `sh FILE`: ("inline", SCRIPT) or ("file", FILE); None if not a shell."""
    if not argv or argv[0] not in SHELLS:
        return None
    rest = list(argv[1:])
    while rest and rest[0].startswith("-") and rest[0] != "-c":
        rest.pop(0)
    if rest[:1] == ["-c"]:
        script = rest[1] if len(rest) > 1 else ""
        words = _words(script)
        # `sh -c /bin/entrypoint.sh`: the shell runs the file (and the kernel its shebang).
        if len(words) == 1 and words[0].startswith("/"):
            return ("exec-file", words[0])
        return ("inline", script)
    if rest:
        return ("file", rest[0])
    return ("inline", "")
